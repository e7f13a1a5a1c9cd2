"""The fault classes of the real service, in one table the request path reads: what each answers, when, and
what it costs. A new fault that answers in a shape already here is one row (plus its test in
tests/emulator/test_emulator.py); a new shape is one more branch in `bodies.py`.

Order matters: one seeded uniform draw per request walks the rates in table order (`draw_fault`), so a row
is appended, never inserted, to keep every seeded run as it was.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

Phase = Literal["admission", "answer"]
# What a request receives. error: an HTTP error status with OpenRouter's error body; reset: the connection is
# aborted, no response; answer: the normal completion (or stream); choice_error: HTTP 200 whose choices[0]
# carries the error; top_level_error: HTTP 200 whose body is {"error": …}; empty: HTTP 200, empty content and
# zero usage; cut: the body (or, streaming, an SSE data line halfway) cut in the middle; error_chunk
# (streaming): an error chunk halfway (the fault's error, `finish_reason: "error"`), no [DONE]; top_level_error
# streamed: an event with the fault's error alone, halfway, no [DONE]. A fault answers the same whether asked with
# `stream` or not (same class, same error, same charge), so a seeded run draws the same answers both ways.
Shape = Literal["error", "reset", "answer", "choice_error", "top_level_error", "empty", "cut", "error_chunk"]


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One fault class. `phase`: admission faults answer at once and nothing is generated (no content is drawn,
    nothing is billed); answer faults answer when the generation would have finished."""

    phase: Phase
    body: Shape  # what a non-streaming request receives
    stream: Shape  # what a streaming request receives
    charged: bool = False  # non-streaming: the generation's usage.cost is billed
    stream_charged: bool = False  # the same for a streaming request
    status: int = 200  # the HTTP status of an `error` body
    code: int | None = None  # the error's `code` in the body (None: the status)
    message: str = ""  # the error's message ({model} is filled in); with `upstream`, the provider's raw text
    upstream: bool = False  # wrapped as OpenRouter wraps a provider's error: "Provider returned error"
    metadata: dict[str, Any] = field(default_factory=dict)  # more error metadata
    names_provider: bool = False  # metadata.provider_name = the endpoint's provider
    retry_after: bool = False  # a Retry-After header of `faults.retry_after` seconds
    delayed: bool = False  # the answer comes `faults.slow_seconds` late (not scaled by speed)

    @property
    def error_code(self) -> int:
        return self.code if self.code is not None else self.status


def _http_error(status: int, message: str, **kw: Any) -> Fault:
    """A fault answered at admission with an HTTP error status, streaming or not."""
    return Fault(phase="admission", body="error", stream="error", status=status, message=message, **kw)


FAULTS: dict[str, Fault] = {
    # 429 from OpenRouter itself, with Retry-After
    "rate_limit": _http_error(429, "Rate limit exceeded: {model}. Please retry shortly.", retry_after=True,
                              metadata={"headers": {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0"}}),
    # 429 "Provider returned error" with metadata.raw / provider_name
    "upstream_rate_limit": _http_error(429, "{model} is temporarily rate-limited upstream. Please retry shortly.",
                                       upstream=True, retry_after=True),
    # retryable 402: in-flight budget, with Retry-After
    "budget": _http_error(402, "Your in-flight requests have reserved all of your credits. Retry after some of "
                               "them complete.", metadata={"retryable": True}, retry_after=True),
    "bad_gateway": _http_error(502, '{{"error":"upstream connect error or disconnect/reset before headers"}}',
                               upstream=True),
    "unavailable": _http_error(503, "Service temporarily unavailable", names_provider=True),
    "timeout": _http_error(408, "Request timed out. Please retry.", names_provider=True),
    # HTTP 200, choices[0].error and finish_reason "error" (streaming: the same error in a chunk halfway)
    "error_in_choice": Fault(phase="answer", body="choice_error", stream="error_chunk", code=502,
                             message="upstream stream closed before completion", upstream=True),
    # HTTP 200 whose body is {"error": {...}} (streaming: a `data: {"error": ...}` event halfway, no choices)
    "error_top_level": Fault(phase="answer", body="top_level_error", stream="top_level_error", code=502,
                             message="model produced an invalid response", upstream=True),
    # streaming: an error chunk after some content (non-streaming: as error_in_choice)
    "midstream_error": Fault(phase="answer", body="choice_error", stream="error_chunk", code=502,
                             message="upstream stream closed before completion", upstream=True),
    # HTTP 200 with empty content and reasoning, zero usage, no charge
    "empty_content": Fault(phase="answer", body="empty", stream="empty"),
    # the body (or an SSE data line) cut in the middle: the generation ran, so it is billed
    "truncated_json": Fault(phase="answer", body="cut", stream="cut", charged=True, stream_charged=True),
    # the connection aborted with no response
    "connection_reset": Fault(phase="admission", body="reset", stream="reset"),
    # the answer delayed by `slow_seconds`
    "slow": Fault(phase="answer", body="answer", stream="answer", charged=True, stream_charged=True, delayed=True),
}
FAULT_CLASSES = tuple(FAULTS)
NO_FAULT = Fault(phase="answer", body="answer", stream="answer", charged=True, stream_charged=True)


def fault_of(name: str | None) -> Fault:
    """The row of a drawn fault (`NO_FAULT` for none): all the request path needs to know about it."""
    return NO_FAULT if name is None else FAULTS[name]


def draw_fault(rng: random.Random, rates: dict[str, float]) -> str | None:
    """At most one class per request: walk the cumulative rates with one uniform draw."""
    u = rng.random()
    for name in FAULT_CLASSES:
        rate = rates.get(name, 0.0)
        if u < rate:
            return name
        u -= rate
    return None


def error_body(code: int, message: str, metadata: dict[str, Any] | None = None) -> dict:
    """OpenRouter's error shape."""
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    return {"error": err}


def upstream_error(code: int, provider: str, raw: str) -> dict:
    """An error passed through from the provider: OpenRouter wraps it as "Provider returned error"."""
    return error_body(code, "Provider returned error", {"raw": raw, "provider_name": provider})


def fault_error(fault: Fault, provider: str, model: str) -> dict:
    """The error body of a fault (an HTTP error status, or the error an answer carries)."""
    message = fault.message.format(model=model)
    if fault.upstream:
        return upstream_error(fault.error_code, provider, message)
    metadata = {**fault.metadata, **({"provider_name": provider} if fault.names_provider else {})}
    return error_body(fault.error_code, message, metadata or None)
