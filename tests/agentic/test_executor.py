"""The rollout executor's pool of live environments: the results are the stateless ones (fresh + replay) with or
without it, a live environment is used only when its history is exactly the step's `before`, the pool stays within
its bound, idle ones are closed, and everything is closed at the run's end."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from eagledata.agentic import ContainedEnvironments, InProcessEnvironments, Limits, ReplayMismatch
from eagledata.agentic.backends import EnvironmentSpec
from eagledata.agentic.calls import CallResult
from eagledata.agentic.environment import Environment
from eagledata.agentic.executor import RolloutExecutor
from eagledata.generation.realtime.tool_results import ToolResults
from eagledata.records import ToolCall
from tests.helpers.agentic_envs import HERE, PLANTED_TOOLS

# BFCL tasks across the eight backends (GorillaFileSystem, MathAPI, MessageAPI, TwitterAPI, TicketAPI, TradingBot,
# TravelAPI, VehicleControlAPI)
TASKS = ("multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_14", "multi_turn_base_15",
         "multi_turn_base_50", "multi_turn_base_59", "multi_turn_base_101", "multi_turn_base_150")


class TextExecutor(RolloutExecutor):
    """The executor with the results' texts alone (what these tests compare; their kinds: test_rollout_report.py)."""

    def __call__(self, task, before, calls):  # type: ignore[override]
        return [r.text for r in super().__call__(task, before, calls)]


@dataclass
class Counted:
    """`Environments` that counts what it opened and what was closed (the pool's bound and closing, observed)."""

    inner: Any = field(default_factory=InProcessEnvironments)
    opened: int = 0
    open_now: int = 0

    def open(self, spec: EnvironmentSpec) -> Environment:
        self.opened += 1
        self.open_now += 1
        return _CountedEnvironment(self.inner.open(spec), self)


@dataclass
class _CountedEnvironment:
    inner: Environment
    owner: Counted
    closed: bool = False

    def execute(self, name: str, arguments: str) -> CallResult:
        assert not self.closed, "a closed environment was used"
        return self.inner.execute(name, arguments)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.open_now -= 1
        self.inner.close()


def tool_call(name: str, arguments: str, idx: int) -> ToolCall:
    return ToolCall(f"functions.{name}:{idx}", name, arguments)


def steps_of(ground_truth, task_ids: Sequence[str]) -> list[tuple[str, list[ToolCall]]]:
    """BFCL's ground-truth calls as steps (each user turn's calls split in two steps), the tasks interleaved
    round-robin as a run's trajectories are."""
    per_task = []
    for tid in task_ids:
        steps, idx = [], 0
        for turn in ground_truth[tid]:
            calls = [tool_call(c.name, c.arguments, idx + i) for i, c in enumerate(turn)]
            idx += len(calls)
            half = (len(calls) + 1) // 2
            steps += [s for s in (calls[:half], calls[half:]) if s]
        per_task.append([(tid, s) for s in steps])
    out = []
    for i in range(max(map(len, per_task))):
        out += [p[i] for p in per_task if i < len(p)]
    return out


def run_steps(execute: RolloutExecutor, rows: dict[str, dict], steps) -> dict[str, list[str]]:
    """Each step executed with its trajectory's earlier calls and results as `before`, as generation asks."""
    before: dict[str, list[tuple[ToolCall, str]]] = {tid: [] for tid in rows}
    for tid, calls in steps:
        results = execute(rows[tid], list(before[tid]), calls)
        before[tid] += list(zip(calls, results))
    return {tid: [r for _, r in b] for tid, b in before.items()}


def test_the_pool_gives_the_stateless_results_and_skips_the_rebuilds(bfcl_tasks, ground_truth, smollm2_cache):
    """Eight BFCL tasks' ground-truth calls, interleaved: the results with the pool, with a pool smaller than the
    trajectories in flight, and with none (every step fresh + replay) are the same; the pool opens one environment per
    task and runs every later step without a rebuild. (Planted: a pool that forgets to add a step's calls to a live
    environment's history rebuilds every step, caught by the counts here.)"""
    rows = {t.id: t.row() for t in bfcl_tasks if t.id in TASKS}
    assert len(rows) == len(TASKS)
    classes = {c for r in rows.values() for c in r["involved_classes"]}
    assert len(classes) == 8, classes
    steps = steps_of(ground_truth, TASKS)
    results = {}
    for live in (0, 3, 64):
        envs = Counted()
        execute = TextExecutor(envs, cache_dir=smollm2_cache, live=live)
        results[live] = run_steps(execute, rows, steps)
        execute.close()
        assert envs.open_now == 0
        if live == 0:
            assert envs.opened == len(steps) and execute.reused == 0
        elif live == 64:
            assert envs.opened == execute.built == len(TASKS) and execute.reused == len(steps) - len(TASKS)
        else:  # round-robin over eight trajectories with three kept: the least recently used is gone (until only
            # three trajectories are left)
            assert execute.built + execute.reused == len(steps) and execute.reused < len(TASKS)
    assert results[0] == results[3] == results[64]
    errors = sum(r.startswith("Error during execution") for rs in results[0].values() for r in rs)
    assert sum(map(len, results[0].values())) == 50 and errors < 5


PLANTED = {"id": "p", "environment": f"{HERE}:Planted", "initial_config": {"start": 1}, "involved_classes": [],
           "tools": PLANTED_TOOLS}
ADD = tool_call("add", '{"n": 1}', 0)


