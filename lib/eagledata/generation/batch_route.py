"""The batch route (`route: batch`): the datasets' prompts through a batch API in rounds, into the same records.

Each dataset has at most one batch in progress. A round holds every turn that can be sent now: the next turns of
conversations whose earlier answers are recorded (turn j of a conversation goes in its j-th round), the lines to
send again, and new conversations as many as its target still needs (batch_plan.py: the budget's estimate first,
then smaller top-ups on the measured lengths). Its answers are recorded as the realtime route records them (the
same recorder: exact ids, the count check, the fidelity judge, failures.jsonl), with the batch's answer id as
`generation_id` and the batch service as `provider`.

Money: every line's worst case at the batch price is booked when its batch is submitted, against `max_spend_usd` and
the balance (read from the service before every round) less `reserve_usd`; its answer's cost replaces the booking
when it comes. So the account is never charged past either, whatever the answers.

Resume: the journal (batch_journal.py) is written before each call that creates something, so a rerun adopts every
batch a killed run left (matching an upload or a batch it never journaled by name), records their answers and goes
on; a line is sent again only when its earlier line failed, expired or was cancelled. Ctrl-C leaves the batches
running (a rerun of the same command picks them up), or cancels them with `batch_cancel_on_stop`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from ..aio import on_kernel_shutdown, on_signals
from ..defaults import is_emulator
from ..errors import InputError
from ..moonshot.batch_api import (
    BatchApiError,
    BatchInfo,
    LineResult,
    MoonshotBatches,
    batch_line,
    jsonl,
    make_batch_client,
    resolve_batch_key,
)
from ..moonshot.facts import BatchModel
from ..openrouter import Completion, Kind, Outcome, RoutingDecision
from ..openrouter.answers import classify_body
from ..openrouter.client import LOCAL_KEY
from ..prompts import Prompt
from ..status import ensure_log_handler
from ..text import KimiTokenizer, load_tokenizer, prompt_ids
from .batch_journal import BatchEntry, BatchJournal, JournalLine
from .batch_plan import Need, TurnLengths, fits, new_conversations
from .budget import OutputLengths
from .clock import InlineExecutor
from .config import GenerateConfig
from .datasets import select_datasets
from .fidelity import FidelityJudge
from .lanes import DatasetRun, open_lanes
from .panel import BatchPanel, make_batch_panel
from .policy import REJECTABLE, RejectionWatch, StopReason, error_stop, fatal_stop, rejected_stop
from .progress import RunStats, dataset_summary, run_figures, run_summary
from .recorder import REFUSALS, Recorder
from .recording import build_record
from .spender import SpenderLock
from .turns import Conversation
from .work import Work

log = logging.getLogger("eagledata.generate")
INPUTS = "batch_inputs"  # <dataset dir>/batch_inputs/<batch name>.jsonl: each batch's input file, kept


class BatchService(Protocol):
    """A batch API's dialect (moonshot.batch_api.MoonshotBatches): the calls the route makes and the price."""

    name: str
    provider: str
    price: BatchModel
    max_file_bytes: int  # an input file's limit: a round holds what fits

    def body(self, messages: list[dict], *, max_tokens: int, tools: list[dict] | None = None,
             parallel_tool_calls: bool = False) -> dict[str, Any]: ...
    async def upload(self, filename: str, data: bytes) -> str: ...
    async def files(self) -> list[dict[str, Any]]: ...
    async def delete_file(self, file_id: str) -> None: ...
    async def create(self, input_file_id: str, window: str, metadata: dict[str, str]) -> BatchInfo: ...
    async def get(self, batch_id: str) -> BatchInfo: ...
    async def batches(self) -> list[BatchInfo]: ...
    async def cancel(self, batch_id: str) -> BatchInfo: ...
    async def results(self, file_id: str) -> list[LineResult]: ...
    async def balance(self) -> float: ...


