"""A tiny environment behind generation's executor seam (a key-value store whose results depend on every call before),
the tasks that use it, a driver that runs generation with it in a process of its own (the kill test SIGKILLs it), and
the check that every trajectory is whole.

`python -m tests.helpers.rollouts '<GenerateConfig fields as JSON>'` runs one generation with `execute` injected."""
from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagledata.emulator.toolcalls import task_rounds
from eagledata.records import Record, ToolCall
from eagledata.text import parse_output_ids, prompt_ids
from tests.helpers.records import recorded_turns

_PROPS = {"key": {"type": "string"}, "value": {"type": "string"}}
# declared to the model; `erase` has no method (an unknown function), `explode` raises, `get` of a missing key raises
NAMES = ("put", "get", "count", "erase", "explode")
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} in the store", "parameters": {
    "type": "object", "properties": {k: v for k, v in _PROPS.items() if n == "put" or k == "key"}}}} for n in NAMES]


class KeyValueStore:
    """The environment: every result says how the store stands after the calls before it, so a result computed on
    the wrong state (a call run twice, or one lost) shows."""

    def __init__(self, initial: Mapping[str, str]):
        self.data = dict(initial)
        self.writes = 0

    def put(self, key: str, value: str) -> dict:
        previous = self.data.get(key)
        self.data[key] = value
        self.writes += 1
        return {"previous": previous, "size": len(self.data), "writes": self.writes}

    def get(self, key: str) -> str:
        return self.data[key]  # a missing key raises: an error result

    def count(self, key: str = "") -> int:
        return sum(k.startswith(key) for k in self.data) + self.writes

    def explode(self, key: str = "") -> None:
        raise RuntimeError(f"the store exploded on {key!r}")


@dataclass(frozen=True)
class Shown:
    """A result with its failure's kind (`rollouts.Shown`), as an executor that knows why a call failed returns it."""

    text: str
    error: str | None = None


def run_shown(env: KeyValueStore, call: ToolCall) -> Shown:
    """One call dispatched by name to a public method with its JSON arguments; what it rejects is an error text, with
    the kind `agentic.calls` names it by."""
    method = getattr(env, call.name, None) if not call.name.startswith("_") and call.name != "data" else None
    if not callable(method):
        return Shown(f"Error: unknown function {call.name!r}", "unknown_function")
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as e:
        return Shown(f"Error: arguments are not valid JSON: {e.msg}", "malformed_arguments")
    if not isinstance(args, dict):
        return Shown("Error: arguments must be a JSON object", "malformed_arguments")
    try:
        return Shown(json.dumps(method(**args), ensure_ascii=False))
    except TypeError as e:
        return Shown(f"Error: {e}", "invalid_arguments")
    except Exception as e:  # noqa: BLE001 - any method's failure is the model's result to read
        return Shown(f"Error: {type(e).__name__}: {e}", "raised")


def run_call(env: KeyValueStore, call: ToolCall) -> str:
    """`run_shown`'s text: what the model is shown."""
    return run_shown(env, call).text


class ReplayMismatch(AssertionError):
    """A replayed call gave another result than the model was shown: the rebuild is not the state it ran on."""


class Executions:
    """`execute` (the seam, stateless: a fresh store from the task's `initial_config`, the calls before replayed, each
    checked against the result the model was shown, then the calls run), counting what it was asked to run. `kinds`:
    results come with their failures' kinds (`Shown`), else as texts alone."""

    def __init__(self, kinds: bool = False) -> None:
        self.asked: list[tuple[str, ...]] = []
        self.kinds = kinds
        self.errors: Counter[str] = Counter()  # the kinds it returned

    def __call__(self, task: Mapping[str, Any], before: Sequence[tuple[ToolCall, str]],
                 calls: Sequence[ToolCall]) -> list[Any]:
        assert task["environment"] == ENVIRONMENT and task["tools"] == TOOLS
        env = KeyValueStore(task["initial_config"])
        for c, shown in before:
            if (again := run_call(env, c)) != shown:
                raise ReplayMismatch(f"{task['id']}: {c.id} gave {again!r}, the model was shown {shown!r}")
        self.asked.append(tuple(c.id for c in calls))
        shown = [run_shown(env, c) for c in calls]
        if not self.kinds:
            return [s.text for s in shown]
        self.errors.update(s.error for s in shown if s.error is not None)
        return shown


ENVIRONMENT = "tests.helpers.rollouts:KeyValueStore"


def task(i: int, turns: int) -> dict:
    """A task over the store with `turns` user turns (their texts fix the emulated model's tool rounds), as an agentic
    task file writes it (docs/FORMATS.md "Agentic tasks")."""
    return {"id": f"task-{i:03d}", "environment": ENVIRONMENT, "tools": TOOLS,
            "turns": [([{"role": "system", "content": "You keep a key-value store."}] if u == 0 else [])
                      + [{"role": "user", "content": f"task {i} turn {u}: keep the store tidy"}] for u in range(turns)],
            "initial_config": {"seed": str(i), "owner": "eagle"}, "involved_classes": []}


