"""What the engine does with each outcome (pure): a table, so a new error class is one line.

The kind (answers.Kind) says what happens to the prompt: record it, retry it, give it up, stop issuing,
stop the run. The rule of its class says what the attempt may have cost and whether it counts against
`max_attempts`: a 429 or a full in-flight budget is the service's state, not the prompt's fault.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from ..openrouter import Kind, Outcome
from ..retry import retry_delay_s


class StopReason(StrEnum):
    """Why a run (or one of its datasets) stopped: `summary.json`'s `stop_reason` (docs/FORMATS.md lists the same,
    a test holds them equal). Three are made from a value: `fatal_stop(class)`, `error_stop(exception)` and
    `rejected_stop(outcome)` (`request_rejected: <setting>: <status> <message>`)."""

    COMPLETED = "completed"                              # every prompt finished (recorded or failed for good)
    ALL_FAILED = "all_failed"                            # every prompt finished, and failed for good: no record
    TARGET_REACHED = "target_reached"                    # the output-token target is recorded
    MAX_SPEND_REACHED = "max_spend_reached"              # not one more request fits under max_spend_usd
    BALANCE_RESERVE_REACHED = "balance_reserve_reached"  # not one more fits above the balance's reserve
    OUT_OF_CREDITS = "out_of_credits"                    # the service said 402: no credits
    NO_ENDPOINTS = "no_endpoints"                        # routing leaves no endpoint, answer after answer
    NO_FAITHFUL_PROVIDERS = "no_faithful_providers"      # every eligible provider judged suspect (fidelity.py)
    INTERRUPTED = "interrupted"                          # SIGINT/SIGTERM (Ctrl-C, a kernel interrupt)
    # the same 4xx for many different prompts: a setting of the run, written `rejected_stop(outcome)`
    REQUEST_REJECTED = "request_rejected"


FATAL_PREFIX, ERROR_PREFIX = "fatal_", "error: "


def fatal_stop(error_class: str) -> str:
    """A fatal answer (bad key, …) stopped the run: `fatal_<class>`, e.g. `fatal_auth`."""
    return FATAL_PREFIX + error_class


def error_stop(exc: BaseException) -> str:
    """A bug stopped the run: `error: <Type>: <message>`."""
    return f"{ERROR_PREFIX}{type(exc).__name__}: {exc}"


# -- a setting of the run the service refuses ------------------------------------------------------------------------
# A wrong run-wide setting (max_tokens, temperature, the routing file's provider object) is refused for every prompt
# alike; a prompt's own fault (too long for every endpoint, filtered) for that prompt only. The preflight checks what
# the listing shows (config.py, routing.py); the rest only the service can judge, so the run watches its answers.
REJECTED_PROMPTS = 10  # this many different prompts refused alike: one prompt's own fault repeating by chance is
#                        negligible, and a wrong setting costs at most a pool's worth of 400s (never billed)
REJECTED_SHARE = 0.5   # ... and at least this share of the requests sent since the last answer: a wrong setting
#                        refuses all of them, a per-prompt fault only its own prompts (the too-long ones of a first
#                        wave come back at once, while the rest are still in flight)
REJECTABLE = ("bad_request", "client_error")  # the classes of a refused request (answers.py: 400/413/422, other 4xx)
REJECTED_PREFIX = StopReason.REQUEST_REJECTED + ": "


def rejection_key(outcome: Outcome) -> tuple[int | None, str]:
    """What makes two refusals the same: the status and the message, its numbers aside (a context error quotes each
    prompt's own length)."""
    return outcome.status, re.sub(r"\d+", "#", outcome.message)


# The setting a refusal's message names, first match wins: (pattern, setting).
_SETTINGS: list[tuple[str, str]] = [
    (r"\bprovider\.(\w+)", "provider.{0} (the routing file)"),
    (r"context length|context_length|\bmax_tokens\b|max_completion_tokens", "max_tokens"),
    (r"\btemperature\b", "temperature"),
    (r"\bprovider\b|\bquantizations?\b", "provider (the routing file)"),
    (r"\bmodel\b", "model"),
    (r"\btools?\b|\btool_choice\b", "tools (the dataset's)"),
]
UNNAMED = "a setting of the run (the service's message does not say which)"


def rejected_setting(message: str) -> str:
    """The setting a refusal's message names (`temperature`, `max_tokens`, `provider.sort (the routing file)`, …)."""
    for pattern, setting in _SETTINGS:
        if m := re.search(pattern, message, re.IGNORECASE):
            return setting.format(*m.groups())
    return UNNAMED


def rejected_stop(outcome: Outcome) -> str:
    """The run stopped on the same refusal for many prompts: `request_rejected: <setting>: <status> <message>`."""
    return f"{REJECTED_PREFIX}{rejected_setting(outcome.message)}: {outcome.status} {outcome.message}"


@dataclass
class RejectionWatch:
    """Is the same refusal coming back for many different prompts, and for most of what was sent (pure)? Counted
    since the run's last answer: an answer shows the settings work, so the count starts again, from the requests
    still in flight then."""

    prompts: int = REJECTED_PROMPTS
    share: float = REJECTED_SHARE
    sent: int = 0                                    # requests sent since the last answer, or in flight at it
    seen: dict[tuple[int | None, str], set[str]] = field(default_factory=dict)  # refusal -> the prompts it met

    def sending(self) -> None:
        self.sent += 1

    def answered(self, in_flight: int) -> None:
        self.sent, self.seen = in_flight, {}

    def rejected(self, prompt: str, outcome: Outcome) -> bool:
        """`prompt` was refused with `outcome`: True when that refusal is now the run's, not its prompts'."""
        met = self.seen.setdefault(rejection_key(outcome), set())
        met.add(prompt)
        return len(met) >= self.prompts and len(met) >= self.share * self.sent


@dataclass(frozen=True)
class Rule:
    cost: Literal["known", "none", "unknown"]  # unknown: the service may have billed an answer we never read
    counts: bool = True
    rate_limited: bool = False


RULES: dict[str, Rule] = {
    "ok": Rule("known"),
    "untokenizable": Rule("known"),            # read and paid for, but its text has no exact ids
    "reasoning_missing": Rule("known"),        # paid for, its reasoning never served: refused, retried elsewhere
    "count_disagrees": Rule("known"),          # paid for, its ids contradicted by the service's count: the same
    "rate_limit": Rule("none", counts=False, rate_limited=True),
    "upstream_rate_limit": Rule("none", counts=False, rate_limited=True),
    "budget_inflight": Rule("none", counts=False),
    "malformed": Rule("unknown"),              # a cut body: generated and billed, the bytes lost
    "connection": Rule("unknown"),
    "client_timeout": Rule("unknown"),         # the server goes on generating (and billing)
    "cancelled": Rule("unknown", counts=False),  # cut off by the run: booked at its bound until the account says
}
CANCELLED = "cancelled"  # the error class of an attempt cut off by the run (its cost is unknown)
DEFAULT = Rule("none")  # error answers: OpenRouter bills only completions


def cancelled_outcome() -> Outcome:
    """What an attempt the run cut off came to (the ledger books it at its bound until its cost is read)."""
    return Outcome(Kind.RETRY, CANCELLED, None, "cancelled by the run")


def rule(outcome: Outcome) -> Rule:
    return RULES.get(outcome.error_class, DEFAULT)


def retry_delay(outcome: Outcome, attempts: int, rate_limited_in_a_row: int, *, base_s: float, cap_s: float,
                rng: random.Random | None = None) -> float:
    """The shared retry rule (`eagledata.retry`) applied to an outcome's Retry-After."""
    return retry_delay_s(outcome.retry_after, attempts, rate_limited_in_a_row, base_s=base_s, cap_s=cap_s, rng=rng)