def messages_sha(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass
class RoundInfo:
    """One batch as the panel and the summary show it."""

    dataset: str
    round: int
    name: str
    lines: int
    batch_id: str | None = None
    status: str = "prepared"
    answered: int = 0
    failed: int = 0
    usd: float = 0.0
    booked_usd: float = 0.0
    started: float = 0.0   # the run's clock
    waited_s: float = 0.0

    def row(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "usd": round(self.usd, 10), "booked_usd": round(self.booked_usd, 10),
                "waited_s": round(self.waited_s, 1), "started": round(self.started, 1)}


@dataclass(eq=False)
class LaneBatches:
    """The batch route's state of one dataset: its journal, the conversations at hand, what the next round sends."""

    lane: DatasetRun
    journal: BatchJournal
    conversations: dict[str, Conversation] = field(default_factory=dict)
    unstarted: deque[Prompt] = field(default_factory=deque)  # taken from the scan, not started yet
    ready: list[Work] = field(default_factory=list)            # turns for the next round
    entry: BatchEntry | None = None                            # its batch in progress
    in_flight: dict[str, Work] = field(default_factory=dict)   # that batch's lines
    info: RoundInfo | None = None
    rounds: list[RoundInfo] = field(default_factory=list)
    went_on: int = 0
    ended: int = 0
    usd: float = 0.0   # what this run's answers of this dataset cost

    @property
    def dir(self) -> Path:
        return self.lane.store.files.directory

    def prompts(self) -> Iterator[Prompt]:
        """The prompts not started, in file order: those taken out of the scan first."""
        i = 0
        while True:
            if i < len(self.unstarted):
                yield self.unstarted[i]
            else:
                p = next(self.lane.prompts, None)
                if p is None:
                    self.lane.exhausted = True
                    return
                self.unstarted.append(p)
                yield p
            i += 1


class BatchRun:
    """One run of the batch route over one or several datasets on one account."""

    def __init__(self, cfg: GenerateConfig, lanes: list[DatasetRun], service: BatchService, tok: KimiTokenizer, *,
                 sleep: Any = asyncio.sleep, clock: Any = time.monotonic):
        self.cfg, self.service, self.tok, self.sleep, self.clock = cfg, service, tok, sleep, clock
        self.t0, self.started_at = clock(), datetime.now(UTC).isoformat(timespec="seconds")
        self.judge = FidelityJudge.carried([lane.summary_before for lane in lanes if lane.summary_before])
        self.recorder = Recorder(tok, InlineExecutor(), self.judge, RoutingDecision(model=cfg.batch_model),
                                 temperature=None, paid=True)
        self.lanes = [LaneBatches(lane, BatchJournal(lane.store.files.directory / "batches.jsonl"))
                      for lane in lanes]
        self.balance_start: float | None = None
        self.balance_end: float | None = None
        self.stop_reason: str = ""
        self.fatal: dict[str, Any] | None = None
        self.panel: BatchPanel | None = None
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        self._seq = 0
        guess = OutputLengths.lognormal(cfg.prior_output_median_tokens, cfg.prior_output_sigma, cfg.max_tokens)
        self.guess = TurnLengths(guess.mean, guess.sd)

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
        by_balance = balance - self.cfg.reserve_usd - self.booked
        if self.cfg.max_spend_usd is None:
            return by_balance, StopReason.BALANCE_RESERVE_REACHED
        by_cap = self.cfg.max_spend_usd - self.spent - self.booked
        return (by_cap, StopReason.MAX_SPEND_REACHED) if by_cap < by_balance else \
            (by_balance, StopReason.BALANCE_RESERVE_REACHED)

    # -- the work ----------------------------------------------------------------------------------------------
    def _work(self, lb: LaneBatches, conversation: Conversation) -> Work:
        """The conversation's next request (after its recorded turns), with the tries its turn already had."""
        self._seq += 1
        turn = lb.lane.first_turn(conversation)
        work = Work(0.0, self._seq, turn, lb.lane, source="new" if turn.number == conversation.first else "next")
        work.attempts, work.tries = lb.journal.attempts(turn.id), lb.journal.tries(turn.id)
        return work

    def _find(self, lb: LaneBatches, ids: set[str]) -> None:
        """Take the conversations `ids` out of the scan (the others it passes stay unstarted, in order)."""
        missing = set(ids) - set(lb.conversations)
        for p in lb.prompts() if missing else ():
            if p.id in missing:
                lb.conversations[p.id] = Conversation.of(p, lb.lane.turns)
                missing.discard(p.id)
                if not missing:
                    break
        lb.unstarted = deque(p for p in lb.unstarted if p.id not in lb.conversations)
        if missing:
            raise InputError(f"the batch journal names conversations the prompt file no longer holds: "
                             f"{sorted(missing)[:5]} (was the prompt file changed?)", lb.journal.path)

    def _open(self, lb: LaneBatches) -> None:
        """A rerun: the open conversations (recorded turns, not finished) and the batch a killed run left."""
        pending = lb.journal.pending
        if len(pending) > 1:
            raise InputError(f"{len(pending)} batches in progress for one dataset; the route keeps one",
                             lb.journal.path)
        entry = pending[0] if pending else None
        done = lb.lane.store.done  # lines the killed run recorded (or failed for good) before it journaled the end
        wanted = set(lb.lane.store.chains) | {ln.conversation_id for ln in (entry.lines.values() if entry else ())
                                              if ln.custom_id not in done}
        self._find(lb, wanted)
        for cid, conversation in lb.conversations.items():
            work = self._work(lb, conversation)
            if entry is not None and work.turn.id in entry.lines:
                line = entry.lines[work.turn.id]
                self._sent_turn(work)
                work.prompt_ids = prompt_ids(self.tok, work.turn.messages, tools=conversation.tools)
                work.bound = line.bound_usd
                if messages_sha(work.turn.messages) != line.sha:
                    raise InputError(f"conversation {cid!r}: the batch in progress was sent other messages than its "
                                     "prompt and records make now (was the prompt file changed?)", lb.journal.path)
                lb.in_flight[work.turn.id] = work
            elif cid in lb.lane.store.chains:
                lb.ready.append(work)
        if entry is not None:
            lb.entry = entry
            lb.info = RoundInfo(lb.lane.name, entry.round, entry.name, len(entry.lines), entry.batch_id,
                                entry.status, booked_usd=entry.bound_usd, started=self.clock() - self.t0)
            lb.rounds.append(lb.info)

    def _body(self, work: Work) -> dict[str, Any]:
        conversation = work.turn.conversation
        return self.service.body(work.turn.messages, max_tokens=self.cfg.max_tokens,
                                 tools=list(conversation.tools or ()) or None,
                                 parallel_tool_calls=conversation.parallel_tool_calls)

    def _sent_turn(self, work: Work) -> None:
        """The turn as the batch sends it: its messages in the service's dialect (what the record keeps)."""
        work.turn = dataclasses.replace(work.turn, messages=self._body(work)["messages"])

    async def _adopt(self, lb: LaneBatches) -> None:
        """The batch in progress reaches the service once: an upload or a batch a killed run made but never
        journaled is found by name; only what does not exist yet is made."""
        entry = lb.entry
        if entry is None:
            return
        if entry.file_id is None:
            found = [f for f in await self.service.files() if f.get("filename") == f"{entry.name}.jsonl"]
            file_id = str(found[0]["id"]) if found else \
                await self.service.upload(f"{entry.name}.jsonl", (lb.dir / INPUTS / f"{entry.name}.jsonl").read_bytes())
            lb.journal.uploaded(entry.name, file_id)
        if entry.batch_id is None:
            assert entry.file_id is not None
            found_b = [b for b in await self.service.batches() if b.metadata.get("eagledata") == entry.name]
            info = found_b[0] if found_b else await self.service.create(
                entry.file_id, self.cfg.batch_window, self._metadata(lb, entry))
            lb.journal.created(entry.name, info.id)
        assert lb.info is not None
        lb.info.batch_id = entry.batch_id

    def _metadata(self, lb: LaneBatches, entry: BatchEntry) -> dict[str, str]:
        return {"eagledata": entry.name, "dataset": lb.lane.name, "round": str(entry.round)}

    def _lengths(self, lb: LaneBatches) -> TurnLengths:
        return TurnLengths.of(lb.lane.store.lengths, self.guess, lb.went_on, lb.ended)

    def _plan(self, lb: LaneBatches) -> list[Work]:
        """The next round's lines: the ready turns, then new conversations as the target needs (all, without one)."""
        lane, works = lb.lane, list(lb.ready)
        if lane.target is not None and lane.target_met:
            return []
        lengths = self._lengths(lb)
        if lane.target is None:
            news = list(lb.prompts())
        else:
            open_mean = open_var = 0.0
            for w in works:
                m, v = lengths.conversation(w.turn.conversation.last - w.turn.number + 1)
                open_mean, open_var = open_mean + m, open_var + v
            need = Need(lane.target, lane.store.output_tokens, open_mean, open_var)
            turns = (len(Conversation.of(p, lane.turns).asks) for p in lb.prompts())
            n = new_conversations(need, turns, lengths, first=not lb.journal.entries,
                                  first_share=self.cfg.batch_first_round)
            news = list(lb.unstarted)[:n]
        for p in news:
            lb.conversations[p.id] = conversation = Conversation.of(p, lane.turns)
            works.append(self._work(lb, conversation))
        return works

    async def _submit(self, lb: LaneBatches, room: float) -> bool | None:
        """Plan and submit the dataset's next round within `room` dollars: True when submitted, False when not one
        line of it fits, None when it has nothing to send."""
        works = self._plan(lb)
        if not works:
            return None
        for w in works:
            self._sent_turn(w)
            if w.prompt_ids is None:
                w.prompt_ids = prompt_ids(self.tok, w.turn.messages, tools=w.turn.conversation.tools)
            w.bound = self.service.price.cost(len(w.prompt_ids), self.cfg.max_tokens)
        bodies = [batch_line(w.turn.id, self._body(w)) for w in works]
        sizes = [len(jsonl([b])) for b in bodies]
        n = fits([w.bound for w in works], 0.0, room)
        n = min(n, fits([float(x) for x in sizes], 0.0, float(self.service.max_file_bytes)))  # one file holds a round
        if n == 0:
            return False
        sent, kept = works[:n], works[n:]
        ready_ids = {id(w) for w in lb.ready}
        lb.ready = [w for w in kept if id(w) in ready_ids]  # the rest of the ready turns wait for the money
        for w in kept:  # new conversations that did not fit stay unstarted
            if id(w) not in ready_ids:
                lb.conversations.pop(w.turn.conversation.id, None)
        started = {w.turn.conversation.id for w in sent}
        lb.unstarted = deque(p for p in lb.unstarted if p.id not in started)
        round_ = lb.journal.rounds + 1
        name = f"eagledata-{lb.lane.name}-r{round_:03d}-{secrets.token_hex(3)}"
        lines, journal_lines = bodies[:n], []
        for w in sent:
            w.tries += 1
            journal_lines.append(JournalLine(w.turn.id, w.turn.conversation.id, w.turn.number, w.tries, w.bound,
                                             len(w.prompt_ids or ()), messages_sha(w.turn.messages)))
        (lb.dir / INPUTS).mkdir(exist_ok=True)
        (lb.dir / INPUTS / f"{name}.jsonl").write_bytes(jsonl(lines))
        lb.entry = lb.journal.prepared(name, round_, journal_lines, time.time())
        lb.in_flight = {w.turn.id: w for w in sent}
        lb.info = RoundInfo(lb.lane.name, round_, name, len(sent), booked_usd=lb.entry.bound_usd,
                            started=self.clock() - self.t0)
        lb.rounds.append(lb.info)
        await self._adopt(lb)
        log.info("batch route: %s round %d: %d lines submitted (%d new conversations), $%.4f booked (batch %s)",
                 lb.lane.name, round_, len(sent), sum(w.source == "new" for w in sent), lb.entry.bound_usd,
                 lb.entry.batch_id)
        return True

    # -- answers -----------------------------------------------------------------------------------------------
    async def _poll(self, lb: LaneBatches) -> None:
        assert lb.entry is not None and lb.entry.batch_id is not None and lb.info is not None
        info = await self.service.get(lb.entry.batch_id)
        lb.info.status, lb.info.answered, lb.info.failed = info.status, info.completed, info.failed
        lb.info.waited_s = self.clock() - self.t0 - lb.info.started
        if info.terminal:
            await self._settle(lb, info)

    async def _settle(self, lb: LaneBatches, info: BatchInfo) -> None:
        """Record a finished batch's answers; its failed lines go into the next round (up to max_attempts)."""
        entry, lane = lb.entry, lb.lane
        assert entry is not None and lb.info is not None
        results: dict[str, LineResult] = {}
        for file_id in (info.output_file_id, info.error_file_id):
            if file_id:
                results.update((r.custom_id, r) for r in await self.service.results(file_id))
        outcomes: dict[str, Any] = {}
        if info.status == "failed":  # the service refused the file: a setting of the run, not of its prompts
            self.fatal = {"class": "batch_rejected", "status": None,
                          "message": "; ".join(f"line {e.get('line')}: {e.get('message')}" for e in info.errors)[:500]}
            self._stop(fatal_stop("batch_rejected"))
            outcomes = {cid: "resend" for cid in entry.lines}
        else:
            outcomes = self._outcomes(lb, entry, results)
        lb.info.status = info.status
        lb.info.answered = sum(o == "recorded" for o in outcomes.values())
        lb.info.failed = sum(o in ("retry", "failed") for o in outcomes.values())
        lb.info.waited_s = self.clock() - self.t0 - lb.info.started
        lb.journal.settled(entry.name, outcomes, lb.info.usd, info.status)
        if entry.file_id:  # an account holds at most 1,000 batch files; the input stays in batch_inputs/
            try:
                await self.service.delete_file(entry.file_id)
            except BatchApiError as e:
                log.warning("batch route: input file %s not deleted at the service: %s", entry.file_id, e)
        for cid, o in outcomes.items():
            if o in ("retry", "resend"):
                lb.ready.append(lb.in_flight[cid])
        lb.entry, lb.in_flight = None, {}
        if lane.target is not None and lane.target_met and lane.target_met_s is None:
            lane.target_met_s = self.clock() - self.t0
        if self.service.provider in self.judge.suspects:
            self._stop(StopReason.NO_FAITHFUL_PROVIDERS)
        log.info("batch route: %s round %d %s: %d recorded, %d to send again, %d failed for good, $%.4f",
                 lane.name, entry.round, info.status, lb.info.answered,
                 sum(o in ("retry", "resend") for o in outcomes.values()),
                 sum(o == "failed" for o in outcomes.values()), lb.info.usd)

    def _outcomes(self, lb: LaneBatches, entry: BatchEntry, results: dict[str, LineResult]) -> dict[str, Any]:
        outcomes: dict[str, Any] = {}
        refused: dict[str, Outcome] = {}
        answered = False
        for cid in entry.lines:
            if cid not in lb.in_flight:  # recorded (or failed for good) by a run killed before it journaled the end
                outcomes[cid] = "recorded" if cid in lb.lane.store.done else "resend"
                continue
            work, r = lb.in_flight[cid], results.get(cid)
            if r is None or r.error is not None or r.status_code is None:
                outcomes[cid] = "resend"  # expired, cancelled, or never run: not an attempt
                continue
            outcome = classify_body(r.status_code, {}, r.body)
            if outcome.kind is Kind.OK:
                answered = True
                outcomes[cid] = self._record(lb, work, outcome)
            elif outcome.kind is Kind.FAILED and outcome.error_class in REJECTABLE:
                refused[cid] = outcome
            elif outcome.kind in (Kind.OUT_OF_MONEY, Kind.FATAL):
                outcomes[cid] = "resend"
                self.fatal = self.fatal or outcome.error_dict()
                self._stop(StopReason.OUT_OF_CREDITS if outcome.kind is Kind.OUT_OF_MONEY
                           else fatal_stop(outcome.error_class))
            else:  # a 5xx line, a body that is no answer, an answer refused (its reasoning withheld: billed)
                if outcome.error_class in REFUSALS and outcome.completion is not None:
                    self._bill(lb, outcome.completion)
                    self.recorder.refused(work, outcome)
                outcomes[cid] = self._failed_try(lb, work, outcome, counted=True)
        watch = RejectionWatch(sent=len(entry.lines))
        run_wide = not answered and any(watch.rejected(cid, o) for cid, o in refused.items())
        for cid, outcome in refused.items():
            if run_wide:  # the same refusal for most of the batch: the run's setting, none written as failed
                outcomes[cid] = "resend"
            else:
                lb.in_flight[cid].last_error = outcome.error_dict()
                self.recorder.fail(lb.in_flight[cid])
                outcomes[cid] = "failed"
        if run_wide:
            first = next(iter(refused.values()))
            self.fatal = first.error_dict()
            self._stop(rejected_stop(first))
        return {cid: outcomes[cid] for cid in entry.lines}

    def _record(self, lb: LaneBatches, work: Work, outcome: Outcome) -> str:
        c = outcome.completion
        assert c is not None and lb.info is not None
        cost = self._bill(lb, c)
        latency = self.clock() - self.t0 - lb.info.started
        try:
            record = build_record(self.tok, turn=work.turn, dataset=lb.lane.name, prompt_ids=work.prompt_ids or [],
                                  completion=c, attempts=work.tries, sampling={"temperature": None})
        except UnicodeEncodeError:
            return self._failed_try(lb, work, Outcome(Kind.RETRY, "untokenizable", 200, "no exact ids"),
                                    counted=True)
        if (refusal := self.recorder.contradicted(record, c)) is not None:
            self.recorder.refused(work, refusal)
            return self._failed_try(lb, work, refusal, counted=True)
        lb.lane.stats.attempt(c.provider, ok=True, rate_limited=False, latency_s=latency)
        recorded, _ = self.recorder.record(work, record, c, cost)
        if recorded.next_turn is not None:
            lb.went_on += 1
            self._seq += 1
            lb.ready.append(Work(0.0, self._seq, recorded.next_turn, lb.lane, source="next"))
        elif work.turn.number < work.turn.conversation.last:
            lb.ended += 1
        return "recorded"

    def _bill(self, lb: LaneBatches, c: Completion) -> float:
        """An answer the service charged: its provider and its cost at the batch price (the body carries none)."""
        assert lb.info is not None
        c.provider = self.service.provider
        cost = self.service.price.cost(c.usage.prompt_tokens, c.usage.completion_tokens)
        c.usage = dataclasses.replace(c.usage, cost=cost)
        lb.usd += cost
        lb.info.usd += cost
        return cost

    def _failed_try(self, lb: LaneBatches, work: Work, outcome: Outcome, *, counted: bool) -> str:
        """A line that got no keepable answer: sent again in the next round, or failed for good after
        `max_attempts` counted tries."""
        work.last_error = outcome.error_dict()
        lb.lane.stats.errors[outcome.error_class] += 1
        lb.lane.stats.attempt(outcome.provider or self.service.provider, ok=False, rate_limited=False, latency_s=0.0)
        if not counted:
            return "resend"
        work.attempts += 1
        if work.attempts >= self.cfg.max_attempts:
            self.recorder.fail(work)
            return "failed"
        lb.lane.stats.counts["retried"] += 1
        return "retry"

    # -- the run -----------------------------------------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        if not self.stop_reason:
            self.stop_reason = reason
        self._wake.set()

    def _on_signal(self) -> None:
        self._stop(StopReason.INTERRUPTED)

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
        self.panel = make_batch_panel() if self.cfg.progress else None
        restore, unhook, ended = on_signals(self._on_signal), on_kernel_shutdown(self._kernel_shutdown), self._ended
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
                summary = self.summaries()
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
            self._open(lb)
            await self._adopt(lb)
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
                    if await self._submit(lb, room) is False:
                        money_stop = why
            waiting = [lb for lb in self.lanes if lb.entry is not None]
            if not waiting:
                if money_stop:
                    self._stop(money_stop)
                elif all(self._lane_done(lb) for lb in self.lanes):
                    if all(lb.lane.stop_reason == StopReason.TARGET_REACHED for lb in self.lanes):
                        self.stop_reason = StopReason.TARGET_REACHED
                    break
            self._status()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=poll)
            except TimeoutError:
                pass

    def _status(self) -> None:
        """A status line (logging) every poll, and the live panel's table of rounds in JupyterLab."""
        parts = []
        for lb in self.lanes:
            i, lane = lb.info, lb.lane
            head = f"{lane.name} {lane.store.output_tokens:,}" + (f"/{lane.target:,}" if lane.target else "") + " tok"
            if lb.entry is not None and i is not None:
                head += (f", round {i.round} {i.status} {i.answered}/{i.lines} answered, {i.failed} failed, "
                         f"waiting {i.waited_s / 60:.1f} min")
            parts.append(head)
        line = f"{' | '.join(parts)} | ${self.spent:.4f} answered, ${self.booked:.4f} booked"
        log.info("batch route: %s", line)
        if self.panel is not None:
            self.panel.update(line, [i.row() for lb in self.lanes for i in lb.rounds])

    async def _end(self) -> None:
        """Ctrl-C (or a stop): the batches in progress are left running (a rerun adopts them), or cancelled and
        their answered lines recorded (`batch_cancel_on_stop`); the balance is read once more."""
        waiting = [lb for lb in self.lanes if lb.entry is not None and lb.entry.batch_id]
        if waiting and self.cfg.batch_cancel_on_stop:
            for lb in waiting:
                assert lb.entry is not None and lb.entry.batch_id is not None
                await self.service.cancel(lb.entry.batch_id)
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
        self._status()
        try:
            self.balance_end = await self.service.balance()
        except Exception as e:  # the summaries are still written
            log.warning("batch route: the balance could not be read at the end: %s", e)

    # -- summaries ---------------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {"route": "batch", "batch_service": self.service.name, "batch_model": self.cfg.batch_model,
                "batch_window": self.cfg.batch_window, "max_spend_usd": self.cfg.max_spend_usd,
                "reserve_usd": self.cfg.reserve_usd, "balance_start_usd": self.balance_start,
                "budget_mode": "strict", "concurrency": None, "max_tokens": self.cfg.max_tokens,
                "turns": self.cfg.turns, "cheapest_eligible_usd_per_m_output": self.service.price.completion_per_m,
                "planned_usd_per_m_output": None}

    def _common(self) -> dict[str, Any]:
        return {"model": self.cfg.batch_model, "base_url": self.cfg.batch_base_url, "backend": self.service.name,
                "started_at": self.started_at, "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "wall_s": round(self.clock() - self.t0, 3)}

    def _extra(self, lanes: list[LaneBatches]) -> dict[str, Any]:
        rounds = [i.row() for lb in lanes for i in lb.rounds]
        left = [lb.entry.batch_id for lb in lanes if lb.entry is not None]
        return {"foreign_usd": 0.0, "money_left": None, "concurrency_changes": [], "batches": rounds,
                "batches_running": left,
                "waited_s": round(max((i.waited_s + i.started for lb in lanes for i in lb.rounds), default=0.0), 1)}

    def summaries(self) -> dict[str, Any]:
        wall = self.clock() - self.t0
        charged = None if self.balance_start is None or self.balance_end is None else \
            max(0.0, self.balance_start - self.balance_end)
        routing = {"provider": None, "source": f"{self.service.name} batch API", "route": "batch"}
        per: dict[str, dict[str, Any]] = {}
        single = len(self.lanes) == 1
        for lb in self.lanes:
            lane = lb.lane
            per[lane.name] = {**dataset_summary(
                lane.name, lane.store, lane.stats, common=self._common(),
                stop_reason=lane.stop_reason, fatal=self.fatal, prompts=lane.scan.total, target=lane.target,
                figures=run_figures(lane.stats, wall_s=wall, charged=charged if single else lb.usd, spent=lb.usd),
                settings=self._settings(), done_before=lane.done_before, target_met_s=lane.target_met_s,
                extra=self._extra([lb]), routing=routing), "fidelity": lane.fidelity.summary(verdicts=self.judge)}
            lane.store.write_summary(per[lane.name])
        if single:
            return per[self.lanes[0].lane.name]
        totals = RunStats.combined([lb.lane.stats for lb in self.lanes])
        return {**run_summary([lb.lane.name for lb in self.lanes], per, totals, common=self._common(),
                              stop_reason=self.stop_reason or StopReason.COMPLETED, fatal=self.fatal,
                              figures=run_figures(totals, wall_s=wall, charged=charged, spent=self.spent),
                              settings=self._settings(), extra=self._extra(self.lanes), routing=routing),
                "fidelity": self.judge.summary()}



async def run_batch_route(cfg: GenerateConfig, *, transport: httpx.AsyncBaseTransport | None = None,
                          sleep: Any = asyncio.sleep) -> dict[str, Any]:
    """`route: batch`: every input checked (the key, the model and the window, every prompt) before anything is
    uploaded; returns the summary as `run_generation` does. `base_url: emulator`: the emulator's Batch API, started
    for the run (`batch_poll_s` × `emulator_speed`). `transport`: the HTTP transport to the service (tests)."""
    if is_emulator(cfg.base_url):
        from ..emulator_process import serving

        specs = select_datasets(cfg.datasets_file, cfg.dataset)
        async with serving(cfg.base_url, speed=cfg.emulator_speed, tool_datasets=[s.prompts for s in specs]) as url:
            ensure_log_handler()
            url = url.removesuffix("/api/v1") + "/moonshot/v1"
            log.info(f"base_url emulator: the emulator's Batch API at {url} for this run (speed "
                     f"{cfg.emulator_speed:g}, no key); records under {Path(cfg.output_dir) / 'datasets'}")
            poll = max(0.05, cfg.batch_poll_s * cfg.emulator_speed)
            return await _run_batches(dataclasses.replace(cfg, batch_base_url=url, batch_poll_s=poll), LOCAL_KEY,
                                      transport, sleep)
    return await _run_batches(cfg, resolve_batch_key(cfg.batch_api_key_env), transport, sleep)


async def _run_batches(cfg: GenerateConfig, key: str, transport: httpx.AsyncBaseTransport | None,
                       sleep: Any) -> dict[str, Any]:
    lanes = open_lanes(cfg)
    try:
        tok = load_tokenizer(cfg.tokenizer)
        spender = SpenderLock.acquire(cfg.batch_base_url, key, describe={
            "datasets": [lane.name for lane in lanes], "output_dir": str(Path(cfg.output_dir).resolve()),
            "route": "batch"})
        try:
            async with make_batch_client(cfg.batch_base_url, key, transport=transport) as client:
                run = BatchRun(cfg, lanes, MoonshotBatches(client, cfg.batch_model, sleep=sleep), tok, sleep=sleep)
                summary = await run.execute()
        finally:
            spender.close()
    finally:
        for lane in lanes:
            lane.store.close()
    if run.fatal is not None and run.stop_reason != StopReason.INTERRUPTED:
        raise RuntimeError(f"generation stopped: {run.stop_reason}: {run.fatal.get('message')}")
    return summary
