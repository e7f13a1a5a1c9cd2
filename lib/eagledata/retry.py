"""The one retry rule of every stage that talks to a server (OpenRouter in generation, vLLM in extraction).

Pure: the caller counts attempts and 429s in a row; the jitter's source is injectable, so tests can pin it.
"""
from __future__ import annotations

import random


def retry_delay_s(retry_after_s: float | None, attempts: int, rate_limited_in_a_row: int, *, base_s: float,
                  cap_s: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before the next attempt.

    Retry-After when the server gives one (doubled for each 429 in a row, so a lasting limit is not hammered,
    and at least 50 ms), else exponential backoff from `base_s` over the `attempts` made so far; at most
    `cap_s` either way, and jittered so retries do not arrive together."""
    r = rng or random
    if retry_after_s is not None:
        wait = retry_after_s * 2 ** max(0, rate_limited_in_a_row - 1)
        return min(cap_s, max(wait, 0.05)) * r.uniform(1.0, 1.5)
    return r.uniform(0, min(cap_s, base_s * 2 ** attempts))
