"""The dispatcher (pure, synchronous, `now` passed in): what the next request is, and when the run stops.

It owns each dataset's work sources (its retries when due, the next turns of its started conversations, then new
conversations: lanes.py), the counts of work held, pacing (which dataset is furthest behind its target, pacing.py),
congestion (how many may be in flight, congestion.py) and THE stop state (`stop.set(reason)` is the one place a stop
reason is written, and the first one wins). Its surface is what a slot does with a request:

    take(now) -> Work | Wait | Stopped      sent(work, now)      answered / not_ok / cancelled      release(work)

plus `tick(now)` a few times a second. The engine's slots call it under one lock (slots.py); a replay runs the same
engine in virtual time (clock.run_virtual, replay.py, bench/pacing_replay.py).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ...openrouter import Kind, Outcome
from ..conversations.turns import Turn
from ..conversations.work import State, Work
from ..lanes import DatasetRun
from ..policy import (
    ERROR_PREFIX,
    REJECTABLE,
    REJECTED_PREFIX,
    RejectionWatch,
    Rule,
    StopReason,
    error_stop,
    fatal_stop,
    rejected_stop,
    retry_delay,
)
from .congestion import Congestion
from .pacing import Pacing, Streamed
from .pool import PoolMeter

log = logging.getLogger("eagledata.generate")

NO_ENDPOINT_BREAKER = 50  # this many no-endpoint answers in a row, none succeeding: routing is wrong
MONEY_STOPS = (StopReason.MAX_SPEND_REACHED, StopReason.BALANCE_RESERVE_REACHED)


@dataclass(frozen=True)
class Wait:
    """Nothing to take now: ask again at `until` (a retry falls due), or when something changes (None)."""

    until: float | None


@dataclass(frozen=True)
class Stopped:
    reason: str


Verdict = Literal["retry", "failed", "held", "stop"]


@dataclass
class StopState:
    """THE stop state of a run: why it stopped issuing, written in one place (`set`; the first reason wins, so a
    money stop keeps its reason when the stragglers are abandoned), and the answer that stopped it, if one did."""

    reason: str = ""
    fatal: Outcome | None = None  # the answer that stopped the run (bad key, no endpoints, a refused setting)

    @property
    def stopping(self) -> bool:
        return bool(self.reason)

    def set(self, reason: str, fatal: Outcome | None = None) -> bool:
        """Stop issuing, for `reason`; True when this call stopped the run."""
        if self.reason:
            return False
        self.reason, self.fatal = reason, fatal
        return True


class Dispatcher:
    """`failed(work)` writes a turn failed for good (the recorder's `fail`): the dispatcher decides when. A refused
    request (a 4xx: `policy.REJECTABLE`) is held until the run knows whose fault it is (`policy.RejectionWatch`):
    the prompt's once an answer shows the settings work, or its dataset has nothing else left (then written); the
    run's when the same refusal meets many prompts (the run stops, naming the setting, and the held ones stay to
    do: the next run sends them)."""

    def __init__(self, lanes: list[DatasetRun], pacing: Pacing, congestion: Congestion, *, max_attempts: int,
                 retry_base_s: float, retry_cap_s: float, failed: Callable[[Work], None], t0: float = 0.0,
                 rng: random.Random | None = None):
        self.lanes = {lane.name: lane for lane in lanes}
        self.pacing, self.congestion = pacing, congestion
        self.max_attempts, self.retry_base_s, self.retry_cap_s = max_attempts, retry_base_s, retry_cap_s
        self.failed, self.t0, self.rng = failed, t0, rng
        self.seq = itertools.count()
        self.holding = 0  # work in slots' hands (tokenizing, waiting for money, in flight)
        self.stop = StopState()
        self.no_endpoint_streak = 0
        self.rejections = RejectionWatch()
        self.held: list[Work] = []  # refused, not yet known to be their prompts' own fault
        self._stragglers_since: float | None = None
        self.pool = PoolMeter(congestion.concurrency, t0)  # where the slots are (slots move them; `take` says why idle)

    # -- taking work --------------------------------------------------------------------------------
    def take(self, now: float) -> Work | Wait | Stopped:
        """The next request: from the dataset furthest behind its target that has one (a started conversation's next
        turn goes ahead whether or not its dataset may start more), while the pool is under what congestion allows."""
        if self.stop.stopping:
            return Stopped(self.stop.reason)
        until: float | None = None
        active: list[str] = []
        if self.holding < self.congestion.allowed:
            active = [n for n, lane in self.lanes.items() if not lane.finished and lane.target_met_s is None]
            for name in self.pacing.ranked(active):
                lane, paced = self.lanes[name], self.pacing.lanes[name]
                work = lane.take(now, next(self.seq), paced.open, paced.may_continue)
                if work is not None:
                    self.holding += 1
                    lane.holding += 1
                    self.pacing.hold(name, later=work.turn.later if work.source == "new" else 0,
                                     promised=work.source == "next" and work.turn.promised)
                    lane.near_target = paced.near()  # this request counted: where it may go (requester.py)
                    return work
                if lane.retries and lane.retries[0].due > now:  # one due already waits for pacing:
                    due = lane.retries[0].due                   # a change, which notifies
                    until = due if until is None else min(until, due)
            self._settle_lanes(now)
            if self.stop.stopping:
                return Stopped(self.stop.reason)
        self.pool.cause(self._why_idle(active, now), now)
        return Wait(until)

    def _why_idle(self, active: list[str], now: float) -> str:
        """Why `take` found nothing (pool.py's causes): the pool at what congestion allows; a dataset with work left
        that pacing holds back; else retries not due yet; else next turns whose previous answers are not in; else
        nothing left."""
        if self.holding >= self.congestion.allowed:
            return "congestion"
        why = "done"
        for name in active:
            lane = self.lanes[name]
            if lane.ready or not lane.exhausted or (lane.retries and lane.retries[0].due <= now):
                return "paced"
            if lane.retries:
                why = "retry"
            elif why == "done" and self.pacing.lanes[name].promised:
                why = "turn"
        return why

    def wanted(self, work: Work) -> bool:
        """May `work`, taken earlier and waiting for money, still go out? Not once its dataset has met its target: it
        would pass the target by a whole answer and hold the run's end for it (issue 53: at the job's cut, 47 slots
        waited for the money the cut streams held at their bounds, then sent; one dataset ended at 1.020 of its
        target, the run 20 s after its last target). It is given back, still to do. (Not at a cut called before the
        target is recorded: cut samples short of it reopen the dataset, which then needs what it holds.)"""
        lane = work.lane
        return lane.target_met_s is None and not lane.target_met

    def admitted(self, work: Work, ticket: int) -> None:
        work.move(State.ADMITTED)
        work.ticket = ticket

    def sent(self, work: Work, now: float) -> None:
        """The admitted request goes out: pacing counts it in flight, on the flight admission opened."""
        work.move(State.SENT)
        work.sent_at = now
        self.pacing.start(work.lane.name, now, work.ticket)
        self.rejections.sending()

    def release(self, work: Work, now: float) -> None:
        """The slot lets go of `work`. A retry enters the heap only here: pushed earlier, another slot could take it
        before this one let go, and pacing would count it given back twice."""
        self.holding -= 1
        work.lane.holding -= 1
        if not work.started:  # given back: this conversation goes no further in this run
            self.pacing.release(work.lane.name)
            self.pacing.forgo(work.lane.name, work.turn.later)
        elif work.state is State.RETRIED:
            work.move(State.QUEUED)
            heapq.heappush(work.lane.retries, work)
        self._settle_lanes(now)

    # -- what an attempt came to --------------------------------------------------------------------
    def answered(self, work: Work, now: float, tokens: int, *, written: bool, next_turn: Turn | None,
                 cut: bool = False, paused: bool = False) -> None:
        """An answer was recorded (`written`: not already, by an earlier run's or a signal's race) with `tokens`;
        `next_turn`: its conversation goes on; `cut`: a stream the run cut, recorded as far as it got; `paused`: as a
        pause sample, its turn still to do (the next run's)."""
        work.move(State.SETTLED)
        lane = work.lane
        if written and next_turn is not None:
            lane.ready.append(next_turn)
        else:  # its last turn, or a cut one (which ends its conversation early, or pauses it until the next run)
            self.pacing.forgo(lane.name, work.turn.later)
        self._end(work, now, tokens if written else 0, finished=written and next_turn is None and not paused, cut=cut)
        self.no_endpoint_streak = 0
        self.rejections.answered(in_flight=self.holding - 1)  # the settings work: what was refused was the prompts'
        self._write_held()

    def not_ok(self, work: Work, now: float, outcome: Outcome, r: Rule) -> Verdict:
        """An attempt that brought no record: retry it (when due), fail it for good (written through `failed`),
        hold it (a refusal, `_refused`), or stop the run; the outcome table says which (policy.py)."""
        work.last_error = outcome.error_dict()
        work.attempts += r.counts
        work.rate_limited = work.rate_limited + 1 if r.rate_limited else 0
        verdict: Verdict = "stop"
        if outcome.kind is Kind.RETRY:
            if outcome.error_class == "no_endpoint":
                self.no_endpoint_streak += 1
                if self.no_endpoint_streak >= NO_ENDPOINT_BREAKER:
                    self.stop.set(StopReason.NO_ENDPOINTS, outcome)
            if work.attempts >= self.max_attempts:
                work.last_error = {**work.last_error, "gave_up_after": "max_attempts"}
                verdict = "failed"
            else:
                work.due = now + retry_delay(outcome, work.attempts, work.rate_limited, base_s=self.retry_base_s,
                                             cap_s=self.retry_cap_s, rng=self.rng)
                work.seq = next(self.seq)
                verdict = "retry"
        elif outcome.kind is Kind.FAILED:
            verdict = self._refused(work, outcome) if outcome.error_class in REJECTABLE else "failed"
        elif outcome.kind is Kind.OUT_OF_MONEY:
            self.stop.set(StopReason.OUT_OF_CREDITS)
        else:  # FATAL
            self.stop.set(fatal_stop(outcome.error_class), outcome)
        work.move(State.RETRIED if verdict == "retry" else State.SETTLED)
        if verdict in ("failed", "held"):
            self.pacing.forgo(work.lane.name, work.turn.later)  # a turn that fails for good ends its conversation
        self._end(work, now, 0, finished=verdict in ("failed", "held"))
        if verdict == "failed":
            self.failed(work)
        return verdict

    def _refused(self, work: Work, outcome: Outcome) -> Verdict:
        """A refused request (4xx): held until the run knows whose fault it is; when the same refusal has met many
        prompts (policy.RejectionWatch) the run stops on it, and none of them is written: they stay to do. After
        such a stop every refusal stays to do."""
        if self.stop.reason.startswith(REJECTED_PREFIX):
            return "stop"
        if self.rejections.rejected(work.turn.id, outcome):
            self.stop.set(rejected_stop(outcome), outcome)
            log.error("generation: %s: the same answer for at least %d different prompts, most of what was sent; "
                      "none of them is written to failures.jsonl: fix the setting and run again to send them",
                      self.stop.reason, self.rejections.prompts)
            for held in self.held:
                held.lane.held -= 1
            self.held.clear()
            return "stop"
        self.held.append(work)
        work.lane.held += 1
        return "held"

    def _write_held(self, lane: DatasetRun | None = None) -> None:
        """The held refusals (of `lane`, else all) are their prompts' own: written as failed for good."""
        keep = []
        for work in self.held:
            if lane is None or work.lane is lane:
                work.lane.held -= 1
                self.failed(work)
            else:
                keep.append(work)
        self.held = keep

    def cancelled(self, work: Work, now: float, *, go_on: bool = False) -> bool:
        """Its attempt was cut off: nothing recorded. Cut off alone while the run goes on (`go_on`: a suspect
        provider's stream closed) it is retried at once, not counted against `max_attempts` (the run's choice, not
        the service's fault); cut off with its slot (the run ending, what is in flight abandoned) the prompt stays
        to do, for the next run. True: retried."""
        retry = go_on and not self.stop.stopping
        if retry:
            work.due, work.seq = now, next(self.seq)
        work.move(State.RETRIED if retry else State.CANCELLED)
        self._end(work, now, 0, finished=False)
        return retry

    def _end(self, work: Work, now: float, tokens: int, *, finished: bool, cut: bool = False) -> None:
        assert work.ticket is not None
        self.pacing.end(work.ticket, now, tokens, finished=finished, cut=cut)

    # -- time -----------------------------------------------------------------------------------------
    def tick(self, now: float, streams: dict[int, Streamed] | None = None) -> list[DatasetRun]:
        """A few times a second: re-estimate what is in flight (`streams`: how far the streams have got, by ticket),
        close congestion windows. Returns the datasets whose streams are to be cut now (pacing's cut mode)."""
        self.pacing.refresh(now, streams)
        self.congestion.tick(now)
        return [self.lanes[name] for name in self.pacing.due_cuts()]

    def straggler_deadline(self, now: float, wait_s: float | None) -> float | None:
        """When the run gives up on the answers still in flight: issuing is over (every target met, or the money's
        end) and they get `wait_s` (billed either way, kept when they come). None while that is not the case."""
        over = self.stop.reason in MONEY_STOPS if self.stop.stopping else self.only_stragglers()
        if not over or not self.holding or wait_s is None:
            self._stragglers_since = None
            return None
        if self._stragglers_since is None:
            self._stragglers_since = now
        return self._stragglers_since + wait_s

    def only_stragglers(self) -> bool:
        """Everything still in hand is an answer to a dataset already at its target, and nothing else is left."""
        return all(lane.target_met_s is not None or lane.finished for lane in self.lanes.values())

    def _settle_lanes(self, now: float) -> None:
        """Mark the datasets that are done: target recorded, or every prompt finished, nothing in hand."""
        for lane in self.lanes.values():
            if lane.target_met_s is None and lane.target_met:
                lane.target_met_s = now - self.t0
                if all(one.target_met_s is not None for one in self.lanes.values() if one.target is not None):
                    self.pool.mark(now)  # the last target: the pool's figures up to here
            if lane.finished or lane.holding:
                continue
            if lane.target_met_s is not None:
                self._write_held(lane)
                lane.stop_reason = StopReason.TARGET_REACHED
            elif lane.all_finished:
                self._write_held(lane)  # nothing else of the dataset left to learn from: they were the prompts'
                lane.stop_reason = StopReason.ALL_FAILED if lane.all_failed else StopReason.COMPLETED
                if (leak := self.pacing.unsettled(lane.name)) is not None:
                    lane.stop_reason = _books_wrong(leak)
            elif not self.stop.stopping and lane.exhausted and not lane.retries and not lane.ready:
                left = len(lane.scan.pending) - (lane.store.conversations_finished - lane.done_before)
                lane.stop_reason = _books_wrong(f"{lane.name}: {left} conversations neither finished nor in hand")
        if all(lane.finished for lane in self.lanes.values()):
            reasons = {lane.stop_reason for lane in self.lanes.values()}
            errors = sorted(r for r in reasons if r.startswith(ERROR_PREFIX))
            self.stop.set(errors[0] if errors else StopReason.TARGET_REACHED if reasons == {StopReason.TARGET_REACHED}
                          else StopReason.ALL_FAILED if reasons == {StopReason.ALL_FAILED} else StopReason.COMPLETED)


def _books_wrong(what: str) -> str:
    """The engine's own counts disagree (a bug): the dataset stops saying so, never hangs or drifts on."""
    reason = error_stop(RuntimeError(what))
    log.error("generation: %s", reason)
    return reason
