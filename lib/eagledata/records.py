"""The vocabulary every stage shares: the model's answer as text, and the one record schema (docs/FORMATS.md).

Kept free of tokenizers and HTTP so that any stage (and the emulator) can import it cheaply.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import InputError
from .files import iter_jsonl

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_INLINE_OPEN = re.compile(r"\s*<think>")


def split_inline_reasoning(reasoning: str | None, content: str | None) -> tuple[str, str]:
    """Move `<think>…</think>` at the start of content into reasoning (some providers inline it).

    Only when no separate reasoning arrived: then a literal `<think>` later in content is text.
    An unclosed leading `<think>` means the answer was cut inside the reasoning.
    """
    reasoning, content = reasoning or "", content or ""
    if reasoning or not (m := _INLINE_OPEN.match(content)):
        return reasoning, content
    inner, sep, rest = content[m.end():].partition(THINK_CLOSE)
    return (inner, rest) if sep else (inner, "")


# An answer the run cut off itself: a stream closed at its dataset's target or on Ctrl-C, its prefix kept as a sample
# (`meta.cut` says why). Like a `length` cut, the model never ended it: no `<|im_end|>`.
CUT = "cut"
CUT_FINISHES = frozenset({"length", CUT})
NATIVE_ID_PREFIX = "functions."  # the model writes a call's id as `functions.NAME:IDX` (docs/FORMATS.md#tool-calls)


def native_call_id(name: str, index: int) -> str:
    """The id K2.5 writes for the conversation's `index`-th tool call (0-based, counted over the whole
    conversation): what its chat template renders back, and what vLLM's `kimi_k2` parser passes through."""
    return f"{NATIVE_ID_PREFIX}{name}:{index}"


