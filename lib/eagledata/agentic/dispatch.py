"""A call by name to an instance's public method, its JSON arguments as keyword arguments: the one way a call reaches
an environment's code (BFCL's own executor builds a call string and `eval`s it; this never evaluates text).

Which method: the offered tool of that name, bound when the environment is built to the first instance (in the
task's class order) with a public method so named. Before the call, its arguments are checked against the tool's
schema (`argument_problem`: required, unexpected, JSON types, enums, array items, nested objects) and the method's
signature, so the model is told what did not fit instead of the method failing somewhere inside. A JSON null for a
parameter that is not required is passed as None (the methods' defaults are None). Runs inside the worker: stdlib
and `eagledata.errors` only."""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .calls import (
    INVALID_ARGUMENTS,
    MALFORMED_ARGUMENTS,
    OUT_OF_MEMORY,
    RAISED,
    UNKNOWN_FUNCTION,
    Call,
    CallResult,
    failure,
    result_text,
)


class BuildError(InputError):
    """An environment that cannot be built (a missing class or method, a scenario that does not load): the message
    names the task's part at fault."""


@dataclass(frozen=True)
class Function:
    """One offered tool bound to the method that runs it."""

    name: str
    method: Callable[..., Any]
    parameters: Mapping[str, Any]  # the tool's JSON schema (type object)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _fits(kind: str, value: Any) -> bool:
    """JSON Schema's type rule (an integer is a number; 2.0 is an integer)."""
    got = _json_type(value)
    if kind == "number":
        return got in ("integer", "number")
    if kind == "integer":
        return got == "integer" or (got == "number" and float(value).is_integer())
    return got == kind


def value_problem(schema: Mapping[str, Any], value: Any, where: str) -> str | None:
    """What in `value` does not fit `schema` (None when it fits), naming the argument's path."""
    kind = schema.get("type")
    if isinstance(kind, str) and not _fits(kind, value):
        return f"argument '{where}' must be {kind}, got {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"argument '{where}' must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}"
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            if problem := value_problem(schema["items"], item, f"{where}[{i}]"):
                return problem
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        for name in schema.get("required", []):
            if name not in value:
                return f"argument '{where}' misses its field '{name}'"
        for name, item in value.items():
            if name in schema["properties"] and (problem := value_problem(schema["properties"][name], item,
                                                                          f"{where}.{name}")):
                return problem
    return None


def argument_problem(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """What does not fit a tool's parameters (None when they fit): a missing required argument, an unexpected one,
    a value of the wrong type. Pure: the policy the dispatcher applies before calling."""
    properties = parameters.get("properties", {})
    required = parameters.get("required", [])
    for name in arguments:
        if name not in properties:
            return f"got an unexpected keyword argument '{name}'"
    missing = [name for name in required if name not in arguments]
    if missing:
        return "missing required argument" + ("s " if len(missing) > 1 else " ") + ", ".join(f"'{m}'" for m in missing)
    for name, value in arguments.items():
        if value is None and name not in required:
            continue
        if problem := value_problem(properties[name], value, name):
            return problem
    return None


def bind_functions(instances: Sequence[object], tools: Sequence[Mapping[str, Any]]) -> dict[str, Function]:
    """The offered tools bound to methods: each tool's name to the first instance's public method of that name. A
    tool no instance implements is a `BuildError` (the task offers what its environment cannot run)."""
    bound = {}
    for tool in tools:
        fn = tool["function"]
        name = fn["name"]
        for instance in instances:
            method = getattr(instance, name, None) if not name.startswith("_") else None
            if callable(method) and inspect.ismethod(method):
                bound[name] = Function(name, method, fn.get("parameters", {"type": "object", "properties": {}}))
                break
        else:
            owners = ", ".join(type(i).__name__ for i in instances) or "no class"
            raise BuildError(f"tool '{name}' has no public method in {owners}")
    return bound


class CallDispatcher:
    """Executes calls against bound functions; every failure is a result the model sees, never an exception (but
    an exception that is not an `Exception`, such as SystemExit, which ends the worker: a crash)."""

    def __init__(self, functions: Mapping[str, Function]):
        self.functions = dict(functions)

    def execute(self, call: Call) -> CallResult:
        fn = self.functions.get(call.name)
        if fn is None:
            return failure(UNKNOWN_FUNCTION, f"name '{call.name}' is not defined")  # what BFCL's eval says
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as e:
            return failure(MALFORMED_ARGUMENTS, f"{call.name}() arguments are not valid JSON: {e}")
        if not isinstance(arguments, dict):
            return failure(MALFORMED_ARGUMENTS,
                           f"{call.name}() arguments must be a JSON object, got {_json_type(arguments)}")
        if problem := argument_problem(fn.parameters, arguments):
            return failure(INVALID_ARGUMENTS, f"{call.name}() {problem}")
        try:
            inspect.signature(fn.method).bind(**arguments)
        except TypeError as e:
            return failure(INVALID_ARGUMENTS, f"{call.name}() {e}")
        try:
            value = fn.method(**arguments)
        except MemoryError:
            return failure(OUT_OF_MEMORY, f"{call.name}() ran out of memory")
        except Exception as e:
            return failure(RAISED, str(e))  # BFCL: f"Error during execution: {str(e)}"
        try:
            return CallResult(result_text(value))
        except MemoryError:
            return failure(OUT_OF_MEMORY, f"{call.name}() ran out of memory")
        except Exception as e:  # a __str__ that raises is the method's failure too
            return failure(RAISED, f"{call.name}() returned a value that cannot be shown: {e}")
