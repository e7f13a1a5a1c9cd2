"""Prompt files: JSONL of `{id, messages}`, ShareGPT `{id, conversations: [{from, value}]}` or SpecForge
`{id, conversations: [{role, content}]}`, each with optional OpenAI-style `tools`; bad lines name file:line and the
field (`messages[3].tool_call_id`).

Tool conversations are checked here, once, before any request: a call the model never made or a result that
answers nothing would be rendered by the chat template as is and train the drafter on a history K2.5 cannot write.
ShareGPT tool turns (LLaMA-Factory's `function_call`/`observation`, speculators' result roles) become OpenAI turns
with the ids K2.5 itself writes (`functions.NAME:IDX`, records.native_call_id)."""
from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError, open_input
from .records import ToolCall, native_call_id

ROLES = {"system", "user", "assistant", "tool"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "model": "assistant", "bing": "assistant", "bard": "assistant",
                  "system": "system", "function_call": "assistant",
                  # tool results: LLaMA-Factory's `observation`, and the roles speculators' regeneration reads
                  "tool": "tool", "function": "tool", "observation": "tool", "function_response": "tool"}
SHAREGPT_CALL = "function_call"  # LLaMA-Factory: value is JSON {name, arguments} or a list of them

Tools = list[dict]


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict]
    tools: Tools | None = None  # OpenAI-style tool declarations the conversation may call
    # An agentic task (a rollout, generation/conversations/rollouts.py): what the executor builds its environment from
    # (`{id, environment, initial_config, involved_classes, tools}`, passed on as is), and its user turns (each its
    # messages, in order; `messages` is all of them).
    task: dict | None = None
    user_turns: tuple[tuple[dict, ...], ...] | None = None


@dataclass(frozen=True)
class _Shape:
    """One accepted way of writing a conversation: the list's key, and each turn's role and text keys."""

    key: str
    role_key: str
    text_key: str
    roles: Mapping[Any, str]  # as written (any JSON value: looked up as is) -> chat-template role
    text_types: tuple[type, ...]
    keep: Collection[str] | None  # keys passed on beside role and content (None: the whole turn, e.g. `name`)


SHAPES = (
    _Shape("messages", "role", "content", {r: r for r in ROLES}, (str, list, type(None)), keep=None),
    _Shape("conversations", "from", "value", SHAREGPT_ROLES, (str,), keep=()),
    # SpecForge's prompt files: the ShareGPT key with OpenAI-style turns (tool calls included).
    _Shape("conversations", "role", "content", {r: r for r in ROLES}, (str, type(None)),
           keep=("tool_calls", "tool_call_id")),
)
_SHAREGPT = SHAPES[1]


def _shape(obj: dict) -> _Shape | None:
    """The first shape whose key is present and whose first turn uses its role key (ShareGPT when unsure)."""
    shapes = [s for s in SHAPES if s.key in obj]
    first = obj[shapes[0].key][0] if shapes and isinstance(obj[shapes[0].key], list) and obj[shapes[0].key] else None
    fits = [s for s in shapes if isinstance(first, dict) and s.role_key in first]
    return fits[0] if fits else shapes[0] if shapes else None


def _is_name(x: Any) -> bool:
    return isinstance(x, str) and x != ""


