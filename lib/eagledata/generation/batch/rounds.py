"""What each dataset's next batch holds (pure: from the targets, the turns and what came back; no service, no clock).

A round holds every turn that can be sent now: the next turns of conversations whose earlier answers are recorded
(turn j of a conversation goes in its j-th round), the lines to send again, and as many new conversations as the
target still needs (plan.py: the budget's estimate first, then a round that reaches the target with 90 % probability
on the measured lengths). A dataset's rounds are planned as its deepest conversation's turns plus one top-up
(`planned_rounds`, the budget's rule), fixed at its first round. A rerun picks up the conversations its journal names
(`resume`).
"""
from __future__ import annotations

from collections import deque
from typing import Literal

from ...errors import InputError
from ..conversations.turns import Conversation, Turn
from ..conversations.work import Work
from ..plan.route_plan import batch_rounds
from .journal import BatchEntry
from .plan import Need, TurnLengths, round_size
from .state import LaneBatches


class Rounds:
    """The planner of every dataset's rounds; `guess`: the answers' lengths before any is measured, `first_share`:
    the share of a target the first round aims at (`batch_first_round`)."""

    def __init__(self, guess: TurnLengths, first_share: float):
        self.guess, self.first_share = guess, first_share
        self._seq = 0

    def work(self, lb: LaneBatches, conversation: Conversation) -> Work:
        """The conversation's next request (after its recorded turns), with the tries its turn already had."""
        turn = lb.lane.first_turn(conversation)
        work = self._new(lb, turn, "new" if turn.number == conversation.first else "next")
        work.attempts, work.tries = lb.journal.attempts(turn.id), lb.journal.tries(turn.id)
        return work

    def next_turn(self, lb: LaneBatches, turn: Turn) -> Work:
        """A conversation's next turn, its answer before it just recorded: it goes in the next round."""
        work = self._new(lb, turn, "next")
        lb.ready.append(work)
        return work

    def _new(self, lb: LaneBatches, turn: Turn, source: Literal["new", "next"]) -> Work:
        self._seq += 1
        return Work(0.0, self._seq, turn, lb.lane, source=source)

    def find(self, lb: LaneBatches, ids: set[str]) -> None:
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

    def resume(self, lb: LaneBatches, entry: BatchEntry | None) -> list[Work]:
        """A rerun: the open conversations (recorded turns, not finished) back in hand, their next turns ready for
        the next round; returns those whose turn is a line of `entry`, the batch a killed run left."""
        done = lb.lane.store.done  # lines the killed run recorded (or failed for good) before it journaled the end
        wanted = set(lb.lane.store.chains) | {ln.conversation_id for ln in (entry.lines.values() if entry else ())
                                              if ln.custom_id not in done}
        self.find(lb, wanted)
        in_batch = []
        for cid, conversation in lb.conversations.items():
            work = self.work(lb, conversation)
            if entry is not None and work.turn.id in entry.lines:
                in_batch.append(work)
            elif cid in lb.lane.store.chains:
                lb.ready.append(work)
        return in_batch

    @staticmethod
    def planned_rounds(lb: LaneBatches) -> int:
        """The rounds the dataset is planned to take (budget.ipynb's rule, plan/route_plan.py): its deepest
        conversation's turns (turn j goes in round j) and one top-up; fixed when its first round is journaled."""
        if lb.journal.planned_rounds is not None:
            return lb.journal.planned_rounds
        deepest = max((len(Conversation.of(p, lb.lane.turns).asks) for p in lb.lane.scan), default=1)
        return batch_rounds(deepest)

    def lengths(self, lb: LaneBatches) -> TurnLengths:
        return TurnLengths.of(lb.lane.store.lengths, self.guess, lb.went_on, lb.ended)

    def plan(self, lb: LaneBatches) -> list[Work]:
        """The next round's lines: the conversations waiting for their next turn (the lines to send again among
        them), then new conversations, as many as the target needs (plan.round_size; all without a target)."""
        lane = lb.lane
        if lane.target is not None and lane.target_met:
            return []
        if lane.target is None:
            works, news = list(lb.ready), list(lb.prompts())
        else:
            lengths = self.lengths(lb)
            # every round but a first one on the guess is counted on by the plan: it aims to reach the target
            reach = bool(lb.journal.entries) or lengths.measured > 0
            size = round_size(Need(lane.target, lane.store.output_tokens),
                              [w.turn.conversation.last - w.turn.number + 1 for w in lb.ready],
                              (len(Conversation.of(p, lane.turns).asks) for p in lb.prompts()), lengths,
                              reach=reach, first_share=self.first_share)
            works, news = lb.ready[:size.ready], list(lb.unstarted)[:size.new]
        for p in news:
            lb.conversations[p.id] = conversation = Conversation.of(p, lane.turns)
            works.append(self.work(lb, conversation))
        return works

    @staticmethod
    def take(lb: LaneBatches, works: list[Work], n: int) -> list[Work]:
        """The first `n` of a planned round go (what fits the money and one input file): the ready turns left over
        (and those the plan left out) wait for the next round, the new conversations left over stay unstarted."""
        sent, kept = works[:n], works[n:]
        ready_ids, sent_ids = {id(w) for w in lb.ready}, {id(w) for w in sent}
        lb.ready = [w for w in lb.ready if id(w) not in sent_ids]
        for w in kept:
            if id(w) not in ready_ids:
                lb.conversations.pop(w.turn.conversation.id, None)
        started = {w.turn.conversation.id for w in sent}
        lb.unstarted = deque(p for p in lb.unstarted if p.id not in started)
        return sent
