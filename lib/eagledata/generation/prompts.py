"""Prompt files: JSONL of `{id, messages}`, ShareGPT `{id, conversations: [{from, value}]}` or SpecForge
`{id, conversations: [{role, content}]}`; bad lines name file:line."""
from __future__ import annotations

import json
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Container, Iterable, Iterator, Mapping

from ..errors import InputError, open_input

ROLES = {"system", "user", "assistant", "tool"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "model": "assistant", "bing": "assistant", "bard": "assistant",
                  "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict]
    tools: list[dict] | None = None  # OpenAI-style tool declarations the conversation may call


@dataclass(frozen=True)
class _Shape:
    """One accepted way of writing a conversation: the list's key, and each turn's role and text keys."""

    key: str
    role_key: str
    text_key: str
    roles: Mapping[str, str]  # as written -> chat-template role
    text_types: tuple[type, ...]
    keep_turn: bool  # pass the turn on whole (tool calls, names …) or only {role, content}


SHAPES = (
    _Shape("messages", "role", "content", {r: r for r in ROLES}, (str, list, type(None)), keep_turn=True),
    _Shape("conversations", "from", "value", SHAREGPT_ROLES, (str,), keep_turn=False),
    # SpecForge's prompt files: the ShareGPT key with OpenAI-style turns.
    _Shape("conversations", "role", "content", {r: r for r in ROLES}, (str,), keep_turn=False),
)


def _shape(obj: dict) -> _Shape | None:
    """The first shape whose key is present and whose first turn uses its role key (ShareGPT when unsure)."""
    shapes = [s for s in SHAPES if s.key in obj]
    first = obj[shapes[0].key][0] if shapes and isinstance(obj[shapes[0].key], list) and obj[shapes[0].key] else None
    fits = [s for s in shapes if isinstance(first, dict) and s.role_key in first]
    return (fits or shapes or [None])[0]


def _turns(obj: dict) -> list[dict]:
    shape = _shape(obj)
    if shape is None:
        raise InputError("needs 'messages' (or 'conversations', ShareGPT or SpecForge style)", field="messages")
    turns = obj[shape.key]
    if not isinstance(turns, list):
        raise InputError(f"must be a list of {{{shape.role_key}, {shape.text_key}}}", field=shape.key)
    out = []
    for i, t in enumerate(turns):
        role = shape.roles.get(t.get(shape.role_key)) if isinstance(t, dict) else None
        if role is None:
            raise InputError(f"{shape.role_key} must be one of {sorted(shape.roles)}",
                             field=f"{shape.key}[{i}].{shape.role_key}")
        text = t.get(shape.text_key)
        if not isinstance(text, shape.text_types):
            raise InputError("must be a string", field=f"{shape.key}[{i}].{shape.text_key}")
        out.append({**t, "role": role} if shape.keep_turn else {"role": role, "content": text})
    return out


def normalize_prompt(obj: Any) -> Prompt:
    """One prompt object in either accepted shape → `Prompt` ending in a non-assistant turn.

    Trailing assistant turns (ShareGPT keeps the old answer) are dropped: we regenerate that answer.
    """
    if not isinstance(obj, dict):
        raise InputError("a prompt must be a JSON object")
    pid = obj.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == "":
        raise InputError("missing or empty (a unique string is needed)", field="id")
    if isinstance(pid, str) and ("\t" in pid or "\n" in pid or "\r" in pid):
        raise InputError("must not contain tabs or line breaks", field="id")
    out = _turns(obj)
    while out and out[-1]["role"] == "assistant":
        out.pop()
    if not any(m["role"] == "user" for m in out):
        raise InputError("no user turn left to answer", field="messages")
    tools = obj.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise InputError("must be a list of OpenAI-style tool objects", field="tools")
    return Prompt(str(pid), out, tools or None)


def iter_prompts(path: str | Path) -> Iterator[Prompt]:
    """Every prompt of a file, validated first (a bad line or a duplicate id names file:line)."""
    return iter(scan_prompts(path))


def load_prompts(path: str | Path) -> list[Prompt]:
    return list(scan_prompts(path))


# `{"id": "<plain string>"` at the start of a line: lets a resume skip finished prompts unparsed.
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*"([^"\\\t\r\n]*)"')


@dataclass
class PromptScan:
    """One validating pass over a prompt file: how many prompts, and where the unfinished ones are."""

    path: Path
    total: int
    pending: array  # byte offsets of prompts not in `done`, in file order

    def __iter__(self) -> Iterator[Prompt]:
        with self.path.open("rb") as f:
            for offset in self.pending:
                f.seek(offset)
                yield normalize_prompt(json.loads(f.readline()))


def scan_prompts(path: str | Path, done: Container[str] = frozenset(), limit: int | None = None,
                 turn_ids: Callable[[Prompt], Iterable[str]] | None = None) -> PromptScan:
    """Validate the first `limit` prompts (all by default), naming file:line for a bad one.

    Lines of finished prompts (their id in `done`) are only checked for a duplicate id: a resume over a
    million finished prompts costs one regex per line instead of a JSON parse. `turn_ids`: the record ids an
    unfinished prompt's later turns will have; one that is another prompt's id is refused.
    """
    path = Path(path)
    seen: dict[str, int] = {}
    derived: list[tuple[str, int]] = []
    pending = array("q")
    total = 0
    with open_input(path) as f:
        offset = 0
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if limit is not None and total >= limit:
                break
            m = _LEADING_ID.match(raw)
            pid = m.group(1).decode("utf-8", "replace") if m else None
            if pid is None or pid not in done:
                if not raw.strip():
                    continue
                try:
                    prompt = normalize_prompt(json.loads(raw))
                    pid = prompt.id
                    if turn_ids is not None and pid not in done:
                        derived += ((rid, lineno) for rid in turn_ids(prompt))
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise InputError(f"not valid JSON: {getattr(e, 'msg', e)}", path, lineno) from None
                except InputError as e:
                    raise InputError(str(e), path, lineno) from None
                if pid not in done:
                    pending.append(start)
            if pid in seen:
                raise InputError(f"duplicate id {pid!r} (first on line {seen[pid]})", path, lineno)
            seen[pid] = lineno
            total += 1
    if total == 0:
        raise InputError("no prompts in file", path)
    for rid, lineno in derived:
        if rid in seen:
            raise InputError(f"a later turn of this conversation would have the id {rid!r}, which the prompt on line "
                             f"{seen[rid]} has", path, lineno)
    return PromptScan(path, total, pending)
