"""What the engine does with each outcome (pure): a table, so a new error class is one line.

The kind (answers.Kind) says what happens to the prompt: record it, retry it, give it up, stop issuing,
stop the run. The rule of its class says what the attempt may have cost and whether it counts against
`max_attempts`: a 429 or a full in-flight budget is the service's state, not the prompt's fault.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from ..openrouter import Outcome
from ..retry import retry_delay_s


@dataclass(frozen=True)
class Rule:
    cost: Literal["known", "none", "unknown"]  # unknown: the service may have billed an answer we never read
    counts: bool = True
    rate_limited: bool = False


RULES: dict[str, Rule] = {
    "ok": Rule("known"),
    "untokenizable": Rule("known"),            # read and paid for, but its text has no exact ids
    "rate_limit": Rule("none", counts=False, rate_limited=True),
    "upstream_rate_limit": Rule("none", counts=False, rate_limited=True),
    "budget_inflight": Rule("none", counts=False),
    "malformed": Rule("unknown"),              # a cut body: generated and billed, the bytes lost
    "connection": Rule("unknown"),
    "client_timeout": Rule("unknown"),         # the server goes on generating (and billing)
}
DEFAULT = Rule("none")  # error answers: OpenRouter bills only completions


def rule(outcome: Outcome) -> Rule:
    return RULES.get(outcome.error_class, DEFAULT)


def retry_delay(outcome: Outcome, attempts: int, rate_limited_in_a_row: int, *, base_s: float, cap_s: float,
                rng: random.Random | None = None) -> float:
    """The shared retry rule (`eagledata.retry`) applied to an outcome's Retry-After."""
    return retry_delay_s(outcome.retry_after, attempts, rate_limited_in_a_row, base_s=base_s, cap_s=cap_s, rng=rng)
