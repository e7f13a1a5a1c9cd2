"""The engine's one clock, and virtual time to run the whole engine in.

Every time the engine reads (a request's age, a retry's due time, the straggler wait, the drain) comes from one
`Clock`; the parts below the engine (dispatcher, ledger, pacing, admission) take `now` as an argument. The default
`LoopClock` is the event loop's own clock, so `asyncio.timeout_at` deadlines and the engine's readings agree.

`run_virtual(main)` runs a coroutine on an event loop whose clock is virtual and jumps (trio's `MockClock` with
`autojump_threshold=0` is the model): whenever every task is waiting on a timer, time advances at once to the
next one. A test or a bench then runs the real engine on hours of simulated answers in milliseconds, with
the same decisions in the same order every time. Work handed to threads would race the jumps: give the engine an
`InlineExecutor` there.
"""
from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock (the running loop's)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running event loop's clock: real time, or virtual time under `run_virtual`."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _JumpingSelector(selectors.DefaultSelector):
    """Never waits on a timer: polls the file descriptors, and when none is ready moves the loop's virtual clock to
    its next timer. With no timer at all it waits for real (a thread or a socket can still wake the loop)."""

    def __init__(self, loop: VirtualLoop):
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            return super().select(None)
        self._loop.virtual_time += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0):
        self.virtual_time = start
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.virtual_time


def run_virtual(main: Coroutine[Any, Any, T], start: float = 0.0) -> T:
    """`asyncio.run(main)` in virtual time."""
    with asyncio.Runner(loop_factory=lambda: VirtualLoop(start)) as runner:
        return runner.run(main)


class InlineExecutor(Executor):
    """Runs what is submitted at once, on the caller's thread (virtual time: no thread races the clock)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # the awaiting coroutine sees it, as from a thread
            future.set_exception(e)
        return future
