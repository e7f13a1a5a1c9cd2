"""Credit policy: reserve at the endpoint's price before running, charge `usage.cost` after.

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
    """Account balance: credits bought, usage charged, and what in-flight requests hold."""

    total_credits: float
    total_usage: float = 0.0
    reserved: float = 0.0

    @property
    def available(self) -> float:
        return self.total_credits - self.total_usage - self.reserved

    def try_reserve(self, amount: float) -> bool:
        if amount > self.available:
            return False
        self.reserved += amount
        return True

    def settle(self, reserved: float, charge: float) -> None:
        """Release a reservation and charge what the request actually cost (0 for errors/empties)."""
        self.reserved = max(0.0, self.reserved - reserved)
        self.total_usage += charge

    def topup(self, amount: float) -> None:
        self.total_credits += amount
