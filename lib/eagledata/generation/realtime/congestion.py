"""Telling congestion from noise (pure; times are the caller's clock, so tests simulate them).

A 429 on its own says little: OpenRouter answers a few percent of requests with one in normal operation,
and an upstream 429 names one provider. So a single 429 only delays that request (Retry-After plus
jitter). Global concurrency drops only when the 429 share over a whole window shows congestion, and
climbs back to `concurrency` once it ends. A provider whose own 429 share is high is left out of new
requests (the request's `provider.ignore`) for a while, as long as another eligible provider remains.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Congestion:
    concurrency: int
    window_s: float = 10.0
    congested_share: float = 0.25   # 429s above this share of a window's answers: congestion
    clear_share: float = 0.10       # below this: recover
    increase: float = 1.2
    min_answers: int = 20           # a window with fewer answers decides nothing
    limit: float = 0.0
    _window_start: float | None = None
    _answers: int = 0
    _rate_limited: int = 0
    history: list[tuple[float, float, float]] = field(default_factory=list)  # (t, 429 share, limit) per window

    def __post_init__(self) -> None:
        self.limit = float(self.concurrency)

    def observe(self, now: float, rate_limited: bool) -> None:
        if self._window_start is None:
            self._window_start = now
        self._answers += 1
        self._rate_limited += rate_limited
        self.tick(now)

    def tick(self, now: float) -> None:
        """Close the window when it is over: lower or raise the limit by its 429 share."""
        if self._window_start is None or now - self._window_start < self.window_s:
            return
        if self._answers >= self.min_answers:
            share = self._rate_limited / self._answers
            if share > self.congested_share:  # down in proportion to how congested: gently near the threshold
                self.limit = max(1.0, self.limit * max(0.7, 1.0 - (share - self.congested_share) / 2))
            elif share < self.clear_share:
                self.limit = min(float(self.concurrency), self.limit * self.increase + 1.0)
            self.history.append((now, share, self.limit))
        self._window_start, self._answers, self._rate_limited = now, 0, 0

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))


@dataclass
class ProviderCooldown:
    """Providers whose own 429 share over a window is high, left out of new requests for `cooldown_s`."""

    window_s: float = 10.0
    share: float = 0.2
    min_rate_limited: int = 5
    cooldown_s: float = 30.0
    until: dict[str, float] = field(default_factory=dict)
    _window_start: float = 0.0
    _answers: Counter = field(default_factory=Counter)
    _rate_limited: Counter = field(default_factory=Counter)

    def observe(self, now: float, provider: str, rate_limited: bool) -> None:
        if not provider:
            return
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._answers.clear()
            self._rate_limited.clear()
        self._answers[provider] += 1
        self._rate_limited[provider] += rate_limited
        n429 = self._rate_limited[provider]
        if rate_limited and n429 >= self.min_rate_limited and n429 > self.share * self._answers[provider]:
            self.until[provider] = now + self.cooldown_s

    def cooling(self, now: float, eligible: list[str]) -> list[str]:
        """Providers to ignore now: the cooling ones, unless that leaves no eligible provider (then the
        congestion is everywhere, and the global limit deals with it)."""
        hot = sorted(p for p, t in self.until.items() if t > now)
        return [] if set(eligible) <= set(hot) else hot
