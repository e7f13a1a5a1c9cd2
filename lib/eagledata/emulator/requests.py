"""Validation of a chat-completions request body into a typed request, with OpenRouter's 400s."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .catalog import ProviderPrefs

ROLES = {"system", "user", "assistant", "tool", "developer"}
EFFORT_SCALE = {"xhigh": 2.5, "high": 1.6, "medium": 1.0, "low": 0.35, "minimal": 0.1, "none": 0.0}
EFFORTS = set(EFFORT_SCALE)
SORTS = {"price", "throughput", "latency"}
PROVIDER_KEYS = {"only", "ignore", "order", "sort", "quantizations", "max_price", "allow_fallbacks",
                 "require_parameters", "data_collection", "zdr"}
# Request keys that count as "parameters" for provider.require_parameters.
PARAMETER_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "reasoning",
                  "include_reasoning", "response_format", "tools", "tool_choice", "frequency_penalty",
                  "presence_penalty", "repetition_penalty", "logprobs", "min_p"}


class ApiError(Exception):
    """An error answered in OpenRouter's shape `{"error": {code, message, metadata}}`."""

    def __init__(self, code: int, message: str, metadata: dict | None = None,
                 headers: dict[str, str] | None = None, outcome: str | None = None):
        super().__init__(message)
        self.code, self.message, self.metadata = code, message, metadata
        self.headers = headers or {}
        self.outcome = outcome or f"http_{code}"


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    max_tokens: int | None
    temperature: float | None
    seed: int | None
    stream: bool
    thinking: bool  # reasoning on (Kimi's thinking mode)
    exclude_reasoning: bool  # reasoning generated and counted but not returned
    reasoning_scale: float  # effort: how much longer (or shorter) than medium the reasoning runs
    reasoning_max_tokens: int | None  # reasoning.max_tokens: a cap on reasoning length
    prefs: ProviderPrefs
    used_parameters: frozenset[str]
    return_token_ids: bool = False  # vLLM/SGLang extension: answer with the true ids (local backends)


def _bad(message: str, field: str) -> ApiError:
    return ApiError(400, message, {"field": field})


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"'{field}' must be an array of strings", field)
    return tuple(value)


def _int(value: Any, field: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise _bad(f"'{field}' must be an integer >= {lo}", field)
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"'{field}' must be a boolean", field)
    return value


def _message_text(content: Any, field: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"'{field}[{j}]' must be a text part {{type: 'text', text}}", f"{field}[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"'{field}' must be a string or an array of content parts", field)


def parse_messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"'{where}.role' must be one of {sorted(ROLES)}", f"{where}.role")
        msg = dict(m)
        msg["content"] = _message_text(m.get("content"), f"{where}.content")
        if msg["content"] is None and m["role"] != "assistant":
            raise _bad(f"'{where}.content' is required", f"{where}.content")
        out.append(msg)
    return out


def parse_provider(raw: Any) -> ProviderPrefs:
    if raw is None:
        return ProviderPrefs()
    if not isinstance(raw, dict):
        raise _bad("'provider' must be an object", "provider")
    unknown = sorted(set(raw) - PROVIDER_KEYS)
    if unknown:
        raise _bad(f"'provider.{unknown[0]}' is not a recognized provider preference", f"provider.{unknown[0]}")
    kw: dict[str, Any] = {}
    for key in ("only", "ignore", "order"):
        if raw.get(key) is not None:
            kw[key] = _strings(raw[key], f"provider.{key}")
    if raw.get("quantizations") is not None:
        kw["quantizations"] = tuple(q.lower() for q in _strings(raw["quantizations"], "provider.quantizations"))
    sort = raw.get("sort")
    if isinstance(sort, dict):
        sort = sort.get("by")
    if sort is not None:
        if sort not in SORTS:
            raise _bad(f"'provider.sort' must be one of {sorted(SORTS)}", "provider.sort")
        kw["sort"] = sort
    if raw.get("max_price") is not None:
        mp = raw["max_price"]
        if not isinstance(mp, dict):
            raise _bad("'provider.max_price' must be an object", "provider.max_price")
        for key in ("prompt", "completion"):
            v = mp.get(key)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                    raise _bad(f"'provider.max_price.{key}' must be a number >= 0 (USD per million tokens)",
                               f"provider.max_price.{key}")
                kw[f"max_{key}_price"] = float(v)
    for key in ("allow_fallbacks", "require_parameters", "zdr"):
        if raw.get(key) is not None:
            value = _bool(raw[key], f"provider.{key}")
            if key != "zdr":
                kw[key] = value
    if raw.get("data_collection") is not None:
        if raw["data_collection"] not in ("allow", "deny"):
            raise _bad("'provider.data_collection' must be 'allow' or 'deny'", "provider.data_collection")
        kw["data_collection"] = raw["data_collection"]
    return ProviderPrefs(**kw)


def parse_chat(body: Any, model_ids: tuple[str, ...]) -> ChatRequest:
    """Check a request body as OpenRouter does; the first problem is a 400 naming the field."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required", "model")
    if model not in model_ids:
        raise _bad(f"{model} is not a valid model ID", "model")
    messages = parse_messages(body.get("messages"))
    max_tokens = None if body.get("max_tokens") is None else _int(body["max_tokens"], "max_tokens", 1)
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 2):
        raise _bad("'temperature' must be a number in [0, 2]", "temperature")
    seed = None if body.get("seed") is None else _int(body["seed"], "seed", -(2**63))
    stream = False if body.get("stream") is None else _bool(body["stream"], "stream")
    thinking, exclude, scale, r_cap = True, False, 1.0, None
    if body.get("include_reasoning") is not None:
        exclude = not _bool(body["include_reasoning"], "include_reasoning")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _bad("'reasoning' must be an object", "reasoning")
        unknown = sorted(set(reasoning) - {"effort", "max_tokens", "exclude", "enabled"})
        if unknown:
            raise _bad(f"'reasoning.{unknown[0]}' is not recognized", f"reasoning.{unknown[0]}")
        effort = reasoning.get("effort")
        if effort is not None and effort not in EFFORTS:
            raise _bad(f"'reasoning.effort' must be one of {sorted(EFFORTS)}", "reasoning.effort")
        if effort is not None:
            scale = EFFORT_SCALE[effort]
        if reasoning.get("max_tokens") is not None:
            r_cap = _int(reasoning["max_tokens"], "reasoning.max_tokens", 0)
        if reasoning.get("exclude") is not None:
            exclude = _bool(reasoning["exclude"], "reasoning.exclude")
        enabled = True if reasoning.get("enabled") is None else _bool(reasoning["enabled"], "reasoning.enabled")
        thinking = enabled and effort != "none"
    used = frozenset(k for k in body if k in PARAMETER_KEYS and body[k] is not None)
    ids = False if body.get("return_token_ids") is None else _bool(body["return_token_ids"], "return_token_ids")
    return ChatRequest(messages, max_tokens, None if temperature is None else float(temperature), seed, stream,
                       thinking, exclude, scale, r_cap, parse_provider(body.get("provider")), used, ids)
