"""The batch route (`route: batch`): the datasets' prompts through a batch API in rounds, into the same records.

Each dataset has at most one batch in progress. A round holds every turn that can be sent now: the next turns of
conversations whose earlier answers are recorded (turn j of a conversation goes in its j-th round), the lines to
send again, and new conversations as many as its target still needs (rounds.py and plan.py: the budget's estimate first,
then a round that reaches the target with 90 % probability, so that a dataset takes the rounds budget.ipynb planned:
its deepest conversation's turns plus one). Its answers are recorded as the realtime route records them (the
same recorder: exact ids, the count check, the fidelity judge, failures.jsonl), with the batch's answer id as
`generation_id` and the batch service as `provider`.

Money: every line's worst case at the batch price is booked when its batch is submitted, against `max_spend_usd` and
the balance (read from the service before every round) less `reserve_usd`; its answer's cost replaces the booking
when it comes. So the account is never charged past either, whatever the answers.

Resume: the journal (journal.py, kept by service.py) is written before each call that creates something, so a rerun
adopts every batch a killed run left (matching an upload or a batch it never journaled by name), records their
answers and goes on; a line is sent again only when its earlier line failed, expired or was cancelled. A journaled
batch the service answers 404 for (expired from its records, deleted, another account) is settled as `vanished` and
its lines not recorded go again: it never blocks a dataset. Ctrl-C leaves the batches running (a rerun of the same
command picks them up), or cancels them with `batch_cancel_on_stop` (always with `base_url: emulator`, whose
emulator stops with the run).
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from ...aio import on_kernel_shutdown, on_signals
from ...defaults import is_emulator
from ...errors import InputError
from ...moonshot.batch_api import (
    BatchApiError,
    BatchInfo,
    MoonshotBatches,
    batch_line,
    jsonl,
    make_batch_client,
    resolve_batch_key,
)
from ...moonshot.facts import batch_model, tokenizer_release, window_hours
from ...openrouter import RoutingDecision
from ...openrouter.client import LOCAL_KEY
from ...paths import model_stem
from ...status import ensure_log_handler
from ...text import Tokenizer, load_tokenizer, prompt_ids
from ..clock import InlineExecutor, LoopClock
from ..config import GenerateConfig
from ..conversations.datasets import select_datasets
from ..conversations.fidelity import FidelityJudge
from ..conversations.recorder import Recorder
from ..conversations.turns import Conversation
from ..lanes import DatasetRun, open_lanes
from ..money.spender import SpenderLock
from ..plan.budget import OutputLengths
from ..policy import StopReason, error_stop, fatal_stop
from ..report.panel import BatchPanel, make_batch_panel
from .journal import BatchJournal, JournalLine, LineOutcome
from .plan import TurnLengths, fits
from .report import BatchProgress, BatchShown, sample, write_summaries
from .rounds import Rounds
from .service import VANISHED, BatchCalls, BatchService
from .settle import Settler
from .state import LaneBatches, RoundInfo, messages_sha

log = logging.getLogger("eagledata.generate")


class BatchRun:
    """One run of the batch route over one or several datasets on one account: the loop that submits each dataset's
    next round (rounds.py plans it, service.py sends it), polls it and settles it (settle.py), under the money."""

    def __init__(self, cfg: GenerateConfig, lanes: list[DatasetRun], service: BatchService, tok: Tokenizer, *,
                 sleep: Any = asyncio.sleep, clock: Callable[[], float] | None = None,
                 panel: Callable[[], BatchPanel | None] = make_batch_panel):
        # `clock`: the running loop's by default, the one the waits between polls time out on (clock.run_virtual
        # makes it virtual); `panel`: what shows the run under a widget frontend when `cfg.progress` is set
        self.cfg, self.service, self.tok, self.sleep = cfg, service, tok, sleep
        self.max_spend_usd, self.reserve_usd = cfg.max_spend_usd, cfg.reserve_usd  # the money's limits: the run's
        self.shown = BatchShown(cfg.batch_model, cfg.batch_base_url, cfg.batch_window, cfg.max_tokens, cfg.turns)
        self.clock: Callable[[], float] = clock or LoopClock().now
        self.make_panel = panel
        self.t0, self.started_at = self.clock(), datetime.now(UTC).isoformat(timespec="seconds")
        self.judge = FidelityJudge.carried([lane.summary_before for lane in lanes if lane.summary_before])
        recorder = Recorder(tok, InlineExecutor(), self.judge, RoutingDecision(model=cfg.batch_model),
                            temperature=None, paid=True)
        self.lanes = [LaneBatches(lane, BatchJournal(lane.store.files.directory / "batches.jsonl"))
                      for lane in lanes]
        guess = OutputLengths.lognormal(cfg.prior_output_median_tokens, cfg.prior_output_sigma, cfg.max_tokens)
        self.rounds = Rounds(TurnLengths(guess.mean, guess.sd), cfg.batch_first_round)
        self.calls = BatchCalls(service, window=cfg.batch_window, max_tokens=cfg.max_tokens)
        self.settler = Settler(tok, recorder, service, self.rounds, max_attempts=cfg.max_attempts, stop=self._fail)
        self.balance_start: float | None = None
        self.timeline: list[list[float]] = []  # the run's own samples (each dataset keeps its own: report.sample)
        self.balance_end: float | None = None
        self.stop_reason: str = ""
        self.fatal: dict[str, Any] | None = None
        self.panel: BatchPanel | None = None
        self.window_s = 3600.0 * window_hours(cfg.batch_window)
        self.progress = BatchProgress(None, cfg.status_interval_s, self.clock)
        self._wake = asyncio.Event()
        self._changed = False
        self._ended = asyncio.Event()

    # -- money -------------------------------------------------------------------------------------------------
    @property
    def spent(self) -> float:
        return sum(lb.usd for lb in self.lanes)

    @property
    def booked(self) -> float:
        """The worst cases of every line in progress."""
        return sum(lb.entry.bound_usd for lb in self.lanes if lb.entry is not None)

    async def room(self) -> tuple[float, str]:
        """What one more batch may book, and the stop reason when it is what limits: under `max_spend_usd` (this
        run's answers + every booking), and under the balance just read less the reserve and the bookings (the
        service charges a line when it is answered, so the balance may already hold part of them: counted twice,
        never overdrawn)."""
        balance = await self.service.balance()
        by_balance = balance - self.reserve_usd - self.booked
        if self.max_spend_usd is None:
            return by_balance, StopReason.BALANCE_RESERVE_REACHED
        by_cap = self.max_spend_usd - self.spent - self.booked
        return (by_cap, StopReason.MAX_SPEND_REACHED) if by_cap < by_balance else \
            (by_balance, StopReason.BALANCE_RESERVE_REACHED)

    # -- rounds ------------------------------------------------------------------------------------------------
    def _resume(self, lb: LaneBatches) -> None:
        """A rerun: the open conversations (recorded turns, not finished) and the batch a killed run left."""
        pending = lb.journal.pending
        if len(pending) > 1:
            raise InputError(f"{len(pending)} batches in progress for one dataset; the route keeps one",
                             lb.journal.path)
        entry = pending[0] if pending else None
        for work in self.rounds.resume(lb, entry):
            assert entry is not None
            line = entry.lines[work.turn.id]
            self.calls.as_sent(work)
            work.prompt_ids = prompt_ids(self.tok, work.turn.messages, tools=work.turn.conversation.tools)
            work.bound = line.bound_usd
            if messages_sha(work.turn.messages) != line.sha:
                raise InputError(f"conversation {work.turn.conversation.id!r}: the batch in progress was sent other "
                                 "messages than its prompt and records make now (was the prompt file changed?)",
                                 lb.journal.path)
            lb.in_flight[work.turn.id] = work
        if entry is not None:
            lb.entry = entry
            lb.info = RoundInfo(lb.lane.name, entry.round, entry.name, len(entry.lines), entry.batch_id,
                                entry.status, booked_usd=entry.bound_usd, started=self.clock() - self.t0,
                                window_end=entry.submitted_at + self.window_s if entry.submitted_at else None)
            lb.rounds.append(lb.info)

    async def _submit(self, lb: LaneBatches, room: float, why: str = "") -> bool | None:
        """Plan and submit the dataset's next round within `room` dollars (`why`: the limit that leaves it): True
        when submitted, False when not one line of it fits, None when it has nothing to send."""
        works = self.rounds.plan(lb)
        if not works:
            return None
        for w in works:
            self.calls.as_sent(w)
            if w.prompt_ids is None:
                w.prompt_ids = prompt_ids(self.tok, w.turn.messages, tools=w.turn.conversation.tools)
            w.bound = self.service.price.cost(len(w.prompt_ids), self.cfg.max_tokens)
        bodies = [batch_line(w.turn.id, self.calls.body(w)) for w in works]
        sizes = [len(jsonl([b])) for b in bodies]
        n = fits([w.bound for w in works], 0.0, room)
        if n == 0:
            log.warning("batch route: %s: its next line's worst case ($%.4f: %s output tokens, max_tokens) does not "
                        "fit the $%.4f the money leaves (%s): the run stops there", lb.lane.name, works[0].bound,
                        f"{self.cfg.max_tokens:,}", max(room, 0.0), why)
            return False
        n = min(n, fits([float(x) for x in sizes], 0.0, float(self.service.max_file_bytes)))  # one file holds a round
        if n == 0:
            raise InputError(f"conversation {works[0].turn.conversation.id!r}: its line ({sizes[0]:,} bytes) is over "
                             f"the Batch API's input file limit ({self.service.max_file_bytes:,} bytes)",
                             lb.lane.scan.path)
        sent = self.rounds.take(lb, works, n)
        round_ = lb.journal.rounds + 1
        name = f"eagledata-{lb.lane.name}-r{round_:03d}-{secrets.token_hex(3)}"
        lines = []
        for w in sent:
            w.tries += 1
            lines.append(JournalLine(w.turn.id, w.turn.conversation.id, w.turn.number, w.tries, w.bound,
                                     len(w.prompt_ids or ()), messages_sha(w.turn.messages)))
        lb.in_flight = {w.turn.id: w for w in sent}
        # this round's row before the calls: adopt() writes the batch id into lb.info (the last round's otherwise)
        at = time.time()
        lb.info = RoundInfo(lb.lane.name, round_, name, len(sent), booked_usd=sum(w.bound for w in sent),
                            started=self.clock() - self.t0, window_end=at + self.window_s)
        lb.rounds.append(lb.info)
        entry = await self.calls.submit(lb, name, round_, jsonl(bodies[:n]), lines, at,
                                        lb.planned_rounds if lb.journal.planned_rounds is None else None)
        self._changed = True
        log.info("batch route: %s round %d of %d planned: %d lines submitted (%d new conversations), $%.4f booked "
                 "(batch %s)", lb.lane.name, round_, lb.planned_rounds, len(sent), sum(w.source == "new" for w in sent),
                 entry.bound_usd, entry.batch_id)
        if round_ == lb.planned_rounds + 1:
            log.warning("batch route: %s goes past the %d rounds planned (round %d): the conversations sent fell "
                        "short of the target, or the money held part of a round back", lb.lane.name,
                        lb.planned_rounds, round_)
        return True

    # -- answers -----------------------------------------------------------------------------------------------
    async def _poll(self, lb: LaneBatches) -> None:
        assert lb.info is not None
        try:
            info = await self.calls.status(lb)
            lb.info.status, lb.info.answered, lb.info.failed = info.status, info.completed, info.failed
            lb.info.waited_s = self.clock() - self.t0 - lb.info.started
            if info.expires_at:  # the service's own end of the window (an emulator's is scaled by its speed)
                lb.info.window_end = float(info.expires_at)
            if info.terminal:
                await self._settle(lb, info)
        except BatchApiError as e:
            if e.status != 404:
                raise
            await self._vanished(lb, e)

    async def _vanished(self, lb: LaneBatches, error: BatchApiError) -> None:
        """The service no longer knows the batch (or its results): expired from its records, deleted, another
        account's key, an emulator that stopped with its run. It must not block the dataset: its lines not recorded
        go again in the next round, journaled as settled with the batch status `vanished` (outcome `resend`)."""
        assert lb.entry is not None
        lines = len(lb.entry.lines) - sum(cid in lb.lane.store.done for cid in lb.entry.lines)
        log.warning("batch route: %s round %d: the service does not know batch %s any more (%s); its %d line(s) not "
                    "recorded go again in the next round", lb.lane.name, lb.entry.round, lb.entry.batch_id,
                    error.message, lines)
        await self._settle(lb, BatchInfo(str(lb.entry.batch_id or ""), VANISHED))

    async def _settle(self, lb: LaneBatches, info: BatchInfo) -> None:
        """Record a finished batch's answers; its failed lines go into the next round (up to max_attempts)."""
        entry, lane = lb.entry, lb.lane
        assert entry is not None and lb.info is not None
        results = await self.calls.results(info)
        latency = self.clock() - self.t0 - lb.info.started
        if info.status == "failed":  # the service refused the file: a setting of the run, not of its prompts
            self._fail(fatal_stop("batch_rejected"), {
                "class": "batch_rejected", "status": None,
                "message": "; ".join(f"line {e.get('line')}: {e.get('message')}" for e in info.errors)[:500]})
            outcomes: dict[str, LineOutcome] = dict.fromkeys(entry.lines, "resend")
        else:
            outcomes = self.settler.outcomes(lb, entry, results, latency)
        lb.info.status = info.status
        lb.info.answered = sum(o == "recorded" for o in outcomes.values())
        lb.info.failed = sum(o in ("retry", "failed") for o in outcomes.values())
        lb.info.waited_s = latency
        lb.journal.settled(entry.name, outcomes, lb.info.usd, info.status)
        await self.calls.forget_input(entry)
        for cid, o in outcomes.items():
            if o in ("retry", "resend"):
                lb.ready.append(lb.in_flight[cid])
        lb.entry, lb.in_flight = None, {}
        if lane.target is not None and lane.target_met and lane.target_met_s is None:
            lane.target_met_s = self.clock() - self.t0
        if self.service.provider in self.judge.suspects:
            self._stop(StopReason.NO_FAITHFUL_PROVIDERS)
        self._changed = True
        log.info("batch route: %s round %d %s: %d recorded, %d to send again, %d failed for good, $%.4f",
                 lane.name, entry.round, info.status, lb.info.answered,
                 sum(o in ("retry", "resend") for o in outcomes.values()),
                 sum(o == "failed" for o in outcomes.values()), lb.info.usd)

    # -- the run -----------------------------------------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        if not self.stop_reason:
            self.stop_reason = reason
        self._wake.set()

    def _fail(self, reason: str, fatal: dict[str, Any] | None) -> None:
        """A run-wide outcome (settle.py): the run stops for `reason`; the first fatal error is the one reported."""
        self.fatal = self.fatal or fatal
        self._stop(reason)

    def _lane_done(self, lb: LaneBatches) -> bool:
        lane = lb.lane
        if lb.entry is not None:
            return False
        if lane.target is not None and lane.target_met:
            lane.stop_reason = lane.stop_reason or StopReason.TARGET_REACHED
            return True
        if not lb.ready and not lb.unstarted and lane.exhausted:
            lane.stop_reason = lane.stop_reason or (StopReason.ALL_FAILED if lane.all_failed
                                                    else StopReason.COMPLETED)
            return True
        return False

    async def execute(self) -> dict[str, Any]:
        """Run to the end (every dataset finished, the money, a signal, a fatal answer); every summary.json is
        written whatever stopped it, an error included (then raised, its stop reason naming it)."""
        self.panel = self.make_panel() if self.cfg.progress else None
        self.progress = BatchProgress(self.panel, self.cfg.status_interval_s, self.clock)
        restore = on_signals(lambda: self._stop(StopReason.INTERRUPTED))
        unhook, ended = on_kernel_shutdown(self._kernel_shutdown), self._ended
        try:
            await self._loop()
        except Exception as e:
            self._stop(error_stop(e))
            raise
        finally:
            restore()
            try:
                await self._end()
            finally:
                summary = write_summaries(self)
                unhook()
                ended.set()
        return summary

    async def _kernel_shutdown(self) -> None:
        """The kernel is shutting down (papermill's Ctrl-C): stop as Ctrl-C does (the batches left running), and
        return once the summaries are written."""
        self._stop(StopReason.INTERRUPTED)
        await self._ended.wait()

    async def _loop(self) -> None:
        self.balance_start = await self.service.balance()
        for lb in self.lanes:
            lb.planned_rounds = self.rounds.planned_rounds(lb)
            self._resume(lb)
            await self.calls.adopt(lb)
        sample(self)
        poll = self.cfg.batch_poll_s
        while not self.stop_reason:
            for lb in self.lanes:
                if lb.entry is not None:
                    await self._poll(lb)
            if self.stop_reason:
                break
            money_stop = ""
            for lb in self.lanes:
                if lb.entry is None and not self._lane_done(lb) and not self.stop_reason:
                    room, why = await self.room()
                    if await self._submit(lb, room, why) is False:
                        money_stop = why
            waiting = [lb for lb in self.lanes if lb.entry is not None]
            if not waiting:
                if money_stop:
                    self._stop(money_stop)
                elif all(self._lane_done(lb) for lb in self.lanes):
                    if all(lb.lane.stop_reason == StopReason.TARGET_REACHED for lb in self.lanes):
                        self.stop_reason = StopReason.TARGET_REACHED
                    break
            sample(self)
            if self._changed:  # a round submitted or settled: shown at once
                self.progress.show(self)
                self._changed = False
            else:
                self.progress.maybe(self)
            await self._wait(poll)

    async def _wait(self, poll: float) -> None:
        """Until the next poll (or a stop), the status shown every `status_interval_s` meanwhile."""
        self._wake.clear()
        next_poll = self.clock() + poll
        while not self._wake.is_set() and (left := next_poll - self.clock()) > 0:
            step = min(left, max(self.progress.next_in(), 0.01))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=step)
            except TimeoutError:
                pass
            self.progress.maybe(self)
            if step == left:  # the poll's time has come: a timer may fire up to the loop's clock resolution early,
                break         # and under virtual time (clock.run_virtual) the clock then never gets past it

    async def _end(self) -> None:
        """Ctrl-C (or a stop): the batches in progress are left running (a rerun adopts them), or cancelled and
        their answered lines recorded (`batch_cancel_on_stop`); the balance is read once more."""
        waiting = [lb for lb in self.lanes if lb.entry is not None and lb.entry.batch_id]
        if waiting and self.cfg.batch_cancel_on_stop:
            for lb in waiting:
                try:
                    await self.calls.cancel(lb)
                except BatchApiError as e:  # gone (404), or ended meanwhile: the next poll settles what it is
                    log.warning("batch route: %s: cancelling batch %s: %s", lb.lane.name,
                                lb.entry.batch_id if lb.entry else None, e)
            while any(lb.entry is not None for lb in waiting):
                for lb in waiting:
                    if lb.entry is not None:
                        await self._poll(lb)
                await self.sleep(min(self.cfg.batch_poll_s, 5.0))
        elif waiting:
            log.warning("batch route: %d batch(es) left running at the service (%s); rerun the same command to "
                        "record their answers and go on", len(waiting),
                        ", ".join(str(lb.entry.batch_id) for lb in waiting if lb.entry))
        for lb in self.lanes:
            if not lb.lane.stop_reason:
                lb.lane.stop_reason = self.stop_reason or StopReason.COMPLETED
            lb.lane.store.sync()
        sample(self)
        self.progress.show(self)
        try:
            self.balance_end = await self.service.balance()
        except Exception as e:  # the summaries are still written
            log.warning("batch route: the balance could not be read at the end: %s", e)


