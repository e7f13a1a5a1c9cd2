"""A finished batch's lines into records and books: each answer recorded as the realtime route records it (the same
recorder: exact ids, the count check, the fidelity judge, failures.jsonl), billed at the batch price; a line with no
keepable answer sent again in the next round (up to `max_attempts` counted tries; expired and cancelled lines do not
count), a refusal for one prompt written as failed, and the same refusal for most of a batch stopping the run."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...moonshot.batch_api import LineResult
from ...openrouter import Completion, Kind, Outcome
from ...openrouter.answers import classify_body
from ...text import Tokenizer
from ..conversations.recorder import REFUSALS, Recorder
from ..conversations.recording import build_record
from ..conversations.work import Work
from ..policy import REJECTABLE, RejectionWatch, StopReason, fatal_stop, rejected_stop
from .journal import BatchEntry, LineOutcome
from .rounds import Rounds
from .service import BatchService
from .state import LaneBatches

StopRun = Callable[[str, dict[str, Any] | None], None]  # the run stops for this reason, with this fatal error (or None)


class Settler:
    """Settles finished batches for the run: `stop` is told of a run-wide outcome (out of credits, a fatal answer,
    a setting every line was refused for)."""

    def __init__(self, tok: Tokenizer, recorder: Recorder, service: BatchService, rounds: Rounds, *,
                 max_attempts: int, stop: StopRun):
        self.tok, self.recorder, self.service, self.rounds = tok, recorder, service, rounds
        self.max_attempts, self.stop = max_attempts, stop

    def outcomes(self, lb: LaneBatches, entry: BatchEntry, results: dict[str, LineResult],
                 latency_s: float) -> dict[str, LineOutcome]:
        """Each line's outcome, in the batch's order: recorded | retry | resend | failed."""
        outcomes: dict[str, LineOutcome] = {}
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
                outcomes[cid] = self.record(lb, work, outcome, latency_s)
            elif outcome.kind is Kind.FAILED and outcome.error_class in REJECTABLE:
                refused[cid] = outcome
            elif outcome.kind in (Kind.OUT_OF_MONEY, Kind.FATAL):
                outcomes[cid] = "resend"
                self.stop(StopReason.OUT_OF_CREDITS if outcome.kind is Kind.OUT_OF_MONEY
                          else fatal_stop(outcome.error_class), outcome.error_dict())
            else:  # a 5xx line, a body that is no answer, an answer refused (its reasoning withheld: billed)
                if outcome.error_class in REFUSALS and outcome.completion is not None:
                    self.bill(lb, outcome.completion)
                    self.recorder.refused(work, outcome)
                outcomes[cid] = self.failed_try(lb, work, outcome)
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
            self.stop(rejected_stop(first), first.error_dict())
        return {cid: outcomes[cid] for cid in entry.lines}

    def record(self, lb: LaneBatches, work: Work, outcome: Outcome, latency_s: float) -> LineOutcome:
        c = outcome.completion
        assert c is not None
        cost = self.bill(lb, c)
        try:
            record = build_record(self.tok, turn=work.turn, dataset=lb.lane.name, prompt_ids=work.prompt_ids or [],
                                  completion=c, attempts=work.tries, sampling={"temperature": None})
        except UnicodeEncodeError:
            return self.failed_try(lb, work, Outcome(Kind.RETRY, "untokenizable", 200, "no exact ids"))
        if (refusal := self.recorder.contradicted(record, c)) is not None:
            self.recorder.refused(work, refusal)
            return self.failed_try(lb, work, refusal)
        lb.lane.stats.attempt(c.provider, ok=True, rate_limited=False, latency_s=latency_s)
        recorded, _ = self.recorder.record(work, record, c, cost)
        if recorded.next_turn is not None:
            lb.went_on += 1
            self.rounds.next_turn(lb, recorded.next_turn)
        elif work.turn.number < work.turn.conversation.last:
            lb.ended += 1
        return "recorded"

    def bill(self, lb: LaneBatches, c: Completion) -> float:
        """An answer the service charged: its provider and its cost at the batch price (the body carries none)."""
        assert lb.info is not None
        c.provider = self.service.provider
        cost = self.service.price.cost(c.usage.prompt_tokens, c.usage.completion_tokens)
        c.usage = dataclasses.replace(c.usage, cost=cost)
        lb.usd += cost
        lb.info.usd += cost
        return cost

    def failed_try(self, lb: LaneBatches, work: Work, outcome: Outcome) -> LineOutcome:
        """A line that got no keepable answer (a counted try): sent again in the next round, or failed for good
        after `max_attempts` counted tries."""
        work.last_error = outcome.error_dict()
        lb.lane.stats.errors[outcome.error_class] += 1
        lb.lane.stats.attempt(outcome.provider or self.service.provider, ok=False, rate_limited=False, latency_s=0.0)
        work.attempts += 1
        if work.attempts >= self.max_attempts:
            self.recorder.fail(work)
            return "failed"
        lb.lane.stats.counts["retried"] += 1
        return "retry"
