"""Agentic tasks: the user turns to ask, the tools the model is offered, and the environment its calls run in from
an initial state. One task file format (JSONL, docs/FORMATS.md "Agentic tasks"): BFCL's multi-turn tasks are read
into it (`bfcl.py`) and can be written as it, so a user brings their own tasks the same way."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import iter_jsonl, write_jsonl
from .backends import BFCL, EnvironmentSpec

TASK_FIELDS = ("id", "environment", "turns", "tools", "initial_config", "involved_classes")
ROLES = ("system", "user")  # what a user turn may hold (the model answers; tool results come from the environment)


@dataclass(frozen=True)
class Task:
    """One agentic task. `turns[i]` is the messages of user turn i (BFCL: one user message, sometimes a system
    one); `tools` the OpenAI-style tools offered; `environment` which code runs the calls (`bfcl`, or a user's
    class `package.module:Class` / `path/to/file.py:Class`), started from `initial_config`; `involved_classes`
    which of BFCL's classes the task uses (a user's environment: usually empty)."""

    id: str
    turns: list[list[dict[str, Any]]]
    tools: list[dict[str, Any]]
    environment: str
    initial_config: dict[str, Any]
    involved_classes: list[str]

    def row(self) -> dict[str, Any]:
        """The task as a line of a task file."""
        return {"id": self.id, "environment": self.environment, "turns": self.turns, "tools": self.tools,
                "initial_config": self.initial_config, "involved_classes": self.involved_classes}

    def spec(self, code_path: Sequence[str] = (), base: str | Path | None = None) -> EnvironmentSpec:
        """What builds this task's environment. A user class named by a file path is made absolute against `base`
        (the task file's folder), so the worker finds it from its own empty working folder."""
        backend = self.environment
        where, sep, name = backend.rpartition(":")
        if backend != BFCL and sep and where.endswith(".py"):
            backend = f"{Path(base or os.getcwd()) / where if not Path(where).is_absolute() else Path(where)}:{name}"
        return EnvironmentSpec(self.id, backend, self.initial_config, self.involved_classes, self.tools,
                               list(code_path))


def _check_tool(tool: Any, field: str) -> None:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InputError("a tool must be {type: function, function: {name, parameters}}", field=field)
    fn = tool["function"]
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise InputError("a tool's function needs a name", field=f"{field}.function.name")
    params = fn.get("parameters", {"type": "object"})
    if not isinstance(params, dict) or params.get("type") != "object":
        raise InputError("parameters must be a JSON schema of type object", field=f"{field}.function.parameters")


def task_from_row(row: Any) -> Task:
    """A task file's line as a Task; what is wrong is an InputError naming the field."""
    if not isinstance(row, dict):
        raise InputError("a task must be a JSON object")
    unknown = sorted(set(row) - set(TASK_FIELDS))
    if unknown:
        raise InputError(f"unknown field(s) {unknown}; a task has {list(TASK_FIELDS)}", field=unknown[0])
    tid = row.get("id")
    if not isinstance(tid, str) or not tid:
        raise InputError("must be a non-empty string", field="id")
    environment = row.get("environment")
    if not isinstance(environment, str) or not (environment == BFCL or ":" in environment):
        raise InputError(f"must be '{BFCL}' or a class 'package.module:Class' / 'path/to/file.py:Class'",
                         field="environment")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        raise InputError("must be a non-empty list of user turns, each a list of messages", field="turns")
    for i, turn in enumerate(turns):
        if not isinstance(turn, list) or not turn:
            raise InputError("a turn must be a non-empty list of messages", field=f"turns[{i}]")
        for j, m in enumerate(turn):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise InputError(f"a message must be {{role: {' | '.join(ROLES)}, content: string}}",
                                 field=f"turns[{i}][{j}]")
        if not any(m["role"] == "user" for m in turn):
            raise InputError("a turn needs a user message", field=f"turns[{i}]")
    tools = row.get("tools")
    if not isinstance(tools, list) or not tools:
        raise InputError("must be a non-empty list of OpenAI-style tools", field="tools")
    names = set()
    for i, tool in enumerate(tools):
        _check_tool(tool, f"tools[{i}]")
        name = tool["function"]["name"]
        if name in names:
            raise InputError(f"tool '{name}' is offered twice", field=f"tools[{i}].function.name")
        names.add(name)
    config = row.get("initial_config", {})
    if not isinstance(config, dict):
        raise InputError("must be an object", field="initial_config")
    classes = row.get("involved_classes", [])
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise InputError("must be a list of class names", field="involved_classes")
    if environment == BFCL and not classes:
        raise InputError("a BFCL task names its classes", field="involved_classes")
    return Task(tid, turns, tools, environment, config, classes)


def read_tasks(path: str | Path) -> list[Task]:
    """A task file: one task per line; a bad line or a repeated id is an InputError naming file:line and field."""
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for line, row in iter_jsonl(path):
        try:
            task = task_from_row(row)
        except InputError as e:
            raise e.at(path, line) from None
        if task.id in seen:
            raise InputError(f"id {task.id!r} repeats line {seen[task.id]}", path, line, "id")
        seen[task.id] = line
        tasks.append(task)
    if not tasks:
        raise InputError("no tasks", path)
    return tasks


def write_tasks(path: str | Path, tasks: Iterable[Task]) -> Path:
    """A task file (atomically), one task per line, in the order given."""
    return write_jsonl(path, (t.row() for t in tasks))


def tool_names(tools: Iterable[Mapping[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]
