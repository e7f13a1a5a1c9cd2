"""The generation engine: datasets' prompts → records, 2000 in flight, resumable, never over budget.

`Run` supervises the parts (parts.py; generation/README.md draws them and one request's path, take → admit → send →
settle → record): a worker per concurrency slot (none per prompt: memory stays flat however many wait), a ticker,
the signals, and one deadline for the slots (the drain's end; now, to abandon the stragglers), under structured
concurrency. Every decision is the parts', taken under one lock; one `Clock` times everything, so the whole engine
also runs in virtual time (clock.py). A kill at any instant loses at most the requests in flight.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ...aio import on_kernel_shutdown, on_signals
from ...openrouter import ClientPool, RoutingDecision, load_routing
from ...openrouter.fast_stream import FastStreams
from ...records import CUT
from ...text import load_renderer, load_tokenizer
from ..config import GenerateConfig
from ..lanes import DatasetRun, open_lanes
from ..money.spender import SpenderLock
from ..policy import REJECTED_PREFIX, StopReason, error_stop
from ..report.panel import make_progress
from ..report.progress import ProgressView, RunSnapshot
from .attempt import Transport
from .journals import FLUSH_S, Journals
from .parts import Seams, build_parts
from .salvage import keep_delivered
from .slots import Slots

log = logging.getLogger("eagledata.generate")

ViewFactory = Callable[[RunSnapshot], ProgressView]  # what shows a run, from its first snapshot
TICK_S = 0.5  # progress, re-estimating the requests in flight, closing congestion windows
CUT_TICK_S = 0.05  # a cut due before the next tick is looked at when it comes, no sooner than this after the last
FINISH_BEFORE_CUT_S = 3.0  # after a Ctrl-C, or once every target is met, streams billed whole anyway get this long
                           # to end before they are cut too
READ_BACK_END_S = 3.0  # at a run's end (not a Ctrl-C's), the streams closed last get this long to be read back


class Run:
    """One run over one or several datasets on one pool of slots. `await Run.start(cfg, client)`, then `execute`."""

    def __init__(self, cfg: GenerateConfig, lanes: list[DatasetRun], routing: RoutingDecision, seams: Seams, tok: Any):
        self.cfg, self.seams, self.clock = cfg, seams, seams.clock
        self.idle = all(lane.idle for lane in lanes)  # nothing to send: answered from the checkpoints, no request
        parts = build_parts(cfg, lanes, routing, tok, seams, self.clock.now())
        self.parts, self.dispatcher, self.ledger, self.reporter = parts, parts.dispatcher, parts.ledger, parts.reporter
        self.lock = asyncio.Lock()
        self.slots = Slots(parts, self.lock, self.clock, self._failed)
        self.error: Exception | None = None  # the internal error that stopped the run (summaries say it)
        self.progress: ProgressView | None = None
        self._scope: asyncio.Timeout | None = None  # the slots' deadline: the drain's end, or now to abandon them
        self._cut_at: float | None = None
        self._signals = 0
        self._finishing = False  # the slots have ended: what is left is writing the summaries
        self._waking: asyncio.Future | None = None
        self._account: asyncio.Future | None = None  # an account reading under way (`_reading`)
        self._closing: asyncio.Future | None = None  # after a Ctrl-C or the targets: the streams billed whole, cut soon
        self._ended = asyncio.Event()  # every summary written (what a kernel shutting down waits for)
        # streams journaled as they start, so that the run after a kill can read what they cost (killed.py)
        self.journals = Journals(lanes) if self.parts.requester.stream and self.ledger.paid else None
        if self.journals is not None:
            self.parts.requester.streams.on_named = self.journals.named
            self.parts.requester.streams.on_end = self.journals.ended

    @classmethod
    async def start(cls, cfg: GenerateConfig, client: httpx.AsyncClient, *, api_key: str | None = None,
                    seams: Seams | None = None) -> Run:
        """Open every dataset's store and validate every prompt before any request; take the account's spender lock
        and its first reading when there is something to send."""
        seams = seams or Seams()
        # the chat template's renderer imported on a thread meanwhile (~1-1.5 s of transformers' import, else inside
        # the first prompt, while every slot waits for it: issue 60's ramp)
        renderer = asyncio.get_running_loop().run_in_executor(seams.executor, load_renderer)
        lanes, run = open_lanes(cfg), None  # every bad line named first
        try:
            routing = seams.routing or (RoutingDecision(model=cfg.model) if cfg.backend == "local" else await
                                        load_routing(cfg.model, params_dir=cfg.params_dir, base_url=cfg.base_url,
                                                     api_key_env=cfg.api_key_env))
            run = cls(cfg, lanes, routing, seams, load_tokenizer(cfg.tokenizer))
            if run.ledger.paid and not run.idle:
                run.ledger.spender = SpenderLock.acquire(cfg.base_url, api_key, describe={
                    "datasets": [lane.name for lane in lanes], "output_dir": str(Path(cfg.output_dir).resolve())})
                await run.ledger.read(client, run.clock.now(), strict=True)
            if run.journals is not None:  # what killed runs' streams cost, and what they had delivered, kept
                recorder, requester = run.parts.recorder, run.parts.requester

                def cost_of(provider: str, prompt: int, output: int) -> float:
                    return requester.price_by_provider.get(provider, requester.worst).cost(prompt, output)

                await run.journals.read_killed(client, keep=lambda lane, delivered, killed: keep_delivered(
                    lane, delivered, killed, recorder, cost_of, requester.tool_results.complete))
                if (first := run.ledger.books.first) is not None and first.usage_usd is not None:
                    run.ledger.killed_wasted_usd = run.journals.begin(first.usage_usd)
            await renderer
        except BaseException:
            if run is not None:
                run.close()
            else:
                for lane in lanes:
                    lane.store.close()
            raise
        return run

    def close(self) -> None:
        for lane in self.dispatcher.lanes.values():
            lane.store.close()
        self.ledger.close()

    async def execute(self, clients: ClientPool | list[httpx.AsyncClient], view: ViewFactory | None = None) -> dict:
        """Run to the end; every dataset's summary.json is written, and the run's summary returned (one dataset
        named alone: that dataset's summary). `view` makes what shows the run (else `cfg.progress` decides)."""
        now = self.clock.now()
        if view is not None or self.cfg.progress:
            snap = self.reporter.snapshot(now)
            self.progress = view(snap) if view else make_progress(snap, interval_s=self.cfg.status_interval_s,
                                                                       clock=self.clock.now)
        restore, cancelled = on_signals(self._on_signal), None
        unhook = on_kernel_shutdown(self._kernel_shutdown)
        try:
            async with asyncio.TaskGroup() as tg:
                ticker = tg.create_task(self._ticker(clients[0]))
                reading = tg.create_task(self._reading_back(clients[0])) if self.ledger.readback else None
                try:
                    async with asyncio.timeout_at(self._cut_at) as self._scope:
                        async with asyncio.TaskGroup() as slots:
                            for i in range(self.cfg.concurrency):
                                slots.create_task(self.slots.worker(clients[i]))
                except TimeoutError:
                    pass  # what was in flight is abandoned: cancelled, booked, still to do
                finally:
                    self._scope = None
                    self.reporter.slots_end = self.clock.now()
                    for task in (ticker, reading, self._account):
                        if task is not None:
                            task.cancel()
        except asyncio.CancelledError as e:  # the caller cancelled us: raised once the summaries are written
            self.dispatcher.stop.set(StopReason.INTERRUPTED)
            cancelled = e
        finally:  # a signal from here on only cuts short the wait for the last closed streams' costs (the handlers
            # stay until every summary is written: a Ctrl-C must not stop the run from writing them)
            self._finishing = True
            if cancelled is None and self.dispatcher.stop.reason != StopReason.INTERRUPTED:
                await self._read_back_the_last(clients[0])
            if self.ledger.paid and not self.idle:  # the account after the last answer: what the run was charged
                await self.ledger.read(clients[0], self.clock.now())
            if self.journals is not None:
                await self.journals.read_killed(clients[0], again=True)
            for lane in self.dispatcher.lanes.values():
                if not lane.finished:
                    lane.stop_reason = self.dispatcher.stop.reason or StopReason.COMPLETED
            if self._signals:
                self._say_what_was_kept()
            self.reporter.sample(self.clock.now(), final=True)
            if self.seams.executor is None:
                self.parts.executor.shutdown(wait=True)
            self.parts.requester.tool_results.close()
            for lane in self.dispatcher.lanes.values():
                lane.store.sync()
        summary = None
        try:  # every dataset's summary.json, then the run's
            per, summary = self.reporter.summaries(self.clock.now())
            for lane in self.dispatcher.lanes.values():
                lane.store.write_summary(per[lane.name])
            if self.journals is not None:
                self.journals.summarized()
        finally:
            if self.progress is not None:  # the last frame: the report's figure, drawn from the summary
                self.progress.close(self.reporter.snapshot(self.clock.now(), final=True), summary)
            unhook()
            restore()
            self._ended.set()
        if cancelled is not None:
            raise cancelled
        return summary

    def _cut(self, at: float) -> None:
        """The slots end at `at` (or sooner, if so set): what is still in flight then is cancelled."""
        self._cut_at = at if self._cut_at is None else min(self._cut_at, at)
        if self._scope is not None:
            self._scope.reschedule(self._cut_at)

    def _on_signal(self) -> None:
        """First signal: stop issuing; the streams whose endpoint stops billing when closed are closed at once (with
        `at_target: cut` kept as cut samples, else their prompts stay to do); with `at_target: cut` the other streams
        get FINISH_BEFORE_CUT_S, then are cut too; what else is in flight finishes, up to drain_timeout_s.
        A second: abandon them. Once the slots have ended, a signal only cuts short the wait for the last closed
        streams' costs: the summaries are written whatever is pressed."""
        self._signals += 1
        if self._finishing:
            return
        if self._signals > 1:
            return self._cut(self.clock.now())
        self.dispatcher.stop.set(StopReason.INTERRUPTED)
        cut = StopReason.INTERRUPTED if self.cfg.at_target == "cut" else None
        if closed := self.parts.requester.streams.cancel_streams_that_stop_billing(cut=cut):
            log.warning("generation: interrupted: %d stream(s) closed at once (their endpoints stop billing when a "
                        "stream is closed; %s); %s", closed,
                        "each kept as a cut sample where what it streamed is one" if cut else "the prompts stay to do",
                        f"the rest get {FINISH_BEFORE_CUT_S:g} s to end, then are cut too" if cut else
                        "the rest finish, up to drain_timeout_s")
        if cut and self.parts.requester.streams:
            self._closing = asyncio.ensure_future(self._cut_the_rest(StopReason.INTERRUPTED))
        self._drain()

    def _say_what_was_kept(self) -> None:
        """After a Ctrl-C: how many of the streams the run closed were kept as cut samples, and why not the others
        (nothing streamed yet, an error, reasoning served as content): the run's summary has the same counts."""
        kept = sum(lane.stats.finish[CUT] for lane in self.dispatcher.lanes.values())
        lost: Counter[str] = Counter()
        for lane in self.dispatcher.lanes.values():
            lost.update(lane.stats.not_kept)
        if kept or lost:
            why = ", ".join(f"{n} {reason}" for reason, n in lost.most_common())
            log.warning("generation: interrupted: %d cut sample(s) kept this run (their turns are asked again by the "
                        "next run)%s", kept,
                        f"; {sum(lost.values())} closed stream(s) not kept, their prompts still to do ({why})"
                        if lost else "")

    async def _cut_the_rest(self, reason: str) -> None:
        """After a Ctrl-C (`reason` interrupted), or once every target is met (target_reached), the streams on
        endpoints that bill whole answers get FINISH_BEFORE_CUT_S to end, then are cut too, kept as far as they got:
        control comes back in seconds, not an answer's time. The rest of their answers is billed anyway (the drain
        would have abandoned them, paid for and not kept, at drain_timeout_s). At the targets they are tokens past a
        target already met: the job's stragglers were answers of 100-200 s on such an endpoint, started before their
        datasets neared their cuts, that held the run's end ~20 s (issue 53); what they still owed was no token the
        targets asked for."""
        await self.clock.sleep(FINISH_BEFORE_CUT_S)
        if closed := self.parts.requester.streams.cut_every_stream(reason):
            log.warning("generation: %s: %d stream(s) on endpoints that bill whole answers cut after %g s, each kept "
                        "as a cut sample where what it streamed is one", "interrupted" if reason ==
                        StopReason.INTERRUPTED else "every target met", closed, FINISH_BEFORE_CUT_S)

    async def _kernel_shutdown(self) -> None:
        """The kernel is shutting down (papermill's Ctrl-C): stop as a second Ctrl-C does, and return once every
        summary is written."""
        self.dispatcher.stop.set(StopReason.INTERRUPTED)
        self.parts.requester.streams.cancel_streams_that_stop_billing()
        self._cut(self.clock.now())
        await self._ended.wait()

    def _drain(self) -> None:
        """Stop issuing; the requests in flight get `drain_timeout_s` to come back."""
        self._cut(self.clock.now() + self.cfg.drain_timeout_s)
        self._waking = asyncio.ensure_future(self._notify_all())

    async def _notify_all(self) -> None:
        async with self.lock:
            self.slots.wake()

    async def _failed(self, error: Exception) -> None:
        """A bug stopped one slot (or the ticker): stop as a first Ctrl-C does (the answers in flight are recorded as
        they come, up to `drain_timeout_s`; the work in the slot's hands stays to do), and name the error."""
        if self.error is None:
            self.error = error
            log.error("generation: stopping the run on an internal error (every prompt stays recorded, failed or "
                      "resumable)", exc_info=error)
        else:
            log.error("generation: another slot stopped on %s: %s", type(error).__name__, error)
        self.dispatcher.stop.set(error_stop(error))
        self._drain()

    async def _ticker(self, client: httpx.AsyncClient) -> None:
        wait, journal_due = TICK_S, self.clock.now() + FLUSH_S
        try:
            while True:
                await self.clock.sleep(wait)
                if (self._account is None or self._account.done()) and self.ledger.reading_due(self.clock.now()):
                    self._account = asyncio.ensure_future(self._reading(client))  # not waited for (`_reading`)
                async with self.lock:  # periodic wake-up: no waiter can sleep through a state change
                    now = self.clock.now()
                    if self.journals is not None and now >= journal_due:  # what the streams delivered, kept
                        self.journals.flush(self.parts.requester.streams.streaming)
                        journal_due = now + FLUSH_S
                    self.ledger.tick(now)
                    wait = min(TICK_S, max(CUT_TICK_S, self.parts.tick(now)))  # sooner when a cut is due
                    self.reporter.sample(now)
                    if self.progress is not None:
                        self.progress.update(self.reporter.snapshot(now))
                    self._stragglers(now)
                    self.slots.wake(every_payer=True)
        except Exception as e:  # the estimators, the books, the progress view: a bug stops the run cleanly
            await self._failed(e)

    async def _reading(self, client: httpx.AsyncClient) -> None:
        """One account reading, started by the ticker when one is due (every `account_refresh_s`, and at once when
        admission waits on one) and not waited for: a reading is a round trip to the service (1-4.5 s in the job bench
        on a loaded machine, 46.6 s once), and the ticker's pacing, cuts and wake-ups must not wait for it (issue 60:
        no tick for 38-83 s from the run's fifth second, under load). The slots waiting for money hear of it."""
        try:
            await self.ledger.read(client, self.clock.now())
            async with self.lock:  # what it settled may let the slots waiting for money go
                self.slots.payers.notify_all()
        except Exception as e:  # the books: a bug stops the run cleanly
            await self._failed(e)

    async def _reading_back(self, client: httpx.AsyncClient) -> None:
        """What the streams booked at their bound cost, read by id as the service settles them (readback.py)."""
        try:
            while True:
                await self.clock.sleep(TICK_S)
                await self.ledger.read_back(client, self.clock.now())
        except Exception as e:
            await self._failed(e)

    async def _read_back_the_last(self, client: httpx.AsyncClient) -> None:
        """The streams closed last (at a target's cut, by the stragglers' end) are asked for until READ_BACK_END_S has
        passed; what the service does not know by then stays at its bound for the account's reading to settle."""
        if (readback := self.ledger.readback) is None:
            return
        end, signals = self.clock.now() + READ_BACK_END_S, self._signals
        while readback.pending and self.clock.now() < end and self._signals == signals:
            await self.ledger.read_back(client, self.clock.now(), every=True)
            if readback.pending:
                await self.clock.sleep(TICK_S)

    def _stragglers(self, now: float) -> None:
        """Every target is met: with `at_target: cut` the streams billed whole still in flight are cut after
        FINISH_BEFORE_CUT_S (`_cut_the_rest`). Issuing is over and answers are still in flight past
        `straggler_wait_s`: the run ends without them."""
        if self.cfg.at_target == "cut" and self._closing is None and self.parts.requester.streams \
                and not self.dispatcher.stop.stopping and self.dispatcher.only_stragglers():
            self._closing = asyncio.ensure_future(self._cut_the_rest(StopReason.TARGET_REACHED))
        when = self.dispatcher.straggler_deadline(now, self.cfg.straggler_wait_s)
        if when is not None and now >= when and self._cut_at is None:
            for lane in self.dispatcher.lanes.values():
                lane.stats.abandoned = lane.holding
            self.dispatcher.stop.set(StopReason.TARGET_REACHED)  # a money stop keeps its reason: the first stop wins
            self._cut(now)


async def run_realtime(cfg: GenerateConfig, key: str | None, seams: Seams | None, transport: Transport | None,
                       view: ViewFactory | None) -> dict[str, Any]:
    """The realtime route with the key already resolved (run.py chooses the route and the service)."""
    seams = seams or (Seams(transport=transport) if transport else Seams())
    async with ClientPool(cfg.base_url, key, concurrency=cfg.concurrency, timeout=cfg.request_timeout_s) as clients, \
            FastStreams() as fast:  # the streams' connections, closed with the pool's
        if seams.fast_streams is None:
            seams = dataclasses.replace(seams, fast_streams=fast)
        run = await Run.start(cfg, clients[0], api_key=key, seams=seams)
        try:
            summary = await run.execute(clients, view)
        finally:
            run.close()
    if (fatal := run.dispatcher.stop.fatal) is not None:
        reason = summary["stop_reason"]
        if reason.startswith(REJECTED_PREFIX):  # it quotes the message already
            raise RuntimeError(f"generation stopped: {reason} (the same answer for many different prompts: a setting "
                               "of the run, not the prompts; none was written to failures.jsonl, so a run with the "
                               "setting fixed sends them)")
        raise RuntimeError(f"generation stopped: {reason}: {fatal.message}")
    return summary
