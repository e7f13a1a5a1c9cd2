"""Prompt files: JSONL of `{id, messages}` or ShareGPT `{id, conversations}`; bad lines name file:line."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import InputError
from .records import iter_jsonl

ROLES = {"system", "user", "assistant", "tool"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "model": "assistant", "bing": "assistant", "bard": "assistant",
                  "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict]


def normalize_prompt(obj: Any) -> Prompt:
    """One prompt object in either accepted shape → `Prompt` ending in a non-assistant turn.

    Trailing assistant turns (ShareGPT keeps the old answer) are dropped: we regenerate that answer.
    """
    if not isinstance(obj, dict):
        raise InputError("a prompt must be a JSON object")
    pid = obj.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == "":
        raise InputError("missing or empty (a unique string is needed)", field="id")
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list):
            raise InputError("must be a list of {role, content}", field="messages")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                raise InputError(f"role must be one of {sorted(ROLES)}", field=f"messages[{i}].role")
            if not isinstance(m.get("content"), (str, list)) and m.get("content") is not None:
                raise InputError("must be a string", field=f"messages[{i}].content")
            out.append(dict(m))
    elif "conversations" in obj:
        turns = obj["conversations"]
        if not isinstance(turns, list):
            raise InputError("must be a list of {from, value}", field="conversations")
        out = []
        for i, t in enumerate(turns):
            role = SHAREGPT_ROLES.get(t.get("from")) if isinstance(t, dict) else None
            if role is None:
                raise InputError(f"'from' must be one of {sorted(SHAREGPT_ROLES)}", field=f"conversations[{i}].from")
            if not isinstance(t.get("value"), str):
                raise InputError("must be a string", field=f"conversations[{i}].value")
            out.append({"role": role, "content": t["value"]})
    else:
        raise InputError("needs 'messages' (or ShareGPT 'conversations')", field="messages")
    while out and out[-1]["role"] == "assistant":
        out.pop()
    if not any(m["role"] == "user" for m in out):
        raise InputError("no user turn left to answer", field="messages")
    return Prompt(str(pid), out)


def iter_prompts(path: str | Path) -> Iterator[Prompt]:
    """Stream prompts (flat memory for large files); duplicate ids are an error naming both lines."""
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        try:
            prompt = normalize_prompt(obj)
        except InputError as e:
            raise InputError(str(e), path, lineno) from None
        if prompt.id in seen:
            raise InputError(f"duplicate id {prompt.id!r} (first on line {seen[prompt.id]})", path, lineno)
        seen[prompt.id] = lineno
        yield prompt


def load_prompts(path: str | Path) -> list[Prompt]:
    prompts = list(iter_prompts(path))
    if not prompts:
        raise InputError("no prompts in file", path)
    return prompts
