"""A concurrency slot: one request at a time along its path through the parts (parts.py), under the run's lock:

    take (dispatcher) → prepare (requester) → admit (ledger) → send (requester) → build the record (recorder,
    off the loop) → settle (ledger, dispatcher, recorder) → release (dispatcher)

The two awaits outside the lock are the tokenizer's thread and the service. Every decision is the parts'; this module
only waits: for work, for money, for the answer.

Slots waiting for work wait on their own condition and are woken one at a time: `take` asks the same question
whichever slot asks it, so when one finds nothing the others would too, and when one takes work it wakes the next
(a baton). Woken all at once, every tick cost a take per idle slot (in a 500-slot replay, 200 takes per request
sent). Slots waiting for money wait apart, and are woken alike (all of them at each tick: each asks for its own
bound).

Each slot says where it is as it goes (`_Slot.go`: preparing, waiting for money, in flight, recording, idle), into the
pool's meter (pool.py, the dispatcher's `pool`), so the run can tell where the slots without a request in flight were.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ...openrouter import Kind, Outcome
from ...openrouter.stream import cut_completion
from ...records import CUT
from ..clock import Clock
from ..conversations.work import Work
from ..policy import cancelled_outcome
from .attempt import Attempt
from .dispatcher import Stopped, Wait
from .parts import Parts
from .pool import ENDED, IDLE, IN_FLIGHT, MONEY, PREPARING, RECORDING, PoolMeter


@dataclass
class Slots:
    parts: Parts
    lock: asyncio.Lock  # the run's one lock: every call into the parts holds it
    clock: Clock
    failed: Callable[[Exception], Awaitable[None]]  # a bug in a slot stops the run cleanly (engine.Run._failed)

    def __post_init__(self) -> None:
        self.takers = asyncio.Condition(self.lock)  # slots waiting for work
        self.payers = asyncio.Condition(self.lock)  # slots holding work, waiting for money

    def wake(self, *, every_payer: bool = False) -> None:
        """Something changed (the caller holds the lock): one slot waiting for work asks again, and one waiting for
        money (each passes it on when it goes); `every_payer`: all of those (the ticker: readings change what fits
        for each bound); when the run is stopping, every slot."""
        if self.parts.dispatcher.stop.stopping:
            self.takers.notify_all()
            self.payers.notify_all()
            return
        self.takers.notify(1)
        self.payers.notify_all() if every_payer else self.payers.notify(1)

    async def worker(self, client: httpx.AsyncClient) -> None:
        """One concurrency slot, its own connection from `client`. A bug here stops the run cleanly (`failed`)."""
        slot = _Slot(self.parts.dispatcher.pool, self.clock)
        try:
            while (work := await self._take(slot)) is not None:
                try:
                    await self._attempt(client, work, slot)
                finally:
                    async with self.lock:
                        self.parts.dispatcher.release(work, self.clock.now())
                        self.wake()
        except Exception as e:
            await self.failed(e)
        finally:
            slot.go(ENDED)

    async def _take(self, slot: _Slot) -> Work | None:
        async with self.lock:
            while not isinstance(taken := self.parts.dispatcher.take(self.clock.now()), Work):
                if isinstance(taken, Stopped):
                    self.wake()
                    return None
                assert isinstance(taken, Wait)
                slot.go(IDLE)  # counted under the dispatcher's reason (`take` said why)
                try:
                    async with asyncio.timeout_at(taken.until):
                        await self.takers.wait()
                except TimeoutError:
                    pass
            slot.go(PREPARING)
            self.takers.notify(1)  # the baton: there may be more to take
            return taken

    async def _admit(self, work: Work, slot: _Slot | None = None) -> int | None:
        """Wait until the request's cost fits the budget (ledger.py): its ticket, or None when the money is gone, the
        run is stopping or its dataset no longer wants it (`Dispatcher.wanted`). `slot`: the slot waiting (the pool's
        meter hears of the wait; none: a test's own call, not counted)."""
        slot = slot or _Slot(None, self.clock)
        async with self.lock:
            while not self.parts.dispatcher.stop.stopping:
                if not self.parts.dispatcher.wanted(work):
                    return None  # its dataset met its target while it waited: given back, still to do
                if (ticket := self.parts.admit(work, self.clock.now())) is not None:
                    slot.go(PREPARING)
                    self.payers.notify(1)  # the baton: another may fit too
                    return ticket
                if self.parts.dispatcher.stop.stopping:
                    self.wake()
                    return None
                slot.go(MONEY)
                await self.payers.wait()
        return None

    async def _attempt(self, client: httpx.AsyncClient, work: Work, slot: _Slot) -> None:
        await self.parts.requester.prepare(work)
        if await self._admit(work, slot) is None:
            return  # still to do: the next run issues it
        attempt: Attempt = self.parts.requester.start(client, work, self.clock.now())
        work.lane.stats.in_flight += 1
        slot.go(IN_FLIGHT)
        try:
            outcome = await attempt
        except BaseException as e:  # cut off, or a bug in the transport: nothing recorded, booked as any attempt
            # (in a coroutine the current task is never None)
            ending = not isinstance(e, asyncio.CancelledError) or asyncio.current_task().cancelling()  # type: ignore[union-attr]
            if not ending and attempt.cut_reason and await self._cut(work, attempt):
                return  # closed through its handle to keep what it streamed: recorded as a cut sample
            await self._settle(work, cancelled_outcome(), None, go_on=not ending, generation_id=_named(attempt))
            if ending:
                raise
            return  # cancelled through its handle (a suspect's stream): the slot goes on, the work is sent again
        finally:
            work.lane.stats.in_flight -= 1
            slot.go(RECORDING)
        record, c = None, outcome.completion
        if outcome.kind is Kind.OK and c is not None:
            try:
                record = await self.parts.recorder.build(work, c)
            except UnicodeEncodeError:  # read and paid for, but its text has no exact ids
                spoiled = Outcome(Kind.RETRY, "untokenizable", 200, "answer text is not valid Unicode (lone surrogate)",
                                  provider=c.provider)
                return await self._settle(work, spoiled, None, cost=self.parts.requester.cost(c))
        await self._settle(work, outcome, record, generation_id=_named(attempt))

    async def _cut(self, work: Work, attempt: Attempt) -> bool:
        """A stream the run closed to keep its prefix (at its dataset's target, on Ctrl-C): recorded as a cut sample
        when what it delivered is one for sure (`openrouter.stream.cut_completion`); False: settle it as cancelled."""
        c, why = cut_completion(attempt.state) if attempt.state is not None else (None, "nothing streamed yet")
        if c is None:
            work.lane.stats.not_kept[why] += 1  # said in the summary (run.cut_samples): closed, not kept, and why
            return False
        try:
            record = await self.parts.recorder.build(work, c)
        except UnicodeEncodeError:
            return False
        record.meta["cut"] = attempt.cut_reason
        await self._settle(work, Outcome(Kind.OK, CUT, 200, completion=c), record)
        return True

    async def _settle(self, work: Work, outcome: Outcome, record: Any, cost: float | None = None, *,
                      go_on: bool = False, generation_id: str = "") -> None:
        """What the attempt came to (parts.settle), under the lock; the waiters hear of it."""
        async with self.lock:
            self.parts.settle(work, outcome, record, cost, self.clock.now(), go_on=go_on, generation_id=generation_id)
            self.wake()


class _Slot:
    """One slot's state in the pool's meter (pool.py): where it is, moved as it goes along its path."""

    def __init__(self, meter: PoolMeter | None, clock: Clock):
        self.meter, self.clock, self.state = meter, clock, PREPARING  # the meter counts every slot as starting

    def go(self, state: str) -> None:
        if self.meter is not None:
            self.meter.move(self.state, state, self.clock.now())
        self.state = state


def _named(attempt: Attempt) -> str:
    """The generation id the service gave the attempt's stream ("" for a JSON answer, or a stream not named yet)."""
    return attempt.state.generation_id if attempt.state is not None else ""