def test_a_live_environment_whose_history_is_not_the_steps_before_is_rebuilt():
    """A step asked again after its calls ran (their answer never recorded: a retry, a kill) must not run on the
    environment that already holds them: it is rebuilt from `before`, and gives the stateless result. (Planted: reuse
    by task id alone, and the second `add` answers count 3, here caught.)"""
    envs = Counted()
    execute = TextExecutor(envs)
    first = execute(PLANTED, [], [ADD])
    assert first == [json.dumps({"count": 2})]
    assert execute(PLANTED, [], [ADD]) == first  # the same step again: not on the live state that holds it
    assert execute.built == 2 and execute.reused == 0 and envs.open_now == 1
    again = execute(PLANTED, [(ADD, first[0])], [ADD])  # the next step: on the live one
    assert again == [json.dumps({"count": 3})] and execute.reused == 1
    other = {**PLANTED, "tools": PLANTED_TOOLS[:3]}  # the same id, another task (another dataset's): its own
    assert execute(other, [(ADD, first[0]), (ADD, again[0])], [ADD]) == [json.dumps({"count": 4})]
    assert execute.built == 3 and execute.reused == 1
    execute.close()
    assert envs.open_now == 0


def test_a_replay_that_disagrees_with_what_was_shown_stops_the_step():
    """`before` whose shown result a fresh replay does not give (records from another state) is a ReplayMismatch,
    whether or not an environment is live, and nothing stays open."""
    envs = Counted()
    execute = TextExecutor(envs)
    execute(PLANTED, [], [ADD])
    with pytest.raises(ReplayMismatch):
        execute(PLANTED, [(ADD, json.dumps({"count": 7}))], [ADD])
    assert envs.open_now == 0 and execute.live_now == 0
    other = {**PLANTED, "initial_config": {"start": 10}}  # the same id, another task's state: rebuilt and checked
    with pytest.raises(ReplayMismatch):
        execute(other, [(ADD, json.dumps({"count": 2}))], [ADD])
    execute.close()


def test_the_pool_keeps_at_most_live_closes_the_idle_and_closes_all_at_the_end():
    envs, now = Counted(), [0.0]
    execute = TextExecutor(envs, live=2, idle_s=10.0, clock=lambda: now[0])
    shown: dict[str, str] = {}
    for tid in ("a", "b", "c"):
        (shown[tid],) = execute({**PLANTED, "id": tid}, [], [ADD])
        assert envs.open_now <= 2 and execute.live_now <= 2
    assert execute.live_now == 2  # "a", the least recently used, closed
    execute({**PLANTED, "id": "c"}, [(ADD, shown["c"])], [ADD])
    assert execute.reused == 1
    now[0] = 11.0  # "b" idle past idle_s; "c" used now
    execute({**PLANTED, "id": "c"}, [(ADD, shown["c"]), (ADD, json.dumps({"count": 3}))], [ADD])
    assert execute.live_now == 1 and envs.open_now == 1 and execute.reused == 2
    tool_results = ToolResults(execute)
    tool_results.close()  # the run's end: generation closes its executor
    assert envs.open_now == 0 and execute.live_now == 0
    execute({**PLANTED, "id": "d"}, [], [ADD])  # a step finishing after the close leaves nothing open
    assert envs.open_now == 0


def test_contained_workers_are_kept_between_steps_and_ended_at_the_close():
    """With worker processes: one worker serves the trajectory's steps (no start per step), a timed-out call in a
    step is an error result and the next step still gets the stateless result, and the close ends the workers."""
    execute = TextExecutor(ContainedEnvironments(Limits(call_s=1.0, memory_bytes=768 << 20)))
    hang = tool_call("hang", "{}", 1)
    before: list[tuple[ToolCall, str]] = []
    for step in ([ADD], [hang, ADD], [ADD]):
        results = execute(PLANTED, list(before), step)
        before += list(zip(step, results))
    assert [r for _, r in before][-1] == json.dumps({"count": 4})
    assert "did not return within 1 s" in before[1][1]
    assert execute.built == 1 and execute.reused == 2
    (entry,) = execute._pool.values()
    worker = entry.environment.worker  # type: ignore[attr-defined]
    assert worker is not None and worker.proc.poll() is None
    fresh = TextExecutor(ContainedEnvironments(Limits(call_s=1.0)), live=0)
    assert fresh(PLANTED, before, [ADD]) == [json.dumps({"count": 5})] == execute(PLANTED, before, [ADD])
    execute.close()
    assert worker.proc.returncode is not None and execute.live_now == 0


def test_two_steps_of_one_task_at_once_leave_one_environment_and_close_the_other():
    """Generation never runs two steps of one trajectory at once, but a second caller might: each gets its own
    environment (the live one is taken out while used), and the one put back second replaces the first, closed.
    (Planted: a put-back that overwrites the pool's entry without closing it leaks a worker, here caught.)"""
    envs = Counted()
    execute = TextExecutor(envs)
    first = execute(PLANTED, [], [ADD])  # an environment in the pool
    held = execute._take("p")  # a step in flight on it...
    assert held is not None
    assert execute(PLANTED, [(ADD, first[0])], [ADD]) == [json.dumps({"count": 3})]  # ...another rebuilt meanwhile
    execute._keep(held)  # the first step ends: the pool keeps one, the other closed
    assert execute.live_now == 1 and envs.open_now == 1
    execute.close()
    assert envs.open_now == 0
