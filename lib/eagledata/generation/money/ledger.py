"""The ledger: the run's money. Admission (may one more request start, admission.py), the books (what was spent,
account.py), the account's readings and the spender lock (spender.py), behind three calls:

    admit(bound, now, lane) -> ticket | None (wait for money to free up) | MoneyStop (why issuing stops)
    settle(ticket, rule, cost, bound, now) -> what was booked        spent(final)

A request is admitted against the money left and opens its flight in the run's one ledger of flights (flights.py,
which pacing reads too); whatever its attempt comes to (an answer, an error, a cancel) is booked here: at its cost,
or provisionally at its bound until an account reading says what it cost, or, for a stream the service named, until
its cost is read back by its generation id (`read_back`, readback.py).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ...openrouter import Account, read_account
from ..policy import Rule, StopReason
from .account import AccountReading, Books
from .admission import Admission
from .readback import GenerationReader, Readback
from .spender import SpenderLock

AccountReader = Callable[[httpx.AsyncClient], Awaitable[Account]]  # the account seam (`/key`, `/credits`)


@dataclass(frozen=True)
class MoneyStop:
    reason: str  # max_spend_reached | balance_reserve_reached
    why: str


class Ledger:
    def __init__(self, admission: Admission, books: Books, *, paid: bool, max_spend_usd: float | None,
                 reserve_usd: float, concurrency: int, refresh_s: float, reader: AccountReader = read_account,
                 generations: GenerationReader | None = None):
        self.admission, self.books, self.paid = admission, books, paid
        # a stream booked at its bound, its cost read back by id (None: the account's readings settle it)
        self.readback = Readback(books, generations) if paid and generations is not None else None
        self.max_spend_usd, self.reserve_usd, self.concurrency = max_spend_usd, reserve_usd, concurrency
        self.refresh_s, self.reader = refresh_s, reader
        self.money_left: dict[str, Any] | None = None  # why and with how much money issuing stopped
        self.balance_start: float | None = None
        # what killed runs before this one were charged beyond their records, by the account (killed.Baseline)
        self.killed_wasted_usd: float | None = None
        self.spender: SpenderLock | None = None
        self._want_reading = False
        self._read_at = float("-inf")  # when the last reading was asked for (it may have failed)
        self._settled_at = float("-inf")  # when the last reading that came back was asked for: what it settles

    @property
    def in_flight(self) -> int:
        return len(self.admission.flights)

    def limit(self, cap: bool = True) -> float:
        """The most this run may spend (`cap=False`: what the balance alone allows above the reserve)."""
        if not self.paid:
            return float("inf")
        return self.books.limit(self.max_spend_usd if cap else None, self.reserve_usd)

    def spent(self, final: bool = False) -> float:
        """The run's money as admission counts it: its books, and at the end what the summary reports, the
        account's delta. The books may fall (a booking at a bound settles at what it cost): not what a report draws."""
        if final and self.books.charged_usd is not None:
            return self.books.charged_usd
        return self.books.spent()

    def charged(self) -> float:
        """What the account has charged this run, as its last reading says (the costs the answers reported where no
        reading carries usage: a local backend). It never falls, and ends at the summary's `charged_usd`; bookings
        at a bound not read yet are `books.at_bound()`, apart."""
        charged = self.books.charged_usd
        return self.books.known_usd if charged is None else charged

    def admit(self, bound: float, now: float, lane: str = "") -> int | MoneyStop | None:
        """A ticket when a request of `bound` fits the money left; None to wait (money frees up as answers come, or
        a reading is due that settles provisional bookings); a MoneyStop when issuing should stop."""
        limit, spent = self.limit(), self.books.spent()
        if self.admission.fits(bound, spent, limit):
            return self.admission.start(now, bound, lane)
        # It does not fit. Provisional bookings (unreadable answers at their bound) hold money the account may not
        # have charged: ask for the reading that settles them as soon as it can (once the newest is older than the
        # account's lag), and never stop on figures that still hold them.
        due = self.books.pending_reconciliation()
        if due is not None and self._settled_at < due:  # no reading asked for after it has come back yet (one
            self._want_reading = True                     # under way does not settle anything until it has)
            return None
        if self.readback is not None and self.readback.holding():  # or its cost read back by id, any moment now
            return None
        why = self.admission.stop_rule(bound, spent, limit, self.concurrency)
        if why is None:
            return None
        self.money_left = {"usd": round(max(0.0, limit - spent), 6), "limit_usd": round(limit, 6),
                           "in_flight": self.in_flight, "why": why}
        cap = self.max_spend_usd
        return MoneyStop(StopReason.MAX_SPEND_REACHED if cap is not None and limit >= cap
                         else StopReason.BALANCE_RESERVE_REACHED, why)

    def settle(self, ticket: int, r: Rule, cost: float | None, bound: float, now: float,
               generation_id: str = "") -> float:
        """Book what the attempt cost by its rule (policy.RULES) and close its flight; returns what was booked (its
        bound when provisional: read back later when the service named its generation, `generation_id`)."""
        lane = self.admission.flights.live[ticket].lane
        if r.cost == "known" and cost is not None:
            self.books.book(now, cost, lane=lane)
        elif r.cost == "unknown" and self.paid:
            cost = None
            booking = self.books.book(now, bound, provisional=True, lane=lane)
            if generation_id and self.readback is not None:
                self.readback.add(generation_id, booking, now)
        else:
            cost = 0.0
        self.admission.end(ticket, now, cost)
        return bound if cost is None else cost

    def tick(self, now: float) -> None:
        self.admission.refresh(now)

    def reading_due(self, now: float) -> bool:
        """The ticker reads the account every `refresh_s`, and at once when admission waits on a reading."""
        if not self.paid:
            return False
        due = self.books.pending_reconciliation()
        return now - self._read_at >= self.refresh_s or (self._want_reading and due is not None and now >= due)

    async def read(self, client: httpx.AsyncClient, now: float, *, strict: bool = False) -> None:
        """Book an account reading; a failed refresh keeps the last one (the first must succeed)."""
        spent = self.books.spent()
        self._read_at = now
        self._want_reading = False
        try:
            account = await self.reader(client)
        except Exception:
            if strict:
                raise
            return
        self.books.read(AccountReading(now, account.usage_usd, account.balance_usd), spent)
        self._settled_at = now
        if strict:
            self.balance_start = self.books.last.balance_usd if self.books.last else None

    async def read_back(self, client: httpx.AsyncClient, now: float, *, every: bool = False) -> None:
        """Read what the closed streams that are due cost (`every`: all of them, once, at the run's end)."""
        if self.readback is not None:
            await self.readback.read(client, now, every=every)

    def close(self) -> None:
        if self.spender is not None:
            self.spender.close()
