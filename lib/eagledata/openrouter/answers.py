"""OpenRouter chat completions: the request we send and a pure classification of every answer.

Every outcome the service can produce maps to one of five kinds, so the engine's policy is a table:
OK (record it), RETRY (after Retry-After or a jittered backoff), OUT_OF_MONEY (stop issuing),
FAILED (this prompt can never succeed: failures.jsonl), FATAL (no prompt can: stop the run).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import httpx

from ..errors import InputError
from ..records import THINK_CLOSE, THINK_OPEN, Answer, ToolCall, Usage, split_inline_reasoning


class Kind(Enum):
    OK = "ok"
    RETRY = "retry"
    OUT_OF_MONEY = "out_of_money"
    FAILED = "failed"
    FATAL = "fatal"


@dataclass(kw_only=True)
class Completion:
    """A successful completion as the service returned it: the answer text (inline `<think>` already
    split out) and what the service said about it."""

    answer: Answer
    provider: str
    model: str
    generation_id: str
    usage: Usage
    reasoning_inline: bool = False
    prompt_token_ids: list[int] | None = None  # local backends (vLLM/SGLang) that return ids
    output_token_ids: list[int] | None = None
    repaired: str = ""  # the rule that rebuilt the answer's shape exactly (`repair_reasoning`), "" when served whole
    # The answer exactly as the server's fields gave it, before K2.5's shape rules (inline `<think>` split, repairs):
    # what a model without a reasoning section records (its text has no `</think>` to split at).
    served: Answer | None = None

    @property
    def as_served(self) -> Answer:
        return self.served or self.answer


@dataclass
class Outcome:
    kind: Kind
    error_class: str = ""  # e.g. rate_limit, upstream_rate_limit, budget_inflight, bad_gateway, …
    status: int | None = None
    message: str = ""
    retry_after: float | None = None
    completion: Completion | None = None
    provider: str = ""  # the provider an upstream error names (metadata.provider_name)

    def error_dict(self) -> dict[str, Any]:
        return {"class": self.error_class, "status": self.status, "message": self.message[:500]}


def build_request(model: str, messages: list[dict], *, max_tokens: int, temperature: float | None,
                  provider: Mapping[str, Any] | None, backend: str = "openrouter",
                  tools: Sequence[dict] | None = None, parallel_tool_calls: bool = False, stream: bool = False,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The chat-completions body: reasoning on, our routing, our max_tokens; the conversation's tools when it has
    any (with `parallel_tool_calls` as its dataset calls). `stream`: SSE (openrouter/stream.py), OpenRouter only. A
    local server (vLLM, SGLang) is always asked for one JSON body: its exact ids (`return_token_ids`) are read from
    that body, and it bills nothing, so closing a stream early would save nothing."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens,
                            "stream": stream and backend == "openrouter"}
    if tools:
        body["tools"] = list(tools)
        body["parallel_tool_calls"] = parallel_tool_calls
    if temperature is not None:
        body["temperature"] = temperature
    if backend == "openrouter":
        body["reasoning"] = {"enabled": True}
        body["usage"] = {"include": True}
        if provider:
            body["provider"] = dict(provider)
    else:  # an OpenAI-compatible server that returns token ids (vLLM, SGLang)
        body["return_token_ids"] = True
        body["skip_special_tokens"] = False
    body.update(extra or {})
    return body


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_outcome(status: int, err: Mapping[str, Any], headers: Mapping[str, str]) -> Outcome:
    """An error answer (HTTP status or the code inside a 200 body) → what to do about it."""
    message = str(err.get("message") or "")
    metadata = raw if isinstance(raw := err.get("metadata"), dict) else {}
    code = err.get("code")
    code = code if isinstance(code, int) else status
    ra = _retry_after(headers)
    base: dict[str, Any] = dict(status=code, message=message, retry_after=ra,
                                provider=str(metadata.get("provider_name") or ""))
    if code in (401, 403):
        return Outcome(Kind.FATAL, "auth", **base)
    if code == 402:
        if ra is not None:  # in-flight budget of the key: wait and retry
            return Outcome(Kind.RETRY, "budget_inflight", **base)
        return Outcome(Kind.OUT_OF_MONEY, "no_credits", **base)
    if code == 429:
        upstream = bool(metadata.get("provider_name")) or "provider returned error" in message.lower()
        return Outcome(Kind.RETRY, "upstream_rate_limit" if upstream else "rate_limit", **base)
    if code == 404:
        return Outcome(Kind.RETRY, "no_endpoint", **base)
    if code == 408:
        return Outcome(Kind.RETRY, "timeout", **base)
    if code in (400, 413, 422):
        return Outcome(Kind.FAILED, "bad_request", **base)
    if code == 502:
        return Outcome(Kind.RETRY, "bad_gateway", **base)
    if code == 503:
        return Outcome(Kind.RETRY, "unavailable", **base)
    if isinstance(code, int) and code >= 500:
        return Outcome(Kind.RETRY, "server_error", **base)
    if isinstance(code, int) and 400 <= code < 500:
        return Outcome(Kind.FAILED, "client_error", **base)
    return Outcome(Kind.RETRY, "error_in_body", **base)


# -- answers served without a reasoning parser ----------------------------------------------------------------
# K2.5's generation prompt ends in `<think>`: the model's output starts inside its reasoning, and its first
# `</think>` (a control token) ends it. A provider without a reasoning parser serves it all as content.
BARE_CLOSE = "bare_close"          # content "reasoning</think>answer": split at the first `</think>`
BARE_CLOSE_CUT = "bare_close_cut"  # cut inside the reasoning, served as content: it is all reasoning
REASONING_MISSING = "reasoning_missing"  # reasoning billed, never served: refused (not repairable)


def repair_reasoning(content: str, finish: str | None, usage: Usage) -> tuple[str, str, str]:
    """(reasoning, content, rule) of an answer that arrived with no reasoning text in any field (pure).

    Rules, each exact and decided from the answer alone:
    - `bare_close`: content holds `</think>`. Everything before the first one is the reasoning: the prompt
      opened it, and the model cannot type a literal `</think>` before it has closed its reasoning (its first
      `</think>` is the control token; a literal one in its answer comes after).
    - `bare_close_cut`: cut (`length`), no `</think>`, and the service counted every output token as reasoning
      (`reasoning_tokens` > 0 and >= `completion_tokens` - 1): the cut fell inside the reasoning. With
      `reasoning_tokens` 0 the answer is taken as served: the model's own empty `<think></think>` then its
      answer, cut (a provider that serves cut reasoning so systematically shows up in the count agreement).
    - otherwise nothing changes (rule ""). With no reasoning left and `reasoning_tokens` > 0 the caller refuses
      the answer (`reasoning_missing`); an empty reasoning counted 0 is the model's own `<think></think>`.
    """
    if THINK_CLOSE in content:
        reasoning, _, rest = content.partition(THINK_CLOSE)
        return reasoning, rest, BARE_CLOSE
    if (finish == "length" and content and usage.reasoning_tokens > 0
            and usage.reasoning_tokens >= usage.completion_tokens - 1):
        return content, "", BARE_CLOSE_CUT
    return "", content, ""


_FINISH_ALIASES: dict[Any, str] = {"max_tokens": "length", "eos": "stop", "end_turn": "stop", "stop_sequence": "stop"}


def _text(x: Any) -> str:
    return x if isinstance(x, str) else ""


def parse_completion(body: Mapping[str, Any]) -> Completion | Outcome:
    """A 200 body → Completion, or the Outcome explaining why it is not one."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Outcome(Kind.RETRY, "malformed", 200, "no choices in the answer")
    choice = choices[0]
    if choice.get("error"):
        err = choice["error"] if isinstance(choice["error"], dict) else {"message": str(choice["error"])}
        out = _error_outcome(200, err, {})
        out.error_class = out.error_class if out.kind is not Kind.RETRY else "error_in_choice"
        out.provider = out.provider or _text(body.get("provider"))  # a stream's error chunk names it only there
        return out
    message = choice.get("message") or {}
    finish = choice.get("finish_reason") or choice.get("native_finish_reason")
    finish = _FINISH_ALIASES.get(finish, finish)
    if finish == "error":
        return Outcome(Kind.RETRY, "error_in_choice", 200, "finish_reason error")
    reasoning = _text(message.get("reasoning"))
    if not reasoning and isinstance(message.get("reasoning_details"), list):
        reasoning = "".join(_text(d.get("text")) for d in message["reasoning_details"]
                            if isinstance(d, dict) and d.get("type") in (None, "reasoning.text"))
    if not reasoning:
        reasoning = _text(message.get("reasoning_content"))  # vLLM / SGLang naming
    raw_content = _text(message.get("content"))
    u = raw_u if isinstance(raw_u := body.get("usage"), dict) else {}
    details = raw_d if isinstance(raw_d := u.get("completion_tokens_details"), dict) else {}
    cost = u.get("cost")
    usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0),
                  int(details.get("reasoning_tokens") or 0), float(cost) if isinstance(cost, (int, float)) else None)
    provider = _text(body.get("provider"))
    try:
        calls = tuple(ToolCall.from_api(c) for c in message.get("tool_calls") or ())
    except InputError as e:
        return Outcome(Kind.RETRY, "malformed", 200, f"tool call not in the OpenAI shape: {e}")
    reasoning_split, content = split_inline_reasoning(reasoning, raw_content)
    inline = not reasoning and bool(reasoning_split)
    repaired = ""
    if not reasoning and not raw_content.lstrip().startswith(THINK_OPEN):  # inline `<think>` is split above
        reasoning_split, content, repaired = repair_reasoning(raw_content, finish, usage)
    if calls and finish == "stop":  # some servers say stop for a tool-call answer; the model ended it either way
        finish = "tool_calls"
    if not content and not reasoning_split and not calls:
        return Outcome(Kind.RETRY, "empty", 200, "empty answer (cold start?)")  # nothing served at all: not a shape
    if not reasoning_split and usage.reasoning_tokens > 0:
        refused = Completion(answer=Answer("", content, finish or "stop"), provider=provider,
                             model=_text(body.get("model")), generation_id=_text(body.get("id")), usage=usage)
        return Outcome(Kind.RETRY, REASONING_MISSING, 200,  # billed: `completion` carries what it cost
                       f"{usage.reasoning_tokens} reasoning tokens billed, no reasoning text served: the ids "
                       "cannot be rebuilt", provider=provider, completion=refused)
    if finish not in ("stop", "length", "tool_calls"):
        if finish == "content_filter":
            return Outcome(Kind.FAILED, "content_filter", 200, "content filtered")
        if finish is None and not content:
            return Outcome(Kind.RETRY, "malformed", 200, "no finish_reason")
        finish = finish or "stop"
    if finish == "stop" and not content:
        return Outcome(Kind.RETRY, "empty", 200, "reasoning without an answer")
    ids = choice.get("token_ids")
    if finish == "tool_calls" and not calls:
        return Outcome(Kind.RETRY, "malformed", 200, "finish_reason tool_calls without tool_calls")
    return Completion(answer=Answer(reasoning_split, content, finish, calls), provider=provider,
                      model=_text(body.get("model")), generation_id=_text(body.get("id")), usage=usage,
                      reasoning_inline=inline, repaired=repaired, served=Answer(reasoning, raw_content, finish, calls),
                      prompt_token_ids=body.get("prompt_token_ids") or choice.get("prompt_token_ids"),
                      output_token_ids=ids if isinstance(ids, list) else None)


