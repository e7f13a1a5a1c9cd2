"""One tool call and what it gave: the unit an environment executes, a trajectory records and a rebuild replays.

The text the model is shown follows BFCL's executor (`multi_turn_utils.execute_multi_turn_func_call`): a `str`
result as is, a `dict` as `json.dumps` (its `str` when that fails), anything else as `str`; a failure as
`Error during execution: <message>`. Each failure has a kind, so a run can count them. The kinds a contained
environment adds (a call that hung, ran out of memory or killed its process) left no trace in the rebuilt
environment, so a rebuild does not replay them (`replays`)."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Failure kinds. The first four come from the environment itself and are replayed like any call: a method that
# raised may have changed the state before it raised.
UNKNOWN_FUNCTION = "unknown_function"  # no offered tool of that name
MALFORMED_ARGUMENTS = "malformed_arguments"  # not JSON, or not a JSON object
INVALID_ARGUMENTS = "invalid_arguments"  # missing, unexpected or of the wrong type for the tool's schema
RAISED = "raised"  # the method raised
# What containment adds: the process is killed and rebuilt without the call.
TIMEOUT = "timeout"
OUT_OF_MEMORY = "out_of_memory"
CRASHED = "crashed"
ERROR_KINDS = (UNKNOWN_FUNCTION, MALFORMED_ARGUMENTS, INVALID_ARGUMENTS, RAISED, TIMEOUT, OUT_OF_MEMORY, CRASHED)
NOT_REPLAYED = frozenset({TIMEOUT, OUT_OF_MEMORY, CRASHED})
ERROR_PREFIX = "Error during execution: "  # BFCL's wording


@dataclass(frozen=True)
class Call:
    """A call as the model wrote it: the function's name and its arguments as the exact JSON text served."""

    name: str
    arguments: str


@dataclass(frozen=True)
class CallResult:
    """What a call gave: the text the model is shown, and the failure's kind (None for a result)."""

    text: str
    error: str | None = None


@dataclass(frozen=True)
class Executed:
    """A call and its result, as a trajectory records it and a rebuild replays it."""

    call: Call
    result: CallResult

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.call.name, "arguments": self.call.arguments, "result": self.result.text,
                "error": self.result.error}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Executed:
        return cls(Call(d["name"], d["arguments"]), CallResult(d["result"], d.get("error")))


def result_text(value: Any) -> str:
    """A method's return value as BFCL shows it to the model (exact types, as its executor checks them)."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def failure(kind: str, message: str) -> CallResult:
    """A failed call's result: BFCL's error wording around `message`."""
    assert kind in ERROR_KINDS, kind
    return CallResult(ERROR_PREFIX + message, kind)


def replays(executed: Executed) -> bool:
    """Whether a rebuild replays this call: every call the environment itself answered, not one whose process was
    killed under it (its effect died with the process)."""
    return executed.result.error not in NOT_REPLAYED


def error_counts(results: Iterable[CallResult]) -> dict[str, int]:
    """Failed calls by kind (kinds that did not occur left out)."""
    return dict(Counter(r.error for r in results if r.error is not None))
