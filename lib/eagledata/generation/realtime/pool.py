"""Where the pool's slots are (pure, `now` passed in): every slot, at every moment, in exactly one state, integrated
over time, so a run can say how many of its `concurrency` slots had a request in flight and where the others were.

A slot's states (slots.py moves it; they add up to `concurrency` at every moment):

    in_flight   a request sent, its answer not yet in
    preparing   work taken, not sent yet: its prompt tokenized (a thread), admitted, started (the event loop's turns
                between these steps included); the ramp is mostly this
    money       work taken and tokenized, waiting for admission (ledger.py): the money left does not cover it yet, e.g.
                while streams cut at a target are booked at their bound until read back
    recording   an answer in: its record built (a thread) and settled, the slot let go, until it asks for work again
    idle        asking for work and given none (`dispatcher.take` said Wait), by why (the dispatcher's `cause`):
                  paced       every dataset with work left is held back by pacing (its bound, near its cut, cutting)
                  retry       the only work left is retries not due yet
                  turn        the only work left is conversations' next turns, their previous answers not in yet
                  congestion  the pool is at what congestion allows
                  done        nothing left to take (every target met, or every prompt taken), or the slot has ended

`PoolMeter.figures` is summary.json's `run.pool`: the mean slots in each state up to the last target and over the
whole run, and a timeline of the same (mean slots per state over each window, at most `POINTS` windows).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IN_FLIGHT, PREPARING, MONEY, RECORDING, IDLE, ENDED = "in_flight", "preparing", "money", "recording", "idle", "ended"
BUSY = (IN_FLIGHT, PREPARING, MONEY, RECORDING)  # a slot's own states (idle ones depend on the dispatcher's cause)
CAUSES = ("paced", "retry", "turn", "congestion", "done")  # why a slot asking for work got none
COLUMNS = [*BUSY, *(f"idle_{c}" for c in CAUSES)]  # the figures' states, in this order
POINTS = 120  # the pool's timeline in summary.json: at most this many windows (adjacent ones merged)


class PoolMeter:
    """Counts the slots in each state and integrates them over time. `move(old, new, now)` when a slot changes
    state; `cause(why, now)` when the dispatcher's reason for idle slots changes; `sample(now)` closes a window of
    the timeline; `mark(now)` notes the totals at the last target."""

    def __init__(self, slots: int, t0: float):
        self.slots, self.t0, self.last = slots, t0, t0
        self.count = {IN_FLIGHT: 0, PREPARING: slots, MONEY: 0, RECORDING: 0, IDLE: 0, ENDED: 0}  # at start: starting
        self.why = "done"
        self.total = dict.fromkeys(COLUMNS, 0.0)  # slot-seconds in each state since t0
        self.rows: list[tuple[float, list[float]]] = []  # (window's end, slot-seconds in it per column)
        self._window_start, self._window = t0, dict.fromkeys(COLUMNS, 0.0)
        self.at_target: tuple[float, dict[str, float]] | None = None  # (t, totals) when the last target was met

    def _advance(self, now: float) -> None:
        """Integrate the counts up to `now`; nothing once every slot has ended (the summaries' own work after)."""
        dt = now - self.last
        if dt <= 0 or self.count[ENDED] == self.slots:
            return
        for state in BUSY:
            if n := self.count[state]:
                self.total[state] += n * dt
                self._window[state] += n * dt
        idle = f"idle_{self.why}"
        if n := self.count[IDLE]:
            self.total[idle] += n * dt
            self._window[idle] += n * dt
        if n := self.count[ENDED]:
            self.total["idle_done"] += n * dt
            self._window["idle_done"] += n * dt
        self.last = now

    def move(self, old: str, new: str, now: float) -> None:
        """One slot goes from state `old` to `new` (IN_FLIGHT … IDLE, or ENDED once it stops)."""
        if old == new:
            return
        if self.count[old] <= 0:
            raise ValueError(f"pool: a slot left {old!r} with none there")
        self._advance(now)
        self.count[old] -= 1
        self.count[new] += 1

    def cause(self, why: str, now: float) -> None:
        """Why a slot asking for work now gets none (one of CAUSES): the idle slots are counted under it from now."""
        if why not in CAUSES:
            raise ValueError(f"pool: unknown idle cause {why!r}")
        if why != self.why:
            self._advance(now)
            self.why = why

    def sample(self, now: float) -> None:
        """Close the timeline's window at `now` (the reporter's samples, a few a second)."""
        self._advance(now)
        end = self.last  # `now`, or when the last slot ended
        if end > self._window_start:
            self.rows.append((end - self.t0, [self._window[c] for c in COLUMNS]))
            self._window_start, self._window = end, dict.fromkeys(COLUMNS, 0.0)

    def mark(self, now: float) -> None:
        """The last target was met now: the totals up to here are the run's main figure."""
        if self.at_target is None:
            self._advance(now)
            self.at_target = (now - self.t0, dict(self.total))

    def figures(self, now: float) -> dict[str, Any]:
        """summary.json's `run.pool`: mean slots per state up to the last target (`until_last_target`, null when a
        target was not met or the run had none) and up to the slots' end (`whole_run`; now, while some run), and
        the timeline (`timeline_columns`, `timeline`: rows of the window's end in seconds and its mean slots per
        state)."""
        self._advance(now)
        until = None if self.at_target is None else _means(self.at_target[1], self.at_target[0], self.slots)
        return {"slots": self.slots, "until_last_target": until,
                "whole_run": _means(self.total, self.last - self.t0, self.slots),
                "timeline_columns": ["t_s", *COLUMNS], "timeline": _thinned(self.rows)}


def _means(total: dict[str, float], seconds: float, slots: int) -> dict[str, Any]:
    """Mean slots per state over `seconds`, and in flight as a share of the pool."""
    if seconds <= 0:
        return {"seconds": 0.0, "mean": dict.fromkeys(COLUMNS, 0.0), "in_flight_share": None}
    mean = {c: round(total[c] / seconds, 2) for c in COLUMNS}
    return {"seconds": round(seconds, 3), "mean": mean, "in_flight_share": round(total[IN_FLIGHT] / seconds / slots, 4)}


def _thinned(rows: Sequence[tuple[float, list[float]]]) -> list[list[float]]:
    """The windows merged into at most POINTS of about equal length; each row is its end and the mean slots per
    state over it."""
    if not rows:
        return []
    span = rows[-1][0]
    step = span / POINTS if span > 0 else 1.0
    out: list[list[float]] = []
    start, acc, edge = 0.0, [0.0] * len(COLUMNS), step
    for end, values in rows:
        acc = [a + v for a, v in zip(acc, values)]
        if end >= edge - 1e-9 or end == span:
            width = end - start
            out.append([round(end, 2), *(round(a / width, 2) if width > 0 else 0.0 for a in acc)])
            start, acc = end, [0.0] * len(COLUMNS)
            edge = (int(end / step) + 1) * step
    return out