async def run_batch_route(cfg: GenerateConfig, *, transport: httpx.AsyncBaseTransport | None = None,
                          sleep: Any = asyncio.sleep, clock: Callable[[], float] | None = None,
                          panel: Callable[[], BatchPanel | None] = make_batch_panel) -> dict[str, Any]:
    """`route: batch`: every input checked (the key, the model and the window, every prompt) before anything is
    uploaded; returns the summary as `run_generation` does. `base_url: emulator`: the emulator's Batch API, started
    for the run (`batch_poll_s` × `emulator_speed`; a stop cancels its batches, as the emulator stops with the run).
    `transport`: the HTTP transport to the service (tests); `clock` and `panel`: BatchRun's (tests: virtual time, a
    panel of their own)."""
    ensure_log_handler()  # the rounds and the status lines, wherever the service is
    if is_emulator(cfg.base_url):
        from ...emulator_process import serving

        specs = select_datasets(cfg.datasets_file, cfg.dataset)
        async with serving(cfg.base_url, speed=cfg.emulator_speed, tool_datasets=[s.prompts for s in specs]) as url:
            url = url.removesuffix("/api/v1") + "/moonshot/v1"
            log.info(f"base_url emulator: the emulator's Batch API at {url} for this run (speed "
                     f"{cfg.emulator_speed:g}, no key; it stops with the run, so a stop cancels its batches); "
                     f"records under {Path(cfg.output_dir) / 'datasets'}")
            poll = max(0.05, cfg.batch_poll_s * cfg.emulator_speed)
            # nothing is left running in an emulator that stops with the run: a rerun would find no batch to adopt
            return await _run_batches(dataclasses.replace(cfg, batch_base_url=url, batch_poll_s=poll,
                                                          batch_cancel_on_stop=True), LOCAL_KEY, transport, sleep,
                                      clock, panel)
    return await _run_batches(cfg, resolve_batch_key(cfg.batch_api_key_env), transport, sleep, clock, panel)


