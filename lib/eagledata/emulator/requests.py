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
    tools: tuple[dict, ...] | None = None  # declared tools, as sent (the template renders them as sent)
    tool_choice: Any = None  # "none" | "auto" | "required" | {type: function, function: {name}}
    parallel_tool_calls: bool = True  # OpenAI's default


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


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(f"'{field}' must be a non-empty string", field)
    return value


def _call_ids(m: dict, where: str) -> list[str]:
    """An assistant message's `tool_calls` checked as OpenAI checks them; their ids."""
    calls = m["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise _bad(f"'{where}.tool_calls' must be a non-empty array", f"{where}.tool_calls")
    ids = []
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(c, dict) or c.get("type") != "function" or not isinstance(c.get("function"), dict):
            raise _bad(f"'{at}' must be {{id, type: 'function', function: {{name, arguments}}}}", at)
        ids.append(_string(c.get("id"), f"{at}.id"))
        _string(c["function"].get("name"), f"{at}.function.name")
        if not isinstance(c["function"].get("arguments"), str):
            raise _bad(f"'{at}.function.arguments' must be a string (JSON)", f"{at}.function.arguments")
    return ids


def parse_messages(raw: Any) -> list[dict]:
    """Messages as sent (their content parts joined to text); tool turns must answer an earlier call's id."""
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty array", "messages")
    out = []
    call_ids: set[str] = set()
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"'{where}.role' must be one of {sorted(ROLES)}", f"{where}.role")
        msg = dict(m)
        msg["content"] = _message_text(m.get("content"), f"{where}.content")
        role = m["role"]
        if msg["content"] is None and role != "assistant":
            raise _bad(f"'{where}.content' is required", f"{where}.content")
        if role == "assistant":
            if m.get("tool_calls") is not None:
                call_ids.update(_call_ids(m, where))
            for key in ("reasoning_content", "reasoning"):  # the renderer reads either as reasoning_content
                if m.get(key) is not None and not isinstance(m[key], str):
                    raise _bad(f"'{where}.{key}' must be a string", f"{where}.{key}")
        elif role == "tool" and m.get("tool_call_id") not in call_ids:
            field = f"{where}.tool_call_id"
            if not isinstance(m.get("tool_call_id"), str):
                raise _bad(f"'{field}' is required (the id of the call it answers)", field)
            raise _bad(f"'{field}' {m['tool_call_id']!r} does not answer a tool call of an earlier assistant "
                       "message", field)
        out.append(msg)
    return out


def parse_tools(raw: Any) -> tuple[dict, ...]:
    """`tools`: `[{type: "function", function: {name, description?, parameters?}}]`, kept as sent."""
    if not isinstance(raw, list):
        raise _bad("'tools' must be an array", "tools")
    for i, t in enumerate(raw):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise _bad(f"'{at}' must be {{type: 'function', function: {{name, description?, parameters?}}}}", at)
        fn = t["function"]
        _string(fn.get("name"), f"{at}.function.name")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _bad(f"'{at}.function.description' must be a string", f"{at}.function.description")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _bad(f"'{at}.function.parameters' must be a JSON Schema object", f"{at}.function.parameters")
    return tuple(raw)


def parse_tool_choice(raw: Any, tools: tuple[dict, ...] | None) -> Any:
    if raw is None:
        return None
    if tools is None:
        raise _bad("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
    if raw in ("none", "auto", "required"):
        return raw
    name = raw.get("function", {}).get("name") if isinstance(raw, dict) and raw.get("type") == "function" \
        and isinstance(raw.get("function"), dict) else None
    if not isinstance(name, str):
        raise _bad("'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', function: {name}}",
                   "tool_choice")
    if name not in {t["function"]["name"] for t in tools}:
        raise _bad(f"'tool_choice.function.name' {name!r} is not a declared tool", "tool_choice.function.name")
    return raw


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
    tools = None if body.get("tools") is None else parse_tools(body["tools"])
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = True if body.get("parallel_tool_calls") is None else _bool(body["parallel_tool_calls"],
                                                                          "parallel_tool_calls")
    return ChatRequest(messages, max_tokens, None if temperature is None else float(temperature), seed, stream,
                       thinking, exclude, scale, r_cap, parse_provider(body.get("provider")), used, ids,
                       tools or None, choice, parallel)
