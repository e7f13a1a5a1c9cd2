"""One request's worth of work (pure): a conversation's turn on its way through a run, and its lifecycle.

    queued ──take──▶ admitted ──▶ sent ──▶ settled     (answered and recorded, or failed for good)
       ▲                 │          ├────▶ cancelled   (cut off as the run stops: booked, not recorded, still to do)
       └──── retried ◀───┼──────────┘                  (back to its dataset's retry heap once its slot lets go;
                         │                              also an attempt the run cut off while going on)
                         └─ given back unstarted (money gone, the run stopping): still to do, for the next run

Only the dispatcher moves a work item (dispatcher.py); an illegal move is a bug and raises, so the engine stops
cleanly instead of counting a request twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from .turns import Turn


class State(StrEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    SENT = "sent"
    SETTLED = "settled"
    CANCELLED = "cancelled"
    RETRIED = "retried"


MOVES: dict[State, tuple[State, ...]] = {
    State.QUEUED: (State.ADMITTED,),
    State.ADMITTED: (State.SENT,),
    State.SENT: (State.SETTLED, State.CANCELLED, State.RETRIED),
    State.RETRIED: (State.QUEUED,),
    State.SETTLED: (),
    State.CANCELLED: (),
}


@dataclass(order=True)
class Work:
    """A turn on its way. Due time and sequence order a dataset's retry heap; the rest is its retry state and the
    one ticket of its attempt in flight (the run's ledger of flights: money and pacing read the same one)."""

    due: float
    seq: int
    turn: Turn = field(compare=False)
    lane: Any = field(compare=False)  # the lanes.DatasetRun it belongs to (lanes.py makes work: not imported here)
    source: Literal["new", "next", "retry"] = field(default="new", compare=False)  # where `take` found it
    state: State = field(default=State.QUEUED, compare=False)
    attempts: int = field(default=0, compare=False)       # those that count against max_attempts
    tries: int = field(default=0, compare=False)          # every request sent
    rate_limited: int = field(default=0, compare=False)   # 429s in a row
    prompt_ids: list[int] | None = field(default=None, compare=False)
    bound: float = field(default=0.0, compare=False)      # the most one attempt can cost
    last_error: dict | None = field(default=None, compare=False)
    ticket: int | None = field(default=None, compare=False)   # its flight while admitted or sent
    sent_at: float = field(default=0.0, compare=False)    # when this attempt was sent (its latency)
    avoid: set[str] = field(default_factory=set, compare=False)  # providers that refused this prompt's answer

    def move(self, to: State) -> None:
        if to not in MOVES[self.state]:
            raise RuntimeError(f"work {self.turn.id}: {self.state} -> {to} is not a move")
        self.state = to

    @property
    def started(self) -> bool:
        """This attempt was sent (pacing counts it in flight, or counted it until it settled)."""
        return self.state not in (State.QUEUED, State.ADMITTED)
