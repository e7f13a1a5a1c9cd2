"""The requests in flight (pure): one ledger that admission (money) and pacing (tokens) both read.

Each request in flight is one `Flight`, opened when admission lets it start and closed when its attempt ends,
however it ends (an answer, an error, a cancel). Admission keeps its estimate of what the flight will cost on it,
pacing its estimate of the output tokens it will add; each keeps its running sums over the same flights, so the two
can never disagree about what is in flight.
"""
from __future__ import annotations

from collections.abc import ValuesView
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Flight:
    """One request in flight. `mean`/`var`/`log_mgf` (its cost) and `tokens`/`tokens_var`/`tokens_error` (its output
    tokens) are refreshed as it ages."""

    ticket: int
    lane: str
    started: float
    bound: float
    mean: float = 0.0
    var: float = 0.0
    log_mgf: np.ndarray | None = None  # log E[e^{θC} | age] per θ (admission's Chernoff bound)
    tokens: float = 0.0
    tokens_var: float = 0.0
    tokens_error: float = 0.0
    paced: bool = False  # pacing counts it (a flight opened by admission alone, in its tests, is not)
    streamed: float = 0.0  # output tokens its stream has delivered so far (0: not streamed, or nothing yet)
    cuttable: bool = False  # closing its stream stops its billing: at a target it is cut, kept as far as it got


@dataclass
class Flights:
    live: dict[int, Flight] = field(default_factory=dict)
    _lanes: dict[str, dict[int, Flight]] = field(default_factory=dict)
    _next: int = 0

    def open(self, now: float, bound: float, lane: str = "") -> Flight:
        self._next += 1
        f = self.live[self._next] = Flight(self._next, lane, now, bound)
        self._lanes.setdefault(lane, {})[f.ticket] = f
        return f

    def close(self, ticket: int) -> Flight:
        f = self.live.pop(ticket)
        del self._lanes[f.lane][ticket]
        return f

    def of(self, lane: str) -> dict[int, Flight]:
        """One dataset's flights, in the order they started."""
        return self._lanes.setdefault(lane, {})

    def values(self) -> ValuesView[Flight]:
        return self.live.values()

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, ticket: object) -> bool:
        return ticket in self.live
