"""What the engine does with each outcome (pure): a table, so a new error class is one line.

The kind (answers.Kind) says what happens to the prompt: record it, retry it, give it up, stop issuing,
stop the run. The rule of its class says what the attempt may have cost and whether it counts against
`max_attempts`: a 429 or a full in-flight budget is the service's state, not the prompt's fault.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from ..openrouter import Outcome
from ..retry import retry_delay_s


class StopReason(StrEnum):
    """Why a run (or one of its datasets) stopped: `summary.json`'s `stop_reason` (docs/FORMATS.md lists the same,
    a test holds them equal). Two more are made from a value: `fatal_stop(class)` and `error_stop(exception)`."""

    COMPLETED = "completed"                              # every prompt finished (recorded or failed for good)
    TARGET_REACHED = "target_reached"                    # the output-token target is recorded
    MAX_SPEND_REACHED = "max_spend_reached"              # not one more request fits under max_spend_usd
    BALANCE_RESERVE_REACHED = "balance_reserve_reached"  # not one more fits above the balance's reserve
    OUT_OF_CREDITS = "out_of_credits"                    # the service said 402: no credits
    NO_ENDPOINTS = "no_endpoints"                        # routing leaves no endpoint, answer after answer
    NO_FAITHFUL_PROVIDERS = "no_faithful_providers"      # every eligible provider judged suspect (fidelity.py)
    INTERRUPTED = "interrupted"                          # SIGINT/SIGTERM (Ctrl-C, a kernel interrupt)


FATAL_PREFIX, ERROR_PREFIX = "fatal_", "error: "


def fatal_stop(error_class: str) -> str:
    """A fatal answer (bad key, …) stopped the run: `fatal_<class>`, e.g. `fatal_auth`."""
    return FATAL_PREFIX + error_class


def error_stop(exc: BaseException) -> str:
    """A bug stopped the run: `error: <Type>: <message>`."""
    return f"{ERROR_PREFIX}{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Rule:
    cost: Literal["known", "none", "unknown"]  # unknown: the service may have billed an answer we never read
    counts: bool = True
    rate_limited: bool = False


RULES: dict[str, Rule] = {
    "ok": Rule("known"),
    "untokenizable": Rule("known"),            # read and paid for, but its text has no exact ids
    "reasoning_missing": Rule("known"),        # paid for, its reasoning never served: refused, retried elsewhere
    "rate_limit": Rule("none", counts=False, rate_limited=True),
    "upstream_rate_limit": Rule("none", counts=False, rate_limited=True),
    "budget_inflight": Rule("none", counts=False),
    "malformed": Rule("unknown"),              # a cut body: generated and billed, the bytes lost
    "connection": Rule("unknown"),
    "client_timeout": Rule("unknown"),         # the server goes on generating (and billing)
    "cancelled": Rule("unknown", counts=False),  # cut off by the run: booked at its bound until the account says
}
DEFAULT = Rule("none")  # error answers: OpenRouter bills only completions


def rule(outcome: Outcome) -> Rule:
    return RULES.get(outcome.error_class, DEFAULT)


def retry_delay(outcome: Outcome, attempts: int, rate_limited_in_a_row: int, *, base_s: float, cap_s: float,
                rng: random.Random | None = None) -> float:
    """The shared retry rule (`eagledata.retry`) applied to an outcome's Retry-After."""
    return retry_delay_s(outcome.retry_after, attempts, rate_limited_in_a_row, base_s=base_s, cap_s=cap_s, rng=rng)