def tasks(n: int) -> list[dict]:
    return [task(i, 1 + i % 3) for i in range(n)]


def planned_steps(obj: dict) -> list[int]:
    """The emulated model's tool rounds per user turn of a task (parallel calls allowed)."""
    return [len(task_rounds(t[-1]["content"], NAMES, parallel=True)) for t in obj["turns"]]


def _plain(messages: Sequence[dict]) -> list[dict]:
    """Messages without the reasoning a tool loop in flight is sent with (dropped once a plain answer follows)."""
    return [{k: v for k, v in m.items() if k not in ("reasoning", "reasoning_details")} for m in messages]


def replayed(obj: dict, messages: Sequence[dict]) -> list[tuple[str, str, str]]:
    """Every tool result of `messages` beside what a fresh store returns when the calls are replayed in order
    (independently of generation): (call id, recorded result, fresh result)."""
    env = KeyValueStore(obj["initial_config"])
    out = []
    shown = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    for m in messages:
        for c in m.get("tool_calls") or ():
            call = ToolCall.from_api(c)
            if call.id in shown:
                out.append((call.id, shown[call.id], run_call(env, call)))
    return out


Replay = Callable[[dict, Sequence[dict]], list[tuple[str, str, str]]]


def check_trajectories(tok, d, objs: dict[str, dict], truth: dict[str, dict], steps: int,
                       replay: Replay = replayed) -> dict[str, list[Record]]:
    """Every trajectory whole: turns 1..k once each with the ids `<task>`, `<task>#n`; each request the one before it
    with its answer and that answer's results (or the next user turn) appended; every answer token-exact with the
    model's own call ids; every result equal to a fresh replay (`replay`: the task's environment, fresh, the recorded
    calls run in order; the store's by default); each result's id its call's, each call id once; the trajectory ended
    (answered, capped at `steps`, cut, or failed)."""
    records, failures, by_conv = recorded_turns(d)
    failed = {f.get("conversation_id", f["id"]) for f in failures}
    out = {}
    for cid, obj in objs.items():
        turns = by_conv.get(cid, {})
        assert sorted(turns) == list(range(1, len(turns) + 1)), (cid, sorted(turns))
        chain = [turns[j] for j in range(1, len(turns) + 1)]
        out[cid] = chain
        for j, r in enumerate(chain, 1):
            assert r.id == (cid if j == 1 else f"{cid}#{j}") and r.tools == obj["tools"]
            assert r.prompt_ids == prompt_ids(tok, r.messages, tools=obj["tools"])
            true = truth[r.generation_id]
            if r.finish_reason == "length":
                assert true["output_ids"][:len(r.output_ids)] == r.output_ids
            else:
                assert r.output_ids == true["output_ids"], (cid, j)
            assert parse_output_ids(tok, r.output_ids) == r.answer
            assert [c["id"] for c in r.tool_calls or []] == [c["id"] for c in true["tool_calls"]], (cid, j)
            if j > 1:  # the request is the one before, its answer, then its results or the next user turn
                prev = chain[j - 2]
                mine = {"role": "assistant", "content": prev.content}
                if prev.tool_calls:
                    mine["tool_calls"] = prev.tool_calls
                head = _plain(r.messages[:len(prev.messages) + 1])
                assert head == [*_plain(prev.messages), mine], (cid, j)
                rest = r.messages[len(prev.messages) + 1:]
                if prev.tool_calls:
                    assert [m["role"] for m in rest] == ["tool"] * len(prev.tool_calls)
                    assert [m["tool_call_id"] for m in rest] == [c["id"] for c in prev.tool_calls]
                    assert r.meta["rollout"]["step"] == prev.meta["rollout"]["step"] + 1
                else:
                    assert rest == obj["turns"][prev.meta["rollout"]["user_turn"]] and r.meta["rollout"]["step"] == 1
        if chain:
            ids = [c["id"] for m in chain[-1].messages for c in m.get("tool_calls") or ()]
            assert len(ids) == len(set(ids)), (cid, "a call id twice")
            for call_id, recorded, fresh in replay(obj, chain[-1].messages):
                assert recorded == fresh, (cid, call_id, recorded, fresh)
        last = chain[-1] if chain else None
        ended = last.meta["rollout"].get("ended") if last else None
        if ended == "capped":
            assert last.tool_calls and last.meta["rollout"]["step"] == steps
        elif ended == "answered":
            assert not last.tool_calls and last.meta["rollout"]["user_turn"] == len(obj["turns"])
        else:
            assert cid in failed or (last is not None and last.finish_reason == "length"), (cid, len(chain))
        assert all("ended" not in r.meta["rollout"] for r in chain[:-1])
    return out


def main(argv: Sequence[str]) -> int:
    from eagledata.aio import run_sync
    from eagledata.generation import GenerateConfig
    from eagledata.generation.realtime.parts import Seams
    from eagledata.generation.run import run_generation

    cfg = GenerateConfig(**json.loads(argv[0]))
    summary = run_sync(run_generation(cfg, seams=Seams(environments=Executions())), "run_generation")
    print(json.dumps({"stop_reason": summary.get("stop_reason")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
