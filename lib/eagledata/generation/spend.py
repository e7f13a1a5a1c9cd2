"""The hard budget stop (pure): a request starts only if its worst case fits under every limit.

Worst case of a request = prompt tokens × highest eligible prompt price + max_tokens × highest
eligible completion price. Spent money comes from `usage.cost`; reservations cover requests in flight.
Two limits: the per-run cap (`max_spend_usd`) and the account balance less `reserve_usd`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum


class Admit(Enum):
    YES = "yes"
    WAIT = "wait"  # fits once in-flight requests settle and free their reservations
    NO = "no"      # would not fit even with nothing in flight: the money is gone


@dataclass
class SpendGuard:
    prompt_price: float        # USD per prompt token (worst eligible)
    completion_price: float    # USD per completion token (worst eligible)
    max_tokens: int
    max_spend_usd: float | None = None  # per-run cap; None = no cap
    balance_usd: float | None = None    # account balance at start; None = unknown (no balance limit)
    reserve_usd: float = 0.0
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    in_flight: int = 0
    _largest_settled: float = field(default=0.0, repr=False)

    def worst_case(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.prompt_price + self.max_tokens * self.completion_price

    def _room(self) -> float:
        """Money that may still be committed (spent + reserved), over both limits."""
        room = math.inf
        if self.max_spend_usd is not None:
            room = min(room, self.max_spend_usd)
        if self.balance_usd is not None:
            room = min(room, self.balance_usd - self.reserve_usd)
        return room

    def admit(self, prompt_tokens: int) -> Admit:
        worst = self.worst_case(prompt_tokens)
        room = self._room()
        if self.spent_usd + worst > room:
            return Admit.NO
        if self.spent_usd + self.reserved_usd + worst > room:
            return Admit.WAIT
        return Admit.YES

    def reserve(self, prompt_tokens: int) -> float:
        """Hold the worst case of a request about to start; returns the amount to settle later."""
        amount = self.worst_case(prompt_tokens)
        self.reserved_usd += amount
        self.in_flight += 1
        return amount

    def settle(self, reserved: float, cost: float) -> None:
        """The request ended: release its reservation, book what it really cost (0 if nothing)."""
        self.reserved_usd = max(0.0, self.reserved_usd - reserved)
        self.in_flight -= 1
        self.spent_usd += cost
        if self.in_flight == 0:
            self.reserved_usd = 0.0  # no float drift once nothing is in flight

    def update_balance(self, balance_usd: float | None, spent_since: float) -> None:
        """A fresh account reading; `spent_since` is what this run booked since the first reading.

        Expressed as the balance at start; only ever lowered (another spender, or usage the
        account shows before we booked it), never raised by a lagging reading."""
        if balance_usd is not None:
            start = balance_usd + spent_since
            self.balance_usd = start if self.balance_usd is None else min(self.balance_usd, start)
