"""Generation's environment seam (`generation.conversations.rollouts.Execute`) over this package's environments.

Each step is stateless, as the seam asks: a fresh environment from the task's initial state, every earlier call of the
trajectory replayed in order and its result checked against what the model was shown (a `ReplayMismatch` stops the
run: the records would no longer be what the environment gives), then the step's calls. A call whose process was
killed under it (a timeout, a crash) is replayed too: it fails again the same way and leaves the state as it found
it, so the replay needs no record of why a call failed. The environment is closed after the step.

The environments are contained (`ContainedEnvironments`, a worker process per step under `Limits`) unless told
otherwise; BFCL's backends are fetched and extracted into `cache_dir` on the first `bfcl` task (`bfcl_code_path`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends import BFCL, EnvironmentSpec
from .bfcl import bfcl_code_path
from .calls import CallResult
from .contained import ContainedEnvironments, Limits
from .environment import Environments, ReplayMismatch


@dataclass
class RolloutExecutor:
    """`Execute` for generation: (task, earlier calls with the results shown, the step's calls) → their results, each
    with its failure's kind (the record keeps the kinds: the report counts them without reading the wording)."""

    environments: Environments = field(default_factory=lambda: ContainedEnvironments(Limits()))
    cache_dir: str | Path = ".cache/agentic"  # where BFCL's wheel and backends are kept
    _bfcl_path: list[str] | None = None

    def spec(self, task: Mapping[str, Any]) -> EnvironmentSpec:
        """What builds the task's environment (`Prompt.task`: id, environment, initial_config, involved_classes,
        tools; a user's class path is absolute already, made so where the task file was read)."""
        code_path: list[str] = []
        if task["environment"] == BFCL:
            if self._bfcl_path is None:
                self._bfcl_path = bfcl_code_path(self.cache_dir)
            code_path = self._bfcl_path
        return EnvironmentSpec(str(task["id"]), task["environment"], task.get("initial_config") or {},
                               list(task.get("involved_classes") or ()), list(task.get("tools") or ()), code_path)

    def __call__(self, task: Mapping[str, Any], before: Sequence[tuple[Any, str]],
                 calls: Sequence[Any]) -> list[CallResult]:
        spec = self.spec(task)
        environment = self.environments.open(spec)
        try:
            for i, (call, shown) in enumerate(before):
                got = environment.execute(call.name, call.arguments)
                if got.text != shown:
                    raise ReplayMismatch(f"task {spec.task_id}: replaying call {i} ({call.name} {call.arguments}) "
                                         f"gave {got.text[:200]!r}, the model was shown {shown[:200]!r}")
            return [environment.execute(c.name, c.arguments) for c in calls]
        finally:
            environment.close()