def normalize_tools(raw: Any, field: str = "tools") -> Tools | None:
    """Tool declarations → OpenAI `[{type: function, function: {name, …}}]`, or None when there are none.

    Accepts a JSON string of the list (SpecForge, speculators and LLaMA-Factory store the column so) and bare
    `{name, description, parameters}` items (LLaMA-Factory's), which are wrapped; a name declared twice is refused.
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InputError(f"a JSON string of tools that is not valid JSON: {e.msg}", field=field) from None
    if not isinstance(raw, list):
        raise InputError("must be a list of {type: function, function: {name, …}}", field=field)
    out: Tools = []
    seen: dict[str, int] = {}
    for k, t in enumerate(raw):
        if isinstance(t, dict) and "type" not in t and "function" not in t and "name" in t:
            t = {"type": "function", "function": t}
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise InputError("must be {type: function, function: {name, …}}", field=f"{field}[{k}]")
        name = t["function"].get("name")
        if not _is_name(name):
            raise InputError("must be a non-empty string", field=f"{field}[{k}].function.name")
        if name in seen:
            raise InputError(f"{name!r} is declared twice (first as {field}[{seen[name]}])",
                             field=f"{field}[{k}].function.name")
        seen[name] = k
        out.append(t)
    return out or None


def _sharegpt_calls(value: Any, where: str, count: int, declared: Collection[str] | None) -> list[dict]:
    """A `function_call` turn's value → OpenAI tool calls with K2.5's ids, numbered on from `count`."""
    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as e:
        raise InputError(f"a function_call must be JSON {{name, arguments}} or a list of them: {e.msg}",
                         field=where) from None
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls:
        raise InputError("a function_call must be JSON {name, arguments} or a non-empty list of them", field=where)
    out = []
    for k, c in enumerate(calls):
        if not isinstance(c, dict) or not _is_name(c.get("name")):
            raise InputError(f"call {k} needs a non-empty string 'name'", field=where)
        if not isinstance(c.get("arguments", ""), (str, dict)):
            raise InputError(f"call {k}: 'arguments' must be a JSON object or a string", field=where)
        if declared is not None and c["name"] not in declared:
            raise InputError(f"call {k} calls {c['name']!r}, which the tools do not declare "
                             f"({', '.join(sorted(declared))})", field=where)
        fn = ToolCall.from_api({"function": {"name": c["name"], "arguments": c.get("arguments", "")}})
        out.append(ToolCall(native_call_id(fn.name, count + k), fn.name, fn.arguments).to_api())
    return out


def _turns(obj: dict, tools: Tools | None) -> tuple[list[dict], _Shape]:
    shape = _shape(obj)
    if shape is None:
        raise InputError("needs 'messages' (or 'conversations', ShareGPT or SpecForge style)", field="messages")
    turns = obj[shape.key]
    if not isinstance(turns, list):
        raise InputError(f"must be a list of {{{shape.role_key}, {shape.text_key}}}", field=shape.key)
    out: list[dict] = []
    calls = 0  # ShareGPT: the conversation's tool calls so far (K2.5 numbers its call ids over the conversation)
    pending: list[str] = []  # ShareGPT: ids of the last function_call turn not yet answered, in order
    pending_at = 0
    declared = {t["function"]["name"] for t in tools} if tools else None
    for i, t in enumerate(turns):
        where = f"{shape.key}[{i}]"
        role = shape.roles.get(t.get(shape.role_key)) if isinstance(t, dict) else None
        if role is None:
            raise InputError(f"{shape.role_key} must be one of {sorted(shape.roles)}",
                             field=f"{where}.{shape.role_key}")
        text = t.get(shape.text_key)
        if shape is _SHAREGPT and pending and role != "tool":
            raise InputError(f"{len(pending)} of its calls have no tool result before {where} (one result turn per "
                             f"call, in order)", field=f"{shape.key}[{pending_at}].value")
        if shape is _SHAREGPT and t[shape.role_key] == SHAREGPT_CALL:
            tool_calls = _sharegpt_calls(text, f"{where}.value", calls, declared)
            calls += len(tool_calls)
            pending, pending_at = [c["id"] for c in tool_calls], i
            out.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
            continue
        if not isinstance(text, shape.text_types) or (text is None and (
                role == "tool" or (shape.keep is not None and not t.get("tool_calls")))):
            raise InputError("must be a string", field=f"{where}.{shape.text_key}")
        if shape is _SHAREGPT and role == "tool":
            if not pending:
                raise InputError("a tool result with no function_call turn before it left to answer",
                                 field=f"{where}.{shape.role_key}")
            out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": text})
            continue
        if shape.keep is None:
            out.append({**t, "role": role})
        else:
            out.append({"role": role, "content": text, **{k: t[k] for k in shape.keep if k in t}})
    if pending and out and out[-1]["role"] == "tool":
        raise InputError(f"{len(pending)} of its calls have no tool result (one result turn per call, in order)",
                         field=f"{shape.key}[{pending_at}].value")
    return out, shape


def _check_tools(turns: list[dict], tools: Tools | None, key: str) -> None:
    """Every call well formed and declared; every tool turn answers a call of the nearest tool-call turn before it
    that is still open; no call left unanswered when the conversation moves on (K2.5 renders a result as
    `## Return of <id>`: one answering nothing is a history the model never saw)."""
    declared = {t["function"]["name"] for t in tools} if tools else None
    open_calls: dict[str, int] = {}  # call id -> index of its call in the open assistant turn
    opened_at: int | None = None  # index of the last assistant tool-call turn
    for i, m in enumerate(turns):
        where = f"{key}[{i}]"
        if m["role"] != "tool" and open_calls:
            left = next(iter(open_calls))
            raise InputError(f"call {left!r} has no tool turn answering it before {where}",
                             field=f"{key}[{opened_at}].tool_calls[{open_calls[left]}].id")
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not calls:
                raise InputError("must be a non-empty list of {id, type: function, function: {name, arguments}}",
                                 field=f"{where}.tool_calls")
            for k, c in enumerate(calls):
                at = f"{where}.tool_calls[{k}]"
                if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
                    raise InputError("must be {id, type: function, function: {name, arguments}}", field=at)
                if not _is_name(c.get("id")):
                    raise InputError("must be a non-empty string", field=f"{at}.id")
                if c.get("type") != "function":
                    raise InputError("must be 'function'", field=f"{at}.type")
                name = c["function"].get("name")
                if not _is_name(name):
                    raise InputError("must be a non-empty string", field=f"{at}.function.name")
                if not isinstance(c["function"].get("arguments"), (str, dict)):
                    raise InputError("must be a string (or a JSON object)", field=f"{at}.function.arguments")
                if declared is not None and name not in declared:
                    raise InputError(f"calls {name!r}, which the tools do not declare ({', '.join(sorted(declared))})",
                                     field=f"{at}.function.name")
                if c["id"] in open_calls:
                    raise InputError(f"duplicate call id {c['id']!r} (also tool_calls[{open_calls[c['id']]}])",
                                     field=f"{at}.id")
                open_calls[c["id"]] = k
            opened_at = i
        elif m["role"] == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str):
                raise InputError("must be a string (the id of the call this result answers)",
                                 field=f"{where}.tool_call_id")
            if opened_at is None:
                raise InputError("a tool turn with no assistant tool call before it", field=f"{where}.tool_call_id")
            if cid not in open_calls:
                why = (f"open calls of {key}[{opened_at}]: {', '.join(map(repr, open_calls))}" if open_calls
                       else f"every call of {key}[{opened_at}] is answered already")
                raise InputError(f"{cid!r} answers no open call ({why})", field=f"{where}.tool_call_id")
            del open_calls[cid]
    if open_calls and turns and turns[-1]["role"] == "tool":
        left = next(iter(open_calls))
        raise InputError(f"call {left!r} has no tool turn answering it",
                         field=f"{key}[{opened_at}].tool_calls[{open_calls[left]}].id")


TASK_ENVIRONMENT = ("environment", "initial_config", "involved_classes")  # what the executor builds from


def _user_turns(raw: Any) -> tuple[tuple[dict, ...], ...]:
    """A task's `turns`: a non-empty list, each turn a non-empty list of `{role: user | system, content: string}`
    holding a user message (BFCL's `question`)."""
    if not isinstance(raw, list) or not raw:
        raise InputError("must be a non-empty list of user turns, each a list of messages", field="turns")
    out = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, list) or not turn:
            raise InputError("a turn must be a non-empty list of messages", field=f"turns[{i}]")
        for j, m in enumerate(turn):
            if not isinstance(m, dict) or m.get("role") not in ("user", "system"):
                raise InputError("role must be one of ['system', 'user']", field=f"turns[{i}][{j}].role")
            if not isinstance(m.get("content"), str):
                raise InputError("must be a string", field=f"turns[{i}][{j}].content")
        if not any(m["role"] == "user" for m in turn):
            raise InputError("a turn needs a user message", field=f"turns[{i}]")
        out.append(tuple({"role": m["role"], "content": m["content"]} for m in turn))
    return tuple(out)


