"""The emulator's response bodies: completions as JSON, streams as SSE, errors in OpenRouter's shape.

What a job answers is its fault-table row (`faults.FAULTS`, `Job.plays`): `answer_response` and `JobStream` play
the row's `body` and `stream` shapes and settle the job with the row's charge; nothing here draws or decides.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from .content import Generation
from .faults import Fault, error_body, fault_error
from .requests import ApiError
from .service import Emulator, Job

REASONING_FORMAT = "unknown"
Served = tuple[str | None, list[dict], str]  # message.reasoning, reasoning_details, content


# -- how a quirk serves the message fields ------------------------------------------------------------
def _details_only(gen: Generation, details: list[dict]) -> Served:
    return None, details, gen.content


def _inline_think(gen: Generation, details: list[dict]) -> Served:
    return None, [], "<think>" + gen.reasoning + ("</think>" + gen.content if gen.closed else "")


def _bare_close(gen: Generation, details: list[dict]) -> Served:
    return None, [], gen.reasoning + ("</think>" + gen.content if gen.closed else "")


def _reasoning_dropped(gen: Generation, details: list[dict]) -> Served:
    return None, [], gen.content


def _special_spaces(gen: Generation, details: list[dict]) -> Served:
    """vllm#33457: `<think>ok</think>1` served as `' <think> ok </think> 1'`, split by the reasoning parser."""
    reasoning = " " + gen.reasoning + (" " if gen.closed else "")
    content = " " + gen.content + (" " if gen.before_special else "") if gen.closed else ""
    return reasoning, [{**details[0], "text": reasoning}], content


# Quirks that change how the fields are served (the others change the text itself: `content.TEXT_QUIRKS`).
SERVED: dict[str, Callable[[Generation, list[dict]], Served]] = {
    "reasoning_details_only": _details_only,  # message.reasoning null, the text only in reasoning_details
    "inline_think": _inline_think,  # reasoning inline as <think>…</think> at the start of content
    "bare_close": _bare_close,  # no reasoning parser: "reasoning</think>answer" as content
    "reasoning_dropped": _reasoning_dropped,  # reasoning billed, served nowhere
    "special_spaces": _special_spaces,  # a space beside every special token
}


def served_fields(job: Job) -> Served:
    """(message.reasoning, reasoning_details, content) as this provider serves them, quirks applied."""
    gen = job.gen
    assert gen is not None
    if not job.req.thinking or job.req.exclude_reasoning or not gen.reasoning:
        return None, [], gen.content
    details = [{"type": "reasoning.text", "text": gen.reasoning, "format": REASONING_FORMAT, "index": 0}]
    serve = SERVED.get(gen.quirk or "")
    return serve(gen, details) if serve else (gen.reasoning, details, gen.content)


# -- JSON -----------------------------------------------------------------------------------------------
def envelope(em: Emulator, job: Job, obj: str) -> dict:
    return {"id": job.gen_id, "provider": job.ep.provider, "model": em.cfg.model_version, "object": obj,
            "created": job.created}


def completion_body(em: Emulator, job: Job, *, empty: bool = False) -> dict:
    """The completion; `empty`: empty content and reasoning, zero usage (the `empty` shape)."""
    gen = job.gen
    assert gen is not None
    message: dict[str, Any]
    if empty:
        message = {"role": "assistant", "content": "", "refusal": None, "reasoning": None}
        finish, usage = "stop", em.usage(job, empty=True)
    else:
        reasoning, details, content = served_fields(job)
        message = {"role": "assistant", "content": content, "refusal": None, "reasoning": reasoning,
                   "reasoning_details": details}
        if job.calls:  # only an answer with calls has the key, as OpenAI serves it
            message["tool_calls"] = job.calls
        finish, usage = gen.finish_reason, em.usage(job)
    body = {**envelope(em, job, "chat.completion"),
            "choices": [{"logprobs": None, "finish_reason": finish, "native_finish_reason": finish, "index": 0,
                         "message": message}],
            "system_fingerprint": None, "usage": usage}
    if job.req.return_token_ids and not empty:  # as vLLM answers `return_token_ids`
        body["prompt_token_ids"] = job.prompt_ids
        body["choices"][0]["token_ids"] = gen.output_ids
    return body