async def _run_batches(cfg: GenerateConfig, key: str, transport: httpx.AsyncBaseTransport | None,
                       sleep: Any, clock: Callable[[], float] | None = None,
                       panel: Callable[[], BatchPanel | None] = make_batch_panel) -> dict[str, Any]:
    lanes = open_lanes(cfg)
    try:
        if tasks := [lane.name for lane in lanes if lane.scan.rollouts]:  # a step waits on the last one's tool results:
            raise InputError(f"{', '.join(tasks)}: tasks (prompts that name an environment) are rolled out on the "
                             "realtime route only", field="route")  # a batch's 24 h window per step is no route
        tok = load_tokenizer(cfg.tokenizer)
        check_batch_model(cfg, tok)
        check_cap(cfg, lanes, tok)
        spender = SpenderLock.acquire(cfg.batch_base_url, key, describe={
            "datasets": [lane.name for lane in lanes], "output_dir": str(Path(cfg.output_dir).resolve()),
            "route": "batch"})
        try:
            async with make_batch_client(cfg.batch_base_url, key, transport=transport) as client:
                run = BatchRun(cfg, lanes, MoonshotBatches(client, cfg.batch_model, sleep=sleep), tok, sleep=sleep,
                               clock=clock, panel=panel)
                summary = await run.execute()
        finally:
            spender.close()
    finally:
        for lane in lanes:
            lane.store.close()
    if run.fatal is not None and run.stop_reason != StopReason.INTERRUPTED:
        raise RuntimeError(f"generation stopped: {run.stop_reason}: {run.fatal.get('message')}")
    return summary