def normalize_task(obj: dict, pid: str, declared: Tools | None, base: Path | None = None) -> Prompt:
    """An agentic task (docs/FORMATS.md "Agentic tasks": `environment` names the code its calls run in, `turns` its
    user turns, `initial_config` and `involved_classes` the environment's start): its user turns are asked one by one
    and its tool calls executed (a rollout). `Prompt.task` is what the executor builds the environment from: the
    task's id, environment fields and tools; a user's class named by a relative file path is made absolute against
    `base` (the task file's folder), so the executor finds it from any working folder."""
    environment = obj["environment"]
    if not isinstance(environment, str) or not environment:
        raise InputError("must be 'bfcl' or a class 'package.module:Class' / 'path/to/file.py:Class'",
                         field="environment")
    where, sep, name = environment.rpartition(":")
    if sep and where.endswith(".py") and base is not None and not Path(where).is_absolute():
        environment = f"{(base / where).resolve()}:{name}"
    turns = _user_turns(obj.get("turns"))
    config, classes = obj.get("initial_config", {}), obj.get("involved_classes", [])
    if not isinstance(config, dict):
        raise InputError("must be an object", field="initial_config")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise InputError("must be a list of class names", field="involved_classes")
    task = {"id": pid, "environment": environment, "initial_config": config, "involved_classes": classes,
            "tools": declared or []}
    return Prompt(pid, [dict(m) for turn in turns for m in turn], declared, task, turns)


