"""The recorder: what an attempt leaves behind. An answer becomes its record off the event loop (recording.py) and
is written to its dataset's store exactly once (a stop signal cannot make it write twice); a conversation's next turn
is made from it; a prompt failed for good goes to failures.jsonl; the fidelity books (the dataset's and the run's
judge, fidelity.py) and the counters hear of every attempt. An answer whose ids the service's own count contradicts
is never written (`contradicted`): it is refused as a withheld reasoning is, and retried elsewhere. A pause sample (a
prefix a Ctrl-C cut, turns.py `pauses`) is written under its own id and leaves its turn to do."""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ...aio import in_executor
from ...openrouter import Completion, Kind, Outcome, RoutingDecision
from ...openrouter.answers import REASONING_MISSING
from ...records import Record
from ...text import Tokenizer
from ..policy import CANCELLED, Rule, StopReason
from .fidelity import FidelityJudge
from .recording import COUNT_DISAGREES, build_record, count_refusal
from .rollouts import environment_label
from .turns import Turn, pauses
from .work import Work

log = logging.getLogger("eagledata.generate")
REFUSALS = (REASONING_MISSING, COUNT_DISAGREES)  # answers read and paid for, not kept: retried without their provider


@dataclass(frozen=True)
class Recorded:
    tokens: int
    written: bool            # False: already in the store (a race with a stop signal)
    next_turn: Turn | None   # its conversation goes on
    paused: bool = False     # a pause sample: its turn is still to do (the next run asks it again)


class Recorder:
    def __init__(self, tok: Tokenizer, executor: Executor, fidelity: FidelityJudge, routing: RoutingDecision, *,
                 temperature: float | None, paid: bool, on_suspect: Callable[[str], int] | None = None):
        """`on_suspect(provider)`: called when a provider turns suspect (the requester cancels its streams in flight);
        returns how many it stopped."""
        self.tok, self.executor, self.fidelity, self.routing = tok, executor, fidelity, routing
        self.temperature, self.paid, self.on_suspect = temperature, paid, on_suspect

    async def build(self, work: Work, c: Completion) -> Record:
        """The answer's record with exact ids, off the event loop. UnicodeEncodeError: its text has no ids."""
        return await in_executor(self.executor, build_record, self.tok, turn=work.turn, dataset=work.lane.name,
                                 prompt_ids=work.prompt_ids, completion=c, attempts=work.tries,
                                 sampling={"temperature": self.temperature})

    def contradicted(self, record: Record, c: Completion) -> Outcome | None:
        """The refusal of a built record whose ids leave the service's count beyond its provider's offset (learned
        by the run's judge) and the tolerance (recording.count_refusal), else None. Under the run's lock: the
        offsets move as answers are booked."""
        offset = self.fidelity.completion_offset(c.provider, record.finish_reason)
        return count_refusal(c, record.meta["fidelity"], offset, server_ids=record.meta.get("ids_source") == "server")

    def record(self, work: Work, record: Record, c: Completion, cost: float) -> tuple[Recorded, str | None]:
        """Write the record once; its conversation's next turn; the fidelity books. Also a stop reason when the
        answer left no faithful provider. A pause sample is written under the turn's next pause id, and the turn
        is left to do (no next turn, no tokens towards a target)."""
        lane, store = work.lane, work.lane.store
        paused = pauses(record.meta)
        if paused:
            record.id = store.next_pause_id(work.turn.id)
            lane.stats.counts["paused"] += 1
        written = record.id not in store.done
        if written:
            if not paused and work.turn.id in store.paused:
                lane.stats.counts["finished_after_pause"] += 1
            store.add_record(record, cost)
        next_turn = work.turn.next(record.answer) if written and not paused and not work.turn.ends(record.answer) \
            else None
        lane.stats.add_record(record, c.usage, cost)
        lane.fidelity.answer(c.provider, record.meta["fidelity"], record.finish_reason)
        stop = self._judged(c.provider, self.fidelity.answer(c.provider, record.meta["fidelity"], record.finish_reason))
        return Recorded(0 if paused else record.output_tokens, written, next_turn, paused), stop

    def refused(self, work: Work, outcome: Outcome) -> str | None:
        """An answer refused (its reasoning withheld, or its ids contradicted by the service's count): retried on
        another provider, counted against this one."""
        if outcome.error_class not in REFUSALS:
            return None
        count = outcome.error_class == COUNT_DISAGREES
        work.avoid.add(outcome.provider)
        work.lane.fidelity.refusal(outcome.provider, count=count)
        return self._judged(outcome.provider, self.fidelity.refusal(outcome.provider, count=count))

    def attempt(self, work: Work, outcome: Outcome, r: Rule, latency_s: float, booked: float) -> None:
        """Every attempt's counters: its provider's health, its errors, what it was booked at."""
        stats = work.lane.stats
        stats.booked_usd += booked
        provider = outcome.completion.provider if outcome.completion is not None else outcome.provider
        stats.attempt(provider, ok=outcome.completion is not None, rate_limited=r.rate_limited, latency_s=latency_s)
        if outcome.kind is not Kind.OK:
            stats.errors[outcome.error_class] += 1

    def retried(self, work: Work, *, cancelled: bool = False) -> None:
        """`cancelled`: the run closed its attempt (a suspect's stream) and sends it again: counted as its error."""
        work.lane.stats.counts["retried"] += 1
        if cancelled:
            work.lane.stats.errors[CANCELLED] += 1

    def fail(self, work: Work) -> None:
        """The turn failed for good: failures.jsonl, with its last error and its tries."""
        turn = work.turn
        chain: dict[str, Any] = {"conversation_id": turn.conversation.id, "turn": turn.number} \
            if turn.conversation.chained else {}
        if (rollout := turn.conversation.rollout) is not None:
            chain["environment"] = environment_label(rollout.task)
        work.lane.store.add_failure(turn.id, work.last_error or {}, work.tries, **chain)
        work.lane.stats.counts["failed"] += 1

    def _judged(self, provider: str, suspect: bool) -> str | None:
        """A provider just turned suspect: say so; when no eligible provider is left, the run stops."""
        if not suspect:
            return None
        evidence = self.fidelity.providers[provider].evidence
        cancelled = self.on_suspect(provider) if self.on_suspect else 0
        log.warning("provider %s left out of the rest of the run: suspect, %s%s", provider, evidence,
                    f"; its {cancelled} stream(s) in flight cancelled" if cancelled else "")
        eligible = set(self.routing.eligible_providers)
        if self.paid and eligible and eligible <= set(self.fidelity.suspects):
            return StopReason.NO_FAITHFUL_PROVIDERS
        return None
