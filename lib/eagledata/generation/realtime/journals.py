"""The streams journals of one streaming run (killed.py's `StreamJournal`, a dataset each): what the engine tells them
(a stream named, what the streams delivered, a stream ended, the run begun, every summary written), and what the run
after a kill reads of them into its datasets' `killed_before` (the prefixes kept: salvage.py) and its
`killed_wasted_usd`."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import httpx

from ...openrouter.stream import NO_MARK
from ..lanes import DatasetRun
from ..money.killed import Baseline, Delivered, KilledBefore, StreamJournal, read_killed
from .attempt import Attempt

log = logging.getLogger("eagledata.generate")
FLUSH_S = 1.0  # what the streams delivered is journaled this often: a kill loses at most this much of each
Keep = Callable[[DatasetRun, dict[str, Delivered], KilledBefore], Awaitable[None]]


class Journals:
    """A `StreamJournal` per dataset of the run (`of`, by name)."""

    def __init__(self, lanes: Iterable[DatasetRun]):
        self.lanes = {lane.name: lane for lane in lanes}
        self.of = {name: StreamJournal(lane.store.files.directory / "streams.jsonl")
                   for name, lane in self.lanes.items()}

    def named(self, attempt: Attempt) -> None:
        """The service named a stream's generation (its response's first bytes): journaled at once, so that a kill
        from now on leaves its id for the next run to read."""
        if attempt.state is not None and attempt.work is not None:
            turn = attempt.work.turn
            self.of[attempt.work.lane.name].started(attempt.state.generation_id, turn.id, turn.conversation.id)
            attempt.journaled = True

    def flush(self, streaming: Iterable[Attempt]) -> None:
        """What each journaled stream delivered since the last flush, a write per dataset (every FLUSH_S)."""
        texts: dict[str, list[dict]] = {}
        for attempt in streaming:
            state, work = attempt.state, attempt.work
            if not attempt.journaled or state is None or work is None:
                continue
            delta, mark = state.delivered_since(attempt.journal_mark)
            if not delta:
                continue
            line = {"text": state.generation_id, **delta}
            if attempt.journal_mark == NO_MARK:
                line.update(provider=state.provider, model=state.model)
            attempt.journal_mark = mark
            texts.setdefault(work.lane.name, []).append(line)
        for name, lines in texts.items():
            self.of[name].append_text(lines)

    def ended(self, attempt: Attempt) -> None:
        if attempt.journaled and attempt.state is not None and attempt.work is not None:
            self.of[attempt.work.lane.name].ended(attempt.state.generation_id)

    async def read_killed(self, client: httpx.AsyncClient, *, again: bool = False, keep: Keep | None = None) -> None:
        """What the streams an earlier, killed run left cost, into each dataset's `killed_before` (`again`: those the
        service did not know yet, at the run's end); `keep` records what they had delivered (salvage.py), before each
        journal is left with what is still unknown."""
        for name, journal in self.of.items():
            lane = self.lanes[name]
            if again:  # the ids the service did not know at the start, read again
                if not (lane.killed_before and lane.killed_before.unread):
                    continue
                lane.killed_before = await read_killed(client, [], lane.killed_before)
            elif journal.before or journal.carried:  # with what earlier killed runs read and could not show
                read = await read_killed(client, journal.before) if journal.before else KilledBefore()
                lane.killed_before = read.add(journal.carried)
                if keep is not None and journal.delivered:
                    await keep(lane, journal.delivered, lane.killed_before)
            else:
                continue
            # read once: never counted again by a later run, but carried until this run's summary shows it
            journal.rewrite(lane.killed_before.unread, carry=lane.killed_before)

    def begin(self, usage_usd: float) -> float | None:
        """The run begins with the account's usage at `usage_usd`: journaled as its baseline. Returns what the killed
        runs since the first killed run's baseline kept here were charged beyond what their records cost (None: no
        killed run, or several over other datasets)."""
        recorded = {name: lane.store.spend_usd for name, lane in self.lanes.items()}
        killed = {j.killed for j in self.of.values() if j.killed is not None}
        wasted = killed.pop().wasted(usage_usd, recorded) if len(killed) == 1 else None
        if killed:  # killed runs over other datasets too, their spans on the account overlapping
            log.warning("generation: %d killed runs over different datasets since the last summaries: what they "
                        "wasted is read by stream only (run.killed_before)", len(killed))
        here = Baseline(usage_usd, sum(recorded.values()), tuple(self.lanes))
        for journal in self.of.values():
            journal.begin(here)
        return wasted

    def summarized(self) -> None:
        """Every summary is written: what the journals carried is shown, and goes (the baseline with it)."""
        for name, journal in self.of.items():
            before = self.lanes[name].killed_before
            journal.rewrite(before.unread if before else [], summarized=True)
