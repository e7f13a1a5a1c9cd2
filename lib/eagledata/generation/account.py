"""The books of one run (pure): our own bookings, replaced by the account's figures as readings arrive.

We book `usage.cost` as answers arrive. An answer we could not read (cut body, lost connection, our own
timeout) may or may not have been billed: it is booked provisionally at its bound, and the next account
reading replaces it with the truth. What the run spent is then

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


@dataclass
class Books:
    lag_s: float = 5.0
    known_usd: float = 0.0          # Σ usage.cost (or tokens × price) of attempts we could read
    provisional_usd: float = 0.0    # Σ bounds of attempts we could not read (all of them, ever)
    first: AccountReading | None = None
    last: AccountReading | None = None
    _spent_at_last: float = 0.0     # our own figure when the last reading was asked
    _recent: deque = field(default_factory=deque)  # (time, amount, provisional) booked since a reading − lag
    _recent_total: float = 0.0
    _recent_provisional: float = 0.0

    def book(self, now: float, amount: float, *, provisional: bool = False) -> None:
        if provisional:
            self.provisional_usd += amount
        else:
            self.known_usd += amount
        self._recent.append((now, amount, provisional))
        self._recent_total += amount
        self._recent_provisional += amount if provisional else 0.0

    def read(self, reading: AccountReading, spent_then: float | None = None) -> None:
        """A fresh reading (the first is the baseline). `spent_then`: `spent()` when it was asked."""
        if self.first is None or self.first.usage_usd is None:
            self.first = reading
        self.last = reading
        self._spent_at_last = self.spent() if spent_then is None else spent_then
        horizon = reading.at - self.lag_s
        while self._recent and self._recent[0][0] <= horizon:
            _, amount, provisional = self._recent.popleft()
            self._recent_total -= amount
            self._recent_provisional -= amount if provisional else 0.0
        if not self._recent:
            self._recent_total = self._recent_provisional = 0.0  # no float drift

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

    def pending_reconciliation(self) -> float | None:
        """When a reading would settle the provisional bookings it has not settled yet: the time of the newest
        one plus the lag. None when there are none, or when readings carry no usage to settle them with."""
        if self._recent_provisional <= 0 or self.last is None or self.last.usage_usd is None:
            return None
        newest = max((at for at, _, provisional in self._recent if provisional), default=None)
        if newest is None:  # the running total kept a float residue of settled bookings
            self._recent_provisional = 0.0
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
