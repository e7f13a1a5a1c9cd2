"""The environment seam: what a rollout executes its calls against.

An environment is made from a task's initial state (`Environments.open(spec)`), executes one call by name with its
arguments as JSON text into the result the model is shown (`execute`), and can be rebuilt exactly at any step:
opened fresh, then the recorded calls replayed in order (`rebuild`), which must give the recorded results again
(`ReplayMismatch` when they do not: the environment is not deterministic, and its trajectory cannot be resumed).

Two implementations: `ContainedEnvironments` (contained.py: each environment in a worker process of its own, with
limits: what a run uses) and `InProcessEnvironments` (here: the same build and dispatch in the caller's process,
without limits: for trusted code, tests and tools that need no containment)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .backends import EnvironmentSpec, build_dispatcher
from .calls import Call, CallResult, Executed, replays


class Environment(Protocol):
    """One task's environment, at some step of its trajectory."""

    def execute(self, name: str, arguments: str) -> CallResult:
        """Run one call (`arguments`: the JSON text as the model wrote it); every failure is a CallResult whose text is
        what the model is shown, never an exception."""
        ...

    def close(self) -> None:
        """Release what it holds (a process); the environment is not used after."""
        ...


class Environments(Protocol):
    """Makes environments fresh from their spec (a `BuildError` when the spec cannot be built)."""

    def open(self, spec: EnvironmentSpec) -> Environment: ...


class ReplayMismatch(Exception):
    """A replayed call gave another result than the one recorded: the environment cannot be rebuilt exactly."""


def check_replayed(task_id: str, index: int, recorded: Executed, got: CallResult) -> None:
    """A replayed call must give what it gave the first time (text and kind)."""
    if got != recorded.result:
        raise ReplayMismatch(f"task {task_id}: replaying call {index} ({recorded.call.name} {recorded.call.arguments})"
                             f" gave {got.text[:200]!r} ({got.error}), recorded {recorded.result.text[:200]!r} "
                             f"({recorded.result.error})")


def replay(environment: Environment, task_id: str, executed: Sequence[Executed]) -> None:
    """Replay `executed` in order into `environment` (not those that `replays` leaves out), checking each result."""
    for i, ex in enumerate(executed):
        if replays(ex):
            check_replayed(task_id, i, ex, environment.execute(ex.call.name, ex.call.arguments))


def rebuild(environments: Environments, spec: EnvironmentSpec, executed: Sequence[Executed]) -> Environment:
    """The environment as it stood after `executed`: fresh, then replayed (a `ReplayMismatch` closes it and
    raises)."""
    environment = environments.open(spec)
    try:
        replay(environment, spec.task_id, executed)
    except BaseException:
        environment.close()
        raise
    return environment


class InProcessEnvironment:
    """An environment built and run in this process: no time or memory limit, no guard (trusted code only)."""

    def __init__(self, spec: EnvironmentSpec):
        self.spec = spec
        self.dispatcher = build_dispatcher(spec)

    def execute(self, name: str, arguments: str) -> CallResult:
        return self.dispatcher.execute(Call(name, arguments))

    def close(self) -> None:
        self.dispatcher.functions.clear()


class InProcessEnvironments:
    def open(self, spec: EnvironmentSpec) -> Environment:
        return InProcessEnvironment(spec)