def choice_error_body(em: Emulator, job: Job, fault: Fault) -> dict:
    """HTTP 200 whose choices[0] carries the error (`choice_error`)."""
    return {**envelope(em, job, "chat.completion"),
            "choices": [{"logprobs": None, "finish_reason": "error", "native_finish_reason": "error", "index": 0,
                         "message": {"role": "assistant", "content": "", "refusal": None, "reasoning": None},
                         "error": fault_error(fault, job.ep.provider, em.cfg.model)["error"]}],
            "usage": em.usage(job, empty=True)}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.code, e.message, e.metadata), status_code=e.code, headers=e.headers)


def fault_error_response(em: Emulator, job: Job) -> JSONResponse:
    """An admission fault's HTTP error status (`error`), streaming or not."""
    fault = job.plays
    headers = {"Retry-After": str(em.cfg.faults.retry_after)} if fault.retry_after else {}
    return JSONResponse(fault_error(fault, job.ep.provider, em.cfg.model), status_code=fault.status, headers=headers)


def answer_response(em: Emulator, job: Job) -> Response:
    """A non-streaming answer once its generation time has passed, in the row's `body` shape; the job is settled
    with the row's charge (a `cut` body is billed: the generation ran, the bytes were lost in transit)."""
    fault = job.plays
    headers = {"X-Generation-Id": job.gen_id}
    em.settle(job, job.fault or "ok", charged=fault.charged)
    if fault.body == "choice_error":
        return JSONResponse(choice_error_body(em, job, fault), headers=headers)
    if fault.body == "top_level_error":
        return JSONResponse(fault_error(fault, job.ep.provider, em.cfg.model), headers=headers)
    body = completion_body(em, job, empty=fault.body == "empty")
    if fault.body == "cut":
        raw = json.dumps(body).encode()
        return Response(raw[: len(raw) // 2], media_type="application/json", headers=headers)
    return JSONResponse(body, headers=headers)


# -- SSE -----------------------------------------------------------------------------------------------
def sse(obj: dict) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


def pieces(text: str, n: int) -> list[str]:
    """Split text into n nearly equal character pieces (deltas that concatenate back to it)."""
    if not text:
        return []
    n = max(1, min(n, len(text)))
    step = math.ceil(len(text) / n)
    return [text[i:i + step] for i in range(0, len(text), step)]


class JobStream(StreamingResponse):
    """The SSE response of one job; releases the job however the stream ends (a client that
    disconnects before the first byte included, when the generator never runs its own cleanup)."""

    def __init__(self, em: Emulator, job: Job):
        super().__init__(stream_events(em, job), media_type="text/event-stream",
                         headers={"X-Generation-Id": job.gen_id, "Cache-Control": "no-cache"})
        self.em, self.job = em, job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.em.stats.in_flight -= 1
            if not self.job.settled:
                self.abandoned()

    def abandoned(self) -> None:
        """The client went away mid-stream: a provider with stream cancellation stops and bills the tokens so
        far; any other generates on and bills the whole answer when it would have ended."""
        em, job = self.em, self.job
        if job.ep.stream_cancellation or job.gen is None:
            em.settle(job, "cancelled", charged=False,
                      partial_tokens=job.generated_by(time.monotonic(), em.tok) if job.gen else 0)
            return
        job.abandoned_sent = job.streamed
        ttft, gen_time = em.delays(job)
        left = max(0.0, job.started + ttft + gen_time - time.monotonic())
        asyncio.get_running_loop().call_later(left, em.settle, job, "abandoned", True)


def call_deltas(calls: list[dict], pieces_per_call: int = 3) -> list[dict]:
    """Tool calls in OpenAI's streaming shape: per call a delta with its index, id, type, name and no arguments
    yet, then deltas with argument pieces (content null, as OpenAI sends them)."""
    out: list[dict] = []
    for i, c in enumerate(calls):
        fn = c["function"]
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"index": i, "id": c["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}]})
        out += [{"role": "assistant", "content": None, "tool_calls": [{"index": i, "function": {"arguments": p}}]}
                for p in pieces(fn["arguments"], pieces_per_call)]
    return out


def delta_text(delta: dict) -> str:
    """The generated text one delta carries: its reasoning (once, though sent in two fields), content or arguments."""
    details = delta.get("reasoning_details")
    calls = delta.get("tool_calls") or []
    return ((details[0]["text"] if details else "") + (delta.get("content") or "")
            + "".join(c["function"]["arguments"] for c in calls))


CUT_SHAPES = ("error_chunk", "top_level_error", "cut")  # stream shapes that end the stream halfway


async def stream_events(em: Emulator, job: Job) -> AsyncIterator[str]:
    """SSE: processing comments, reasoning, content then tool-call deltas, finish chunk, usage chunk, [DONE]; the row's
    `stream` shape decides what is sent instead (the fault's error in a chunk, or alone, or a cut line halfway; an
    empty answer). Each delta goes out at its own time on the answer's schedule (first token after the latency, then
    evenly over the generation time), not after a sleep per delta: a busy loop delays a chunk, never the answer, so
    a streamed answer ends when the same answer asked without `stream` would."""
    gen = job.gen
    assert gen is not None
    fault = job.plays
    ttft, gen_time = em.delays(job)
    loop = asyncio.get_running_loop()
    first = loop.time() + ttft
    job.first_token_at, job.gen_time = first, gen_time  # loop.time() is time.monotonic()
    yield ": OPENROUTER PROCESSING\n\n"
    while (now := loop.time()) < first:
        await asyncio.sleep(min(em.cfg.processing_interval, first - now))
        if loop.time() < first:
            yield ": OPENROUTER PROCESSING\n\n"
    base = envelope(em, job, "chat.completion.chunk")

    def chunk(delta: dict, finish: str | None = None) -> str:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "native_finish_reason": finish, "logprobs": None}]})

    empty = fault.stream == "empty"
    reasoning, details, content = (None, [], "") if empty else served_fields(job)
    r_text = reasoning if reasoning is not None else (details[0]["text"] if details else "")
    n_out = max(1, len(gen.output_ids))
    per_chunk = max(8, math.ceil(n_out / 48))
    r_share = gen.reasoning_tokens / n_out if r_text else 0.0
    deltas: list[dict] = []
    for piece in pieces(r_text, math.ceil(n_out * r_share / per_chunk)):
        d: dict[str, Any] = {"role": "assistant", "content": "", "reasoning": piece if reasoning is not None else None}
        d["reasoning_details"] = [{"type": "reasoning.text", "text": piece, "format": REASONING_FORMAT, "index": 0}]
        deltas.append(d)
    for piece in pieces(content, math.ceil(n_out * (1 - r_share) / per_chunk)):
        deltas.append({"role": "assistant", "content": piece, "reasoning": None})
    if not empty:
        deltas += call_deltas(job.calls)
    finish = "stop" if empty else gen.finish_reason
    n = len(deltas)
    cut_at = n // 2 if fault.stream in CUT_SHAPES else None
    for i in range(n + 1):  # i == n: the finish chunk
        due = first + gen_time * (min(i + 1, n) / n if n else 1.0)
        if (late := due - loop.time()) > 0:
            await asyncio.sleep(late)
        job.streamed = round(n_out * min(i + 1, n) / max(1, n))  # with chunk i, about to go out
        if i == cut_at:
            assert job.fault is not None  # a cut shape is a drawn fault's
            em.settle(job, job.fault, charged=fault.stream_charged)
            if fault.stream == "cut":
                line = chunk(deltas[i]) if i < n else chunk({"role": "assistant", "content": ""}, finish)
                yield line[: len(line) // 2]
            elif fault.stream == "error_chunk":  # OpenRouter's mid-stream error: the error, the choice ended
                err = fault_error(fault, job.ep.provider, em.cfg.model)["error"]
                ended = {"index": 0, "delta": {"content": ""}, "finish_reason": "error",
                         "native_finish_reason": "error"}
                yield sse({**base, "error": err, "choices": [ended]})
            else:  # top_level_error: the error alone, as the JSON body would be
                yield sse(fault_error(fault, job.ep.provider, em.cfg.model))
            return
        if i < n:
            job.sent.append(delta_text(deltas[i]))
            yield chunk(deltas[i])
    yield chunk({"role": "assistant", "content": ""}, finish)
    usage = em.usage(job, empty=empty)
    em.settle(job, job.fault or "ok", charged=fault.stream_charged)
    yield sse({**base, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"