def calls_before(messages: Sequence[dict]) -> int:
    """Tool calls in a request's history: the model numbers its next call's IDX from here."""
    return sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an answer. `arguments` is the string as served (never re-serialized: its tokens are the
    model's); `id` is the id the model wrote (`functions.NAME:IDX`) once the recipe has rebuilt it."""

    id: str
    name: str
    arguments: str

    @classmethod
    def from_api(cls, d: Any) -> ToolCall:
        """An OpenAI-shaped call `{id, type: function, function: {name, arguments}}`; arguments given as an object
        (some datasets) are written as the template writes them (`tojson`)."""
        if not isinstance(d, dict) or not isinstance(d.get("function"), dict):
            raise InputError("a tool call must be {id, type: function, function: {name, arguments}}",
                             field="tool_calls")
        fn = d["function"]
        name, args = fn.get("name"), fn.get("arguments", "")
        if not isinstance(name, str) or not name:
            raise InputError("must be a non-empty string", field="tool_calls[].function.name")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        cid = d.get("id")
        return cls(cid if isinstance(cid, str) else "", name, args)

    def to_api(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @property
    def native(self) -> bool:
        """Its id has the form the model writes, `functions.NAME:IDX` (not a provider's `call_…`)."""
        head, _, idx = self.id.rpartition(":")
        return head == f"{NATIVE_ID_PREFIX}{self.name}" and idx.isdigit()


@dataclass(frozen=True)
class Answer:
    """The model's answer as text: what the API returns, and what output ids decode back to."""

    reasoning: str
    content: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | "cut" (the run's own) | anything else the server said
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def from_api(cls, reasoning: str | None, content: str | None, finish_reason: str,
                 tool_calls: tuple[ToolCall, ...] = ()) -> Answer:
        """An answer as served, with reasoning a provider inlined as `<think>…</think>` split out."""
        return cls(*split_inline_reasoning(reasoning, content), finish_reason, tuple(tool_calls))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids `a` and `b` share from their start (a turn's history against an earlier turn's ids)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def output_tokens(completion_tokens: int | None, output_ids: list | None) -> int:
    """What a record counts against a token target: the server's count, else the ids we stored."""
    return completion_tokens or len(output_ids or ())


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0  # includes reasoning tokens, as OpenRouter counts
    reasoning_tokens: int = 0
    cost: float | None = None  # USD, from usage.cost; None when the server did not say


@dataclass(kw_only=True)
class Record:
    """One generated assistant turn: what was sent, the answer as text, and its exact token ids.

    `conversation_id` is the prompt's id and `turn` the 1-based ask it answers (generation/conversations/
    turns.py); a one-turn
    prompt's record has `id == conversation_id` and `turn == 1`. Records written before conversations had
    neither field: they read as exactly that."""

    id: str
    dataset: str
    messages: list[dict]
    reasoning: str
    content: str
    finish_reason: str
    # Written only when present, so a record without tools is as before: the tools the request declared (its
    # prompt ids depend on them), and the answer's calls in the OpenAI shape with the ids the model wrote.
    tools: list[dict] | None = None
    tool_calls: list[dict] | None = None
    model: str = ""
    provider: str = ""
    generation_id: str = ""
    conversation_id: str = ""  # "" -> `id` (set in __post_init__)
    turn: int = 1
    usage: Usage = field(default_factory=Usage)
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    # Beyond the contract: where the ids came from ("retokenized" or "server"), agreement figures, …
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.conversation_id:
            self.conversation_id = self.id

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def loss_mask(self) -> list[int]:
        """0 over the prompt, 1 over what the model produced (its `</think>` and `<|im_end|>` included)."""
        return [0] * len(self.prompt_ids) + [1] * len(self.output_ids)

    @property
    def output_tokens(self) -> int:
        return output_tokens(self.usage.completion_tokens, self.output_ids)

    @property
    def answer(self) -> Answer:
        return Answer(self.reasoning, self.content, self.finish_reason,
                      tuple(ToolCall.from_api(c) for c in self.tool_calls or ()))

    def to_dict(self) -> dict[str, Any]:
        """Shallow (no deep copy of the id lists: this runs once per record at 2,000 in flight)."""
        d = {f: getattr(self, f) for f in _FIELD_ORDER if f not in _OPTIONAL or getattr(self, f)}
        d["usage"] = {"prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens,
                      "reasoning_tokens": self.usage.reasoning_tokens, "cost": self.usage.cost}
        if self.meta:
            d["meta"] = self.meta
        return d

    def to_json(self) -> str:
        """One line; non-ASCII kept as is (never normalized), so the text survives byte for byte."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Any) -> Record:
        if not isinstance(d, dict):
            raise InputError("a record must be a JSON object")
        missing = [f for f in _REQUIRED if f not in d]
        if missing:
            raise InputError("record lacks required fields", field=", ".join(missing))
        unknown = set(d) - _FIELDS
        if unknown:
            raise InputError("record has unknown fields", field=", ".join(sorted(unknown)))
        for name in ("prompt_ids", "output_ids"):
            ids = d.get(name, [])
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise InputError("must be a list of integers", field=name)
        for name in ("reasoning", "content"):
            if d[name] is not None and not isinstance(d[name], str):
                raise InputError("must be a string", field=name)
        if "turn" in d and (type(d["turn"]) is not int or d["turn"] < 1):
            raise InputError("must be a positive integer", field="turn")
        if "conversation_id" in d and not isinstance(d["conversation_id"], str):
            raise InputError("must be a string", field="conversation_id")
        for name in _OPTIONAL:
            value = d.get(name)
            if value is not None and not (isinstance(value, list) and all(isinstance(x, dict) for x in value)):
                raise InputError("must be a list of objects", field=name)
        usage = d.get("usage") or {}
        if not isinstance(usage, dict) or set(usage) - _USAGE_FIELDS:
            raise InputError("must be an object with prompt_tokens, completion_tokens, reasoning_tokens, cost",
                             field="usage")
        kwargs = dict(d)
        kwargs["reasoning"] = d["reasoning"] or ""
        kwargs["content"] = d["content"] or ""
        kwargs["usage"] = Usage(**usage)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, line: str) -> Record:
        return cls.from_dict(json.loads(line))


_FIRST = ("id", "dataset", "conversation_id", "turn")  # the contract's order (../shared/DESIGN.md)
_FIELD_ORDER = [*_FIRST, *(f.name for f in fields(Record) if f.name not in ("meta", *_FIRST))]
_FIELDS = {f.name for f in fields(Record)}
_OPTIONAL = ("tools", "tool_calls")
_REQUIRED = ("id", "dataset", "messages", "reasoning", "content", "finish_reason")
_USAGE_FIELDS = {f.name for f in fields(Usage)}


def iter_records(path: str | Path, *, tolerate_torn_tail: bool = False) -> Iterator[tuple[int, Record]]:
    """(line number, record) from a records.jsonl; a line that is not a valid record raises naming file:line."""
    for lineno, obj in iter_jsonl(path, tolerate_torn_tail=tolerate_torn_tail):
        try:
            yield lineno, Record.from_dict(obj)
        except (InputError, TypeError) as e:
            raise InputError(f"not a valid record: {e}", path, lineno) from None


def read_records(path: str | Path, *, tolerate_torn_tail: bool = False) -> Iterator[Record]:
    return (r for _, r in iter_records(path, tolerate_torn_tail=tolerate_torn_tail))


def load_records(path: str | Path, **kwargs: Any) -> list[Record]:
    return list(read_records(path, **kwargs))