def classify_response(status: int, headers: Mapping[str, str], content: bytes) -> Outcome:
    """Any HTTP answer → Outcome (pure: tests feed it every shape the service produces)."""
    try:
        body = json.loads(content) if content.strip() else None
    except (ValueError, UnicodeDecodeError):
        body = None
    return classify_body(status, headers, body, content)


def classify_body(status: int, headers: Mapping[str, str], body: Any, content: bytes = b"") -> Outcome:
    """An answer's parsed JSON body (None: not JSON; `content`: its raw bytes, for an error's message) → Outcome.
    A stream's chunks assembled into the body they add up to (openrouter/stream.py) are classified here too, so
    both ways of asking give the same Completion and the same error classes."""
    if status != 200:
        err = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
        return _error_outcome(status, err or {"message": content[:200].decode(errors="replace")}, headers)
    if not isinstance(body, dict):
        return Outcome(Kind.RETRY, "malformed", 200, "answer is not JSON (truncated?)")
    if isinstance(body.get("error"), dict):
        out = _error_outcome(200, body["error"], headers)
        out.error_class = out.error_class if out.kind is not Kind.RETRY else "error_in_body"
        return out
    parsed = parse_completion(body)
    if isinstance(parsed, Outcome):
        return parsed
    return Outcome(Kind.OK, "ok", 200, completion=parsed)


def classify_exception(exc: httpx.HTTPError) -> Outcome:
    if isinstance(exc, httpx.TimeoutException):
        return Outcome(Kind.RETRY, "client_timeout", None, type(exc).__name__)  # the server may still bill it
    if isinstance(exc, httpx.TransportError):
        return Outcome(Kind.RETRY, "connection", None, f"{type(exc).__name__}: {exc}"[:200])
    return Outcome(Kind.RETRY, "malformed", None, f"{type(exc).__name__}: {exc}"[:200])