def normalize_prompt(obj: Any, tools: Tools | None = None, base: Path | None = None) -> Prompt:
    """One prompt object in any accepted shape → `Prompt` ending in a non-assistant turn.

    `tools`: the dataset's declarations (datasets.yaml), used when the prompt has no `tools` of its own (absent,
    null or ""); a prompt's `tools: []` means it has none. Trailing assistant turns (ShareGPT keeps the old
    answer) are dropped: we regenerate that answer. `base`: the prompt file's folder (a task's relative class path).
    """
    if not isinstance(obj, dict):
        raise InputError("a prompt must be a JSON object")
    pid = obj.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == "":
        raise InputError("missing or empty (a unique string is needed)", field="id")
    if isinstance(pid, str) and ("\t" in pid or "\n" in pid or "\r" in pid):
        raise InputError("must not contain tabs or line breaks", field="id")
    own = obj.get("tools")
    declared = normalize_tools(own) if own not in (None, "") else tools
    if obj.get("environment") is not None:
        return normalize_task(obj, str(pid), declared, base)
    out, shape = _turns(obj, declared)
    _check_tools(out, declared, shape.key)
    while out and out[-1]["role"] == "assistant":
        out.pop()
    if not any(m["role"] == "user" for m in out):
        raise InputError("no user turn left to answer", field=shape.key)
    return Prompt(str(pid), out, declared)


def iter_prompts(path: str | Path, tools: Tools | None = None) -> Iterator[Prompt]:
    """Every prompt of a file, validated first (a bad line or a duplicate id names file:line)."""
    return iter(scan_prompts(path, tools=tools))


def load_prompts(path: str | Path, tools: Tools | None = None) -> list[Prompt]:
    return list(scan_prompts(path, tools=tools))


# `{"id": "<plain string>"` at the start of a line: lets a resume skip finished prompts unparsed.
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*"([^"\\\t\r\n]*)"')


@dataclass
class PromptScan:
    """One validating pass over a prompt file: how many prompts, and where the unfinished ones are."""

    path: Path
    total: int
    pending: array  # byte offsets of prompts not in `done`, in file order
    tools: Tools | None = None  # the dataset's tools, for prompts without their own
    rollouts: int = 0  # the unfinished prompts that are agentic tasks (name an environment): the run needs an executor

    def __iter__(self) -> Iterator[Prompt]:
        with self.path.open("rb") as f:
            for offset in self.pending:
                f.seek(offset)
                yield normalize_prompt(json.loads(f.readline()), self.tools, self.path.parent)


def scan_prompts(path: str | Path, done: Container[str] = frozenset(), limit: int | None = None,
                 turn_ids: Callable[[Prompt], Iterable[str]] | None = None,
                 tools: Tools | None = None) -> PromptScan:
    """Validate the first `limit` prompts (all by default), naming file:line for a bad one.

    `tools`: the dataset's tool declarations (`DatasetSpec.tools`), for prompts that have none of their own.

    Lines of finished prompts (their id in `done`) are only checked for a duplicate id: a resume over a
    million finished prompts costs one regex per line instead of a JSON parse. `turn_ids`: the record ids an
    unfinished prompt's later turns will have; one that is another prompt's id is refused.
    """
    path = Path(path)
    seen: dict[str, int] = {}
    derived: list[tuple[str, int]] = []
    pending = array("q")
    total = rollouts = 0
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
                    prompt = normalize_prompt(json.loads(raw), tools, path.parent)
                    pid = prompt.id
                    if turn_ids is not None and pid not in done:
                        derived += ((rid, lineno) for rid in turn_ids(prompt))
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise InputError(f"not valid JSON: {getattr(e, 'msg', e)}", path, lineno) from None
                except InputError as e:
                    raise InputError(str(e), path, lineno) from None
                if pid not in done:
                    pending.append(start)
                    rollouts += int(prompt.task is not None)
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
    return PromptScan(path, total, pending, tools, rollouts)
