"""Credit policy: a request's worst case must fit the balance, `usage.cost` is charged when it ends.

As on OpenRouter, the check is per request against credits − usage: requests in flight hold nothing,
so a client with 2,000 in flight can drive the balance below zero (docs/FORMATS.md#billing). What
they would hold is tracked (`in_flight_worst`) for the stats only.

Pure arithmetic plus a small ledger, so the 402 decision and the charge are unit-testable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .catalog import Endpoint


def usage_cost(prompt_tokens: int, completion_tokens: int, ep: Endpoint) -> float:
    """What OpenRouter reports as `usage.cost` (and charges): tokens × the listed per-token prices."""
    return prompt_tokens * ep.price_prompt + completion_tokens * ep.price_completion


def reservation(prompt_tokens: int, max_tokens: int, ep: Endpoint) -> float:
    """The most a request can cost: the prompt plus every token it may generate."""
    return usage_cost(prompt_tokens, max_tokens, ep)


def affordable_tokens(available: float, prompt_tokens: int, ep: Endpoint) -> int:
    """Output tokens the available credit covers after the prompt (the M of the 402 message)."""
    left = available - prompt_tokens * ep.price_prompt
    if left <= 0:
        return 0
    return math.floor(left / ep.price_completion) if ep.price_completion > 0 else 10**9


@dataclass
class Ledger:
    """Account balance: credits bought, usage charged, and the worst cases of the requests in flight."""

    total_credits: float
    total_usage: float = 0.0
    in_flight_worst: float = 0.0

    @property
    def available(self) -> float:
        return self.total_credits - self.total_usage

    def try_start(self, worst: float) -> bool:
        """Admit a request whose worst case the balance covers (other requests in flight do not count)."""
        if worst > self.available:
            return False
        self.in_flight_worst += worst
        return True

    def settle(self, worst: float, charge: float) -> None:
        """The request ended: charge what it actually cost (0 for errors/empties)."""
        self.in_flight_worst = max(0.0, self.in_flight_worst - worst)
        self.total_usage += charge

    def topup(self, amount: float) -> None:
        self.total_credits += amount