def check_batch_model(cfg: GenerateConfig, tok: Tokenizer) -> None:
    """Refuse a batch model of another release than the records' tokenizer (`batch_model kimi-k2.6` beside K2.5's
    tokenizer): the records would hold another model's answers, with ids and a template that are not its own.
    The tokenizer's release is what its directory says (facts.tokenizer_release); a directory that says none is
    taken for the model's (`model`) tokenizer."""
    served = batch_model(cfg.batch_model)
    said = tokenizer_release(tok.directory)
    ours = said or model_stem(cfg.model).lower()
    if ours != served.release_slug:
        source = f"the tokenizer at {tok.directory}" if said else f"the target {cfg.model!r} (model)"
        raise InputError(f"{cfg.batch_model} answers with {served.release}'s weights, but the records are tokenized "
                         f"as {ours} ({source}): they would hold another model's answers. Use the batch model of "
                         f"{ours}, or a tokenizer of {served.release}", field="batch_model")


def check_cap(cfg: GenerateConfig, lanes: list[DatasetRun], tok: Tokenizer) -> None:
    """Refuse a `max_spend_usd` under one line's worst case before anything is uploaded: every line is booked at its
    worst case (its prompt, and `max_tokens` of output at the batch price), so such a cap could submit nothing and
    the run would stop at once on max_spend_reached having spent $0. A round's lines fit in order, so what must fit
    is a dataset's first line: the first turn of its first prompt still to do (a later turn's prompt holds it, so no
    cap is refused that could send one); the cap that works is named."""
    if cfg.max_spend_usd is None:
        return
    price = batch_model(cfg.batch_model)
    firsts = []
    for lane in lanes:
        if lane.target is not None and lane.target_met:
            continue
        for p in itertools.islice(iter(lane.scan), 1):
            conversation = Conversation.of(p, lane.turns)
            ids = prompt_ids(tok, conversation.turn().messages, tools=conversation.tools)
            firsts.append((price.cost(len(ids), cfg.max_tokens), len(ids), lane.name))
    if not firsts:
        return
    bound, tokens, name = min(firsts)
    if cfg.max_spend_usd < bound:
        raise InputError(f"${cfg.max_spend_usd:g} is under one batch line's worst case: {cfg.max_tokens:,} output "
                         f"tokens (max_tokens) and a {tokens:,}-token prompt ({name}) cost up to ${bound:.4f} at "
                         f"{price.name}'s batch price, and every line is booked at its worst case, so nothing could "
                         f"be submitted. Set max_spend_usd to at least ${math.ceil(bound * 100) / 100:.2f} (a few "
                         f"lines: more), or lower max_tokens", field="max_spend_usd")
