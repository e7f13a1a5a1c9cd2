"""Generation's environment seam (`generation.conversations.rollouts.Execute`) over this package's environments.

The seam is stateless: a step comes with the trajectory's earlier calls and the results the model was shown
(`before`), and its results must be what a fresh environment gives after replaying them. Rebuilding for every step
is exact but costs a worker start (0.14–0.5 s) and a replay of the whole trajectory, step after step. So the executor
keeps a bounded pool of live environments, one per task, each with the calls it has executed and the results they
gave: when a step's `before` is exactly a live environment's history (same task spec, same calls in order with the
same argument texts, the same results), the step's calls run on it; otherwise (none live: the first step, an evicted
one, a resume after a kill; or a history that differs: a step completed twice, a retry after calls ran whose answer
was never recorded) the environment is rebuilt: fresh, every earlier call replayed in order and its result checked
against what the model was shown (a `ReplayMismatch` stops the run: the records would no longer be what the
environment gives). So the state a step runs on is always the one its records describe, live or not.

A call whose process was killed under it (a timeout, a crash) is replayed too: it fails again the same way and
leaves the state as it found it, so the replay needs no record of why a call failed.

The pool holds at most `live` environments (the least recently used is closed past it; 0: each step rebuilt and
closed, as before the pool) and, at each step's end, closes those idle for `idle_s` (their trajectories most likely
ended); `close()` (at the run's end, through generation's
`ToolResults.close`) closes them all. An environment is taken out of the pool while a step uses it, so two threads
never share one. The environments are contained (`ContainedEnvironments`, a worker process each under `Limits`)
unless told otherwise; BFCL's backends are fetched and extracted into `cache_dir` on the first `bfcl` task
(`bfcl_code_path`).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends import BFCL, EnvironmentSpec
from .bfcl import bfcl_code_path
from .calls import CallResult
from .contained import ContainedEnvironments, Limits
from .environment import Environment, Environments, ReplayMismatch

DEFAULT_LIVE = 64  # environments kept live between steps (a BFCL worker: ~35 MB resident)
DEFAULT_IDLE_S = 120.0  # a live environment unused this long is closed (its trajectory likely ended)

Step = tuple[str, str, str]  # a call as executed: (name, arguments as served, the result text the model was shown)


@dataclass
class LiveEnvironment:
    """An environment kept between steps: what built it and every call it executed, with the results shown."""

    spec: EnvironmentSpec
    environment: Environment
    history: list[Step]
    used_at: float


def history_of(before: Sequence[tuple[Any, str]]) -> list[Step]:
    """A step's `before` as the history a live environment must hold to run the step without a rebuild."""
    return [(call.name, call.arguments, shown) for call, shown in before]


@dataclass
class RolloutExecutor:
    """`Execute` for generation: (task, earlier calls with the results shown, the step's calls) → their results, each
    with its failure's kind (the record keeps the kinds: the report counts them without reading the wording).
    `built` counts environments opened fresh (each replaying its `before`), `reused` steps run on a live one."""

    environments: Environments = field(default_factory=lambda: ContainedEnvironments(Limits()))
    cache_dir: str | Path = ".cache/agentic"  # where BFCL's wheel and backends are kept
    live: int = DEFAULT_LIVE  # environments kept between steps at most (LRU); 0: every step rebuilt
    idle_s: float = DEFAULT_IDLE_S
    clock: Callable[[], float] = time.monotonic
    built: int = field(default=0, init=False)
    reused: int = field(default=0, init=False)
    _bfcl_path: list[str] | None = field(default=None, init=False, repr=False)
    _pool: OrderedDict[str, LiveEnvironment] = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def spec(self, task: Mapping[str, Any]) -> EnvironmentSpec:
        """What builds the task's environment (`Prompt.task`: id, environment, initial_config, involved_classes,
        tools; a user's class path is absolute already, made so where the task file was read)."""
        code_path: list[str] = []
        if task["environment"] == BFCL:
            with self._lock:
                if self._bfcl_path is None:
                    self._bfcl_path = bfcl_code_path(self.cache_dir)
                code_path = self._bfcl_path
        return EnvironmentSpec(str(task["id"]), task["environment"], task.get("initial_config") or {},
                               list(task.get("involved_classes") or ()), list(task.get("tools") or ()), code_path)

    def __call__(self, task: Mapping[str, Any], before: Sequence[tuple[Any, str]],
                 calls: Sequence[Any]) -> list[CallResult]:
        spec, history = self.spec(task), history_of(before)
        entry = self._take(spec.task_id)
        if entry is not None and (entry.spec != spec or entry.history != history):
            entry.environment.close()  # stale: it holds another trajectory's state than the records say
            entry = None
        if entry is None:
            entry = LiveEnvironment(spec, self._rebuild(spec, before), history, self.clock())
            with self._lock:
                self.built += 1
        else:
            with self._lock:
                self.reused += 1
        try:
            results = [entry.environment.execute(c.name, c.arguments) for c in calls]
        except BaseException:
            entry.environment.close()
            raise
        entry.history.extend((c.name, c.arguments, r.text) for c, r in zip(calls, results))
        entry.used_at = self.clock()
        self._keep(entry)
        return results

    def _rebuild(self, spec: EnvironmentSpec, before: Sequence[tuple[Any, str]]) -> Environment:
        """A fresh environment with `before` replayed, each result checked against what the model was shown."""
        environment = self.environments.open(spec)
        try:
            for i, (call, shown) in enumerate(before):
                got = environment.execute(call.name, call.arguments)
                if got.text != shown:
                    raise ReplayMismatch(f"task {spec.task_id}: replaying call {i} ({call.name} {call.arguments}) "
                                         f"gave {got.text[:200]!r}, the model was shown {shown[:200]!r}")
        except BaseException:
            environment.close()
            raise
        return environment

    def _take(self, task_id: str) -> LiveEnvironment | None:
        """The task's live environment, out of the pool while a step uses it."""
        with self._lock:
            return self._pool.pop(task_id, None)

    def _keep(self, entry: LiveEnvironment) -> None:
        """Back into the pool as the most recently used; the least recently used past `live`, and the idle, closed."""
        with self._lock:
            if self._closed or self.live <= 0:
                done = [entry]
            else:
                replaced = self._pool.pop(entry.spec.task_id, None)  # a step of the same task run meanwhile
                done = [replaced] if replaced is not None else []
                self._pool[entry.spec.task_id] = entry
                done += [self._pool.popitem(last=False)[1] for _ in range(len(self._pool) - self.live)]
                cutoff = entry.used_at - self.idle_s
                done += [self._pool.pop(k) for k, e in list(self._pool.items()) if e.used_at < cutoff]
        for e in done:
            e.environment.close()

    @property
    def live_now(self) -> int:
        """Environments in the pool now (not counting those a step is using)."""
        with self._lock:
            return len(self._pool)

    def close(self) -> None:
        """Every live environment closed; one in use is closed when its step ends. Called at the run's end."""
        with self._lock:
            self._closed = True
            done = list(self._pool.values())
            self._pool.clear()
        for e in done:
            e.environment.close()
