"""Admission (pure): may one more request start without risking the budget?

A request is charged when it ends, up to its bound b = prompt × worst prompt price + max_tokens × worst
completion price. Reserving b for every request in flight ("strict") is a proof, but b is ~18× the mean
answer, so it caps a $95 run at ~960 in flight and starves it as money runs out. "portfolio" commits

    spent + Σ E[C_i | age_i] + min(Bernstein margin, Σ (b_i − E[C_i | age_i]))

where the margin makes P(in-flight requests cost more than committed) ≤ `overshoot_probability`.
E[C | age] matters: requests in flight are length-biased (long answers stay longer), so their
unconditional mean under-books them about twofold. It comes from a Kaplan–Meier estimate over this
run's finished attempts, with the requests in flight as censored at their age; mass beyond the longest
finished attempt costs the prior's tail (earlier records of the dataset, else the budget model's guess).
A request's cost is bounded by b, so the margin needs no distributional assumption beyond independence.

That margin is loose when few requests are in flight: its first term (b × ln(1/p) / 3, about 4.6 worst cases at
1e-6) says "one request may cost its bound", so near the end of the money it admits only what every worst case
covers and the last few percent trickle out a handful at a time (measured: issuing went on to ~3× the ideal). So a
request is also admitted when a Chernoff bound on the same estimate says the same risk holds:

    P(Σ C_i > money left) ≤ min over θ of exp(−θ·left + Σ log E[e^{θ C_i} | age_i]) ≤ p,

with E[e^{θC} | age] from the same Kaplan–Meier estimate (mass beyond the longest finished attempt at the prior's
tail), mixed with one pseudo-answer that cost its full bound (ε = 1/(events + 1)), so that an estimate that has seen
no worst case still allows for one; the shared error of the estimated means is taken off the money left first, as in
the Bernstein check. Each bound is valid on its own, so a request that passes either (or strict) is admitted.
`trickle` says when the money left, once what is in flight settles, buys too few requests to be worth waiting for.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .flights import Flight, Flights

BudgetMode = Literal["portfolio", "strict"]
MAX_EVENTS = 100_000      # finished attempts the estimate keeps (the newest)
PRIOR_WEIGHT = 30         # pseudo-observations the prior is worth in the estimation-error term
# The Chernoff bound's θ grid, in units of 1 / (the largest bound): θ·b up to 200 keeps e^{θC} finite in float64
# and covers the optimum from thousands of requests in flight (small θ) down to one (θ·b ≈ ln(1/p) and beyond).
THETA_GRID = np.geomspace(0.02, 200.0, 24)
# Near the money's end, stop issuing (`stop_rule`) once the money left after what is in flight settles is under 2 % and
# buys fewer than 5 % of concurrency at the set risk (`trickle`), or, before the estimate can say so, once under 5 % of
# concurrency is in flight with under 2 % of the money left: topping up a handful in flight, one by one, is minutes
# of crawl for ~2 % of the money.
TRICKLE = TAIL_IN_FLIGHT = 0.05
TAIL_MONEY = 0.02


class AgeModel:
    """What a request still in flight will amount to, given how long it has been running: its cost for
    admission, its output tokens for pacing (pacing.py). Mean and variance of that size, conditioned on age."""

    def __init__(self, prior: Sequence[float]):
        ordered = np.sort(np.asarray(prior, dtype=float))
        if ordered.size == 0 or not np.all(np.isfinite(ordered)) or ordered[0] < 0:
            raise ValueError("the prior needs finite, non-negative samples")
        self.prior = ordered
        self._prior_suffix1 = np.cumsum(ordered[::-1])[::-1]
        self._prior_suffix2 = np.cumsum((ordered ** 2)[::-1])[::-1]
        self.thetas: np.ndarray | None = None
        self.latencies: list[float] = []
        self.sizes: list[float] = []
        self.fit(np.zeros(0))

    def enable_mgf(self, thetas: np.ndarray, size_cap: float) -> None:
        """Also estimate E[e^{θ·size} | age] at these θ (admission's Chernoff bound; pacing needs none), sizes taken
        at most `size_cap` (a request costs at most its bound: this only keeps e^{θ·size} finite)."""
        self.thetas, self._size_cap = np.asarray(thetas, dtype=float), size_cap
        capped = np.minimum(self.prior[::-1], size_cap)
        self._prior_mgf_suffix = np.cumsum(np.exp(np.outer(self.thetas, capped)), axis=1)[:, ::-1]
        self._mgf_suffix: np.ndarray | None = None

    @property
    def events(self) -> int:
        return len(self.sizes)

    def observe(self, latency: float, size: float) -> None:
        """A finished attempt whose size is known (a cost of 0 for an error the service does not bill)."""
        self.latencies.append(latency)
        self.sizes.append(size)
        if len(self.sizes) > 2 * MAX_EVENTS:
            del self.latencies[:MAX_EVENTS], self.sizes[:MAX_EVENTS]

    def _tail(self, floor: float) -> tuple[float, float]:
        """First and second moment of the prior above `floor` (the prior's top sample when none is)."""
        i = int(np.searchsorted(self.prior, floor, "left"))
        if i >= self.prior.size:
            top = float(self.prior[-1])
            return max(top, floor), max(top, floor) ** 2
        k = self.prior.size - i
        return float(self._prior_suffix1[i] / k), float(self._prior_suffix2[i] / k)

    def _tail_mgf(self, floor: float) -> np.ndarray:
        """E[e^{θ·size}] of the prior above `floor`, per θ (its top sample when none is above)."""
        assert self.thetas is not None
        i = int(np.searchsorted(self.prior, floor, "left"))
        if i >= self.prior.size:
            return np.exp(self.thetas * min(max(float(self.prior[-1]), floor), self._size_cap))
        return self._prior_mgf_suffix[:, i] / (self.prior.size - i)

    def fit(self, in_flight_ages: np.ndarray) -> None:
        """Kaplan–Meier over the finished attempts, the requests now in flight censored at their ages."""
        self._mgf_suffix = None  # computed when first asked for (`mgf`): only near the end of the money
        t = np.asarray(self.latencies[-MAX_EVENTS:], dtype=float)
        c = np.asarray(self.sizes[-MAX_EVENTS:], dtype=float)
        order = np.argsort(t, kind="stable")
        t, c = t[order], c[order]
        n = t.size
        self._t = t
        if not n:
            self._suffix1 = self._suffix2 = np.zeros(1)
            self._s_at, self._residual = np.ones(1), 1.0
            self._r = self._tail(0.0)
            self._c = self._mass = np.zeros(0)
            return
        at_risk = (n - np.arange(n)) + (in_flight_ages.size - np.searchsorted(np.sort(in_flight_ages), t, "left"))
        survive = np.cumprod(1.0 - 1.0 / at_risk)
        before = np.concatenate(([1.0], survive[:-1]))
        mass = before / at_risk
        self._suffix1 = np.concatenate((np.cumsum((mass * c)[::-1])[::-1], [0.0]))
        self._suffix2 = np.concatenate((np.cumsum((mass * c * c)[::-1])[::-1], [0.0]))
        self._residual = float(survive[-1])
        self._s_at = np.concatenate((before, [self._residual]))
        self._r = self._tail(float(c.max()))
        self._c, self._mass = c, mass

    def moments(self, ages: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """E[C | A > age] and Var[C | A > age] by the last `fit` (each capped by its bound)."""
        j = np.searchsorted(self._t, ages, "right")
        s = self._s_at[j]
        (r1, r2), residual = self._r, self._residual
        with np.errstate(divide="ignore", invalid="ignore"):
            m1 = np.where(s > 0, (self._suffix1[j] + residual * r1) / s, r1)
            m2 = np.where(s > 0, (self._suffix2[j] + residual * r2) / s, r2)
        m1 = np.minimum(m1, bounds)
        m2 = np.minimum(np.maximum(m2, m1 * m1), bounds * bounds)
        return m1, m2 - m1 * m1

    def mgf(self, ages: np.ndarray) -> np.ndarray:
        """E[e^{θ·size} | A > age] by the last `fit`, [len(ages), len(thetas)] (`enable_mgf` first)."""
        assert self.thetas is not None
        if self._mgf_suffix is None:
            weighted = self._mass * np.exp(np.outer(self.thetas, np.minimum(self._c, self._size_cap)))  # [θ, event]
            self._mgf_suffix = np.concatenate((np.cumsum(weighted[:, ::-1], axis=1)[:, ::-1],
                                               np.zeros((self.thetas.size, 1))), axis=1)
            self._r_mgf = self._tail_mgf(float(self._c.max()) if self._c.size else 0.0)
        j = np.searchsorted(self._t, ages, "right")
        s = self._s_at[j]
        with np.errstate(divide="ignore", invalid="ignore"):
            m = (self._mgf_suffix[:, j] + self._residual * self._r_mgf[:, None]) / s
        return np.where(s > 0, m, self._r_mgf[:, None]).T

    def events_beyond(self, ages: np.ndarray) -> np.ndarray:
        """How many finished attempts (of the last `fit`) took longer than each age: what E[· | age] rests on."""
        return self._t.size - np.searchsorted(self._t, ages, "right")

    def prior_tail(self, floor: float) -> tuple[float, float]:
        """Mean and variance of the prior above `floor`: past every finished attempt, what only the prior knows."""
        m1, m2 = self._tail(floor)
        return m1, max(0.0, m2 - m1 * m1)

    def new_request(self, bound: float) -> tuple[float, float]:
        """Moments of a request about to start (age 0, nothing else conditioned on)."""
        m, v = self.moments(np.zeros(1), np.array([bound]))
        return float(m[0]), float(v[0])


def bernstein_margin(variance: float, largest_bound: float, log_inv_p: float) -> float:
    """t with exp(−t² / (2V + 2Mt/3)) = p: Bernstein's tail bound for a sum of independent terms in [0, M]."""
    a = largest_bound * log_inv_p / 3.0
    return a + math.sqrt(a * a + 2.0 * variance * log_inv_p)


@dataclass
class ChernoffSums:
    """The Chernoff bound's state: Σ log E[e^{θC_i} | age_i] over the requests in flight (`total`), on a θ grid
    scaled to the bounds admitted. Each estimate is mixed with one pseudo-answer that cost its whole bound (weight:
    one among the answers seen), so a short history cannot promise a thin tail. Kept live only while the money binds:
    refitting costs ~4× a refresh."""

    model: AgeModel
    scale: float = 0.0                   # the bound the θ grid is scaled to
    total: np.ndarray | None = None      # None: stale (refit when asked)
    _new: np.ndarray | None = None       # E[e^{θC}] of a new request, cached between refreshes

    def use_scale(self, bound: float) -> None:
        """Scale the θ grid to the bounds admitted (once; again only if a bound is far past it)."""
        if self.scale and bound <= 2 * self.scale:
            return
        self.scale = max(bound, self.scale)
        self.model.enable_mgf(THETA_GRID / self.scale, size_cap=2 * self.scale)
        self._new = self.total = None

    def stale(self) -> None:
        """The estimates moved (a refresh): a new request's and the sums are recomputed when next asked for."""
        self._new = self.total = None

    def of(self, mgf: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """log of the estimate mixed with the pseudo-answer at each request's bound ([n, θ] in, [n, θ] out)."""
        assert self.model.thetas is not None
        eps = 1.0 / (self.model.events + 1)
        with np.errstate(divide="ignore"):
            return np.logaddexp(np.log1p(-eps) + np.log(mgf) if eps < 1 else -np.inf,
                                math.log(eps) + np.outer(bounds, self.model.thetas))

    def new(self, bound: float) -> np.ndarray:
        """log E[e^{θC}] of a new request of `bound`."""
        if self._new is None:
            self._new = self.model.mgf(np.zeros(1))
        return self.of(self._new, np.array([bound]))[0]

    def refit(self, flights: list[Flight], now: float) -> None:
        """Every flight's log E[e^{θC} | age] at `now` (kept on the flight, to take it out when it ends), and
        their sum."""
        self.total = np.zeros(THETA_GRID.size)
        if not flights:
            return
        ages = np.maximum(np.array([now - f.started for f in flights]), 0.0)
        logs = self.of(self.model.mgf(ages), np.array([f.bound for f in flights]))
        for f, row in zip(flights, logs):
            f.log_mgf = row
        self.total = logs.sum(axis=0)


@dataclass
class Admission:
    """The requests in flight and what they commit. Times are the caller's clock (tests simulate it). `flights` is
    the run's one ledger of requests in flight (pacing reads it too): admission opens a flight when a request starts
    and closes it when its attempt ends."""

    model: AgeModel
    mode: BudgetMode = "portfolio"
    overshoot_probability: float = 1e-6
    flights: Flights = field(default_factory=Flights)
    _mean0: tuple[float, float] | None = None  # moments of a new request, cached between refreshes
    _sums: np.ndarray = field(default_factory=lambda: np.zeros(5))  # Σ mean, slack, var, sd, bound
    _largest: float = 0.0
    _now: float = 0.0                          # the last refresh

    def __post_init__(self) -> None:
        if not 0 < self.overshoot_probability < 1:
            raise ValueError("overshoot_probability must be in (0, 1)")
        self.log_inv_p = math.log(1.0 / self.overshoot_probability)
        self.z = math.sqrt(2.0 * self.log_inv_p)
        self.chernoff = ChernoffSums(self.model)

    def _new_moments(self, bound: float) -> tuple[float, float]:
        if self.mode == "strict":
            return bound, 0.0
        if self._mean0 is None:
            self._mean0 = self.model.new_request(math.inf)
        m, v = self._mean0
        return min(m, bound), v

    def _add(self, f: Flight, sign: float) -> None:
        # Sums of non-negative terms: float drift below zero is clamped (a negative variance is a math error).
        self._sums = np.maximum(self._sums + sign * np.array([f.mean, f.bound - f.mean, f.var, math.sqrt(f.var),
                                                               f.bound]), 0.0)
        total = self.chernoff.total
        if f.log_mgf is not None and total is not None:  # log E[e^{θC}] >= 0 for C >= 0: clamped as well
            self.chernoff.total = np.maximum(total + sign * f.log_mgf, 0.0)

    # -- the Chernoff bound ------------------------------------------------------------------------------
    def _estimate_error(self, sds: float) -> float:
        """The means are estimated: their error is shared by every request in flight (fully correlated)."""
        return self.z * sds / math.sqrt(self.model.events + PRIOR_WEIGHT)

    def chernoff_fits(self, bound: float, left: float) -> bool:
        """P(what is in flight plus this request costs more than `left`) <= p by the Chernoff bound."""
        if self.mode == "strict":
            return False
        self.chernoff.use_scale(bound)
        _, v = self._new_moments(bound)
        left -= self._estimate_error(self._sums[3] + math.sqrt(v))
        if left <= 0:
            return False
        if self.chernoff.total is None:
            self.chernoff.refit(list(self.flights.values()), self._now)
        assert self.model.thetas is not None and self.chernoff.total is not None
        exponent = -self.model.thetas * left + self.chernoff.total + self.chernoff.new(bound)
        return float(exponent.min()) <= -self.log_inv_p

    def capacity(self, bound: float, left: float) -> int:
        """How many new requests of bound `bound`, with nothing else in flight, `left` carries at the set risk:
        what the money buys once the requests in flight have settled."""
        if left <= 0:
            return 0
        if self.mode == "strict":
            return int(left // bound)
        self.chernoff.use_scale(bound)
        assert self.model.thetas is not None
        lam = self.chernoff.new(bound)
        err = self._estimate_error(math.sqrt(self._new_moments(bound)[1]))
        # k requests fit when −θ·(left − k·err) + k·λ(θ) <= −ln(1/p) for some θ.
        with np.errstate(divide="ignore", invalid="ignore"):
            k = (self.model.thetas * left - self.log_inv_p) / (lam + self.model.thetas * err)
        return max(int(left // bound), int(np.nanmax(np.floor(k))) if k.size else 0, 0)

    def trickle(self, bound: float, spent: float, limit: float, min_requests: float, max_share: float) -> bool:
        """The pool has shrunk under 2 × `min_requests` in flight, and the money left once they settle (at their
        expected cost) is under `max_share` of `limit` and buys fewer than `min_requests` new requests at the set
        risk: waiting for it would keep a handful in flight, each a possible straggler of minutes, for a few percent
        of the money. Judged only once the estimate rests on 20 × `min_requests` answers of this run. (The expected
        cost of an old request leans on the prior's pessimistic tail; with many in flight it under-states the money
        left, so a full pool never counts as a trickle: it settles first.)"""
        if self.model.events < 20 * min_requests or len(self.flights) >= 2 * min_requests:
            return False
        left = limit - spent - float(self._sums[0])
        return left < max_share * limit and self.capacity(bound, left) < min_requests

    def stop_rule(self, bound: float, spent: float, limit: float, concurrency: int) -> str | None:
        """Why issuing should stop, now that a request of `bound` does not fit; None: wait for money to free up."""
        flights = len(self.flights)
        if not flights:
            return "nothing in flight, and one more request does not fit"
        if self.trickle(bound, spent, limit, TRICKLE * concurrency, TAIL_MONEY):
            return (f"once the {flights} requests in flight settle, the money left is under {TAIL_MONEY:.0%} and buys "
                    f"fewer than {TRICKLE:.0%} of concurrency at the set risk")
        if flights < TAIL_IN_FLIGHT * concurrency and limit - spent < TAIL_MONEY * limit:
            return f"under {TAIL_IN_FLIGHT:.0%} of concurrency in flight with under {TAIL_MONEY:.0%} of the money left"
        return None

    # -- admission ------------------------------------------------------------------------------------
    def commitment(self, extra_bound: float | None = None) -> float:
        """Money the requests in flight (plus one of bound `extra_bound`) may still cost, at the set confidence
        (the Bernstein margin; `chernoff_fits` is the other test)."""
        means, slack, variance, sds, bounds = self._sums.tolist()
        largest = self._largest
        if extra_bound is not None:
            m, v = self._new_moments(extra_bound)
            means, slack, variance, sds, bounds = (means + m, slack + extra_bound - m, variance + v,
                                                   sds + math.sqrt(v), bounds + extra_bound)
            largest = max(largest, extra_bound)
        elif not self.flights:
            return 0.0
        if self.mode == "strict":
            return bounds
        margin = bernstein_margin(variance, largest, self.log_inv_p) + self._estimate_error(sds)
        return means + min(margin, max(0.0, slack))

    def fits(self, bound: float, spent: float, limit: float) -> bool:
        """Never less than strict admission: what fits every worst case fits (the margin is capped by the
        slack, so portfolio's commitment is at most the bounds; the min says so outright). Either tail bound
        (Bernstein's, or Chernoff's on the estimated distribution) passing is enough: each holds the risk alone."""
        strict = self._sums[4] + bound if self.flights else bound
        if spent + min(self.commitment(bound), strict) <= limit:
            return True
        return self.chernoff_fits(bound, limit - spent)

    def start(self, now: float, bound: float, lane: str = "") -> int:
        """A request of `bound` starts (for dataset `lane`): its flight's ticket."""
        f = self.flights.open(now, bound, lane)
        f.mean, f.var = self._new_moments(bound)
        if self.chernoff.total is not None:  # the Chernoff sums are live (the money binds): keep them so
            f.log_mgf = self.chernoff.new(bound)
        self._add(f, 1.0)
        self._largest = max(self._largest, bound)
        return f.ticket

    def end(self, ticket: int, now: float, cost: float | None) -> None:
        """The attempt ended, however (an answer, an error, a cancel): its flight closes. `cost` None when unknown
        (it may have been billed: the account will tell)."""
        f = self.flights.close(ticket)
        self._add(f, -1.0)
        if not self.flights:
            self._sums[:] = 0.0  # no float drift once nothing is in flight
            self._largest = 0.0
            if self.chernoff.total is not None:
                self.chernoff.total[:] = 0.0
        if cost is not None:
            self.model.observe(now - f.started, cost)

    def refresh(self, now: float) -> None:
        """Re-estimate every request in flight at its current age (call a few times a second). The sums are
        recomputed from the flights, so no drift outlives a refresh."""
        self._mean0 = None
        self.chernoff.stale()  # `chernoff_fits` recomputes the sums if the money binds before the next refresh
        self._now = now
        if self.mode == "strict":
            return
        if not self.flights:
            self.model.fit(np.zeros(0))
            return
        flights = list(self.flights.values())
        ages = np.array([now - f.started for f in flights])
        bounds = np.array([f.bound for f in flights])
        self.model.fit(ages)
        means, variances = self.model.moments(ages, bounds)
        for f, m, v in zip(flights, means.tolist(), variances.tolist()):
            f.mean, f.var = m, v
        self._sums = np.zeros(5)
        for f in flights:
            f.log_mgf = None
            self._add(f, 1.0)
        self._largest = float(bounds.max())
