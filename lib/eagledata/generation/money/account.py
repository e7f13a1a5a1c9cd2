"""The books of one run (pure): our own bookings, replaced by the account's figures as readings arrive.

We book `usage.cost` as answers arrive. An answer we could not read (cut body, lost connection, our own
timeout) may or may not have been billed: it is booked provisionally at its bound, and the next account
reading replaces it with the truth, unless what it cost is read first by its generation id (`resolve`: a stream the
run closed, readback.py). What the run spent is then

    charged at the last reading + everything booked since (a reading may lag by `lag_s`),

never less than what the answers themselves reported. The limit is the per-run cap and the balance
less the reserve, both in "money this run may spend".
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

FOREIGN_TOLERANCE_USD, FOREIGN_TOLERANCE_SHARE = 0.01, 0.005  # rounding of the account's figures


@dataclass(frozen=True)
class AccountReading:
    """One look at the account: `at` is when it was asked (the caller's clock)."""

    at: float
    usage_usd: float | None     # the key's lifetime usage
    balance_usd: float | None   # credits left (account, else the key's limit); None = unknown


@dataclass(slots=True)
class Booking:
    """One booking: an attempt's cost, or its bound while `provisional`; `recent` while no reading has covered it."""

    at: float
    amount: float
    provisional: bool
    lane: str
    recent: bool = True


@dataclass
class Books:
    lag_s: float = 5.0
    known_usd: float = 0.0          # Σ usage.cost (or tokens × price) of attempts we could read
    provisional_usd: float = 0.0    # Σ bounds of attempts we could not read (all of them, ever)
    first: AccountReading | None = None
    last: AccountReading | None = None
    known_by_lane: dict[str, float] = field(default_factory=dict)        # known_usd, by dataset
    provisional_by_lane: dict[str, float] = field(default_factory=dict)  # provisional_usd, by dataset
    _spent_at_last: float = 0.0     # our own figure when the last reading was asked
    _recent: deque[Booking] = field(default_factory=deque)  # booked since a reading − lag
    _recent_total: float = 0.0
    _recent_provisional: float = 0.0
    _pending_by_lane: dict[str, float] = field(default_factory=dict)  # _recent's provisional part, by dataset

    def book(self, now: float, amount: float, *, provisional: bool = False, lane: str = "") -> Booking:
        tally = self.provisional_by_lane if provisional else self.known_by_lane
        tally[lane] = tally.get(lane, 0.0) + amount
        if provisional:
            self.provisional_usd += amount
            self._pending_by_lane[lane] = self._pending_by_lane.get(lane, 0.0) + amount
        else:
            self.known_usd += amount
        booking = Booking(now, amount, provisional, lane)
        self._recent.append(booking)
        self._recent_total += amount
        self._recent_provisional += amount if provisional else 0.0
        return booking

    def resolve(self, booking: Booking, cost: float) -> None:
        """A provisional booking's cost, read by its generation id: booked at what it cost from now on, as an answer
        that reported its cost is (a reading that already covered it charged the same; the split between what the
        answers cost and what was booked at a bound, by dataset, now says the truth)."""
        if not booking.provisional:
            return
        lane, bound = booking.lane, booking.amount
        self.provisional_usd -= bound
        self.provisional_by_lane[lane] -= bound
        self.known_usd += cost
        self.known_by_lane[lane] = self.known_by_lane.get(lane, 0.0) + cost
        if booking.recent:
            self._recent_total += cost - bound
            self._recent_provisional -= bound
            self._pending_by_lane[lane] -= bound
        booking.amount, booking.provisional = cost, False

    def read(self, reading: AccountReading, spent_then: float | None = None) -> None:
        """A fresh reading (the first is the baseline). `spent_then`: `spent()` when it was asked."""
        if self.first is None or self.first.usage_usd is None:
            self.first = reading
        self.last = reading
        self._spent_at_last = self.spent() if spent_then is None else spent_then
        horizon = reading.at - self.lag_s
        while self._recent and self._recent[0].at <= horizon:
            b = self._recent.popleft()
            b.recent = False
            self._recent_total -= b.amount
            if b.provisional:
                self._recent_provisional -= b.amount
                self._pending_by_lane[b.lane] -= b.amount
        if not self._recent:
            self._recent_total = self._recent_provisional = 0.0  # no float drift
            self._pending_by_lane.clear()

    @property
    def charged_usd(self) -> float | None:
        """The account's usage delta since the run began, at the last reading."""
        if self.first is None or self.last is None or self.first.usage_usd is None or self.last.usage_usd is None:
            return None
        return self.last.usage_usd - self.first.usage_usd

    def spent(self) -> float:
        charged = self.charged_usd
        if charged is None or self.last is None or self.last is self.first:
            return self.known_usd + self.provisional_usd
        # Everything still in _recent was booked after the last reading's horizon.
        return max(self.known_usd + self._recent_provisional, charged + self._recent_total)

    def at_bound(self, lane: str | None = None) -> float:
        """Bookings at a bound that no reading has settled yet (of one dataset, or all): unreadable answers, which
        may have cost less, never more. Apart from the account's charge, which they are not (yet)."""
        if self.charged_usd is None:  # no reading carries usage: nothing ever settles them
            return self.provisional_usd if lane is None else self.provisional_by_lane.get(lane, 0.0)
        return max(self._recent_provisional if lane is None else self._pending_by_lane.get(lane, 0.0), 0.0)

    def lane_charged(self, lane: str) -> float:
        """One dataset's part of the account's delta, in a run over several: what its readable answers cost, and the
        rest of the delta (what the unreadable ones truly cost, or rounding) apportioned by its bookings at a bound
        (by its known costs when none was booked so). Apportioning the whole delta by bookings would hand a bound's
        excess over the truth to the datasets without errors, below what their own answers cost. An account behind
        our books (its lag) scales the known costs down. Without an account figure: its known costs."""
        known, charged = self.known_by_lane.get(lane, 0.0), self.charged_usd
        if charged is None:
            return known
        if charged < self.known_usd:
            return charged * known / self.known_usd
        weight, total = ((self.provisional_by_lane.get(lane, 0.0), self.provisional_usd) if self.provisional_usd > 0
                         else (known, self.known_usd))
        return known + ((charged - self.known_usd) * weight / total if total > 0 else 0.0)

    def pending_reconciliation(self) -> float | None:
        """When a reading would settle the provisional bookings it has not settled yet: the time of the newest
        one plus the lag. None when there are none, or when readings carry no usage to settle them with."""
        if self._recent_provisional <= 0 or self.last is None or self.last.usage_usd is None:
            return None
        newest = max((b.at for b in self._recent if b.provisional), default=None)
        if newest is None:  # the running total kept a float residue of settled bookings
            self._recent_provisional = 0.0
            self._pending_by_lane.clear()
            return None
        return newest + self.lag_s

    @property
    def foreign_usd(self) -> float:
        """Usage on the account that this run did not book: another spender on the key (our bookings bound
        what we spent from above — an unreadable answer is booked at its bound — so the excess is not ours)."""
        charged = self.charged_usd
        if charged is None:
            return 0.0
        excess = charged - (self.known_usd + self.provisional_usd)
        return excess if excess > max(FOREIGN_TOLERANCE_USD, FOREIGN_TOLERANCE_SHARE * charged) else 0.0

    def limit(self, max_spend_usd: float | None, reserve_usd: float) -> float:
        """The most this run may spend: the cap, and what the balance allows above the reserve."""
        limit = math.inf if max_spend_usd is None else max_spend_usd
        if self.last is not None and self.last.balance_usd is not None:
            spent_then = self.charged_usd if self.charged_usd is not None else self._spent_at_last
            limit = min(limit, spent_then + self.last.balance_usd - reserve_usd)
        return limit
