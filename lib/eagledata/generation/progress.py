"""What a run counts and shows: counters, the timeline for the report's plots, and its progress: a widget bar
in JupyterLab, else a status line every `status_interval_s` through `logging` (papermill, the command)."""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..records import Record, Usage
from ..status import StatusLog, duration, ensure_log_handler, eta_s, widget_frontend

TIMELINE_COLUMNS = ["t_s", "recorded", "output_tokens", "spend_usd", "in_flight", "limit"]


@dataclass
class RunStats:
    counts: Counter = field(default_factory=Counter)      # recorded, failed, retried
    errors: Counter = field(default_factory=Counter)      # by error class
    providers: Counter = field(default_factory=Counter)
    finish: Counter = field(default_factory=Counter)
    output_tokens: int = 0
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    recorded_usd: float = 0.0
    agreement: list[float] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)

    def add_record(self, record: Record, usage: Usage, cost: float) -> None:
        self.counts["recorded"] += 1
        self.output_tokens += record.output_tokens
        self.prompt_tokens += usage.prompt_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.recorded_usd += cost
        self.providers[record.provider or "?"] += 1
        self.finish[record.finish_reason] += 1
        if "retokenized_agreement" in record.meta:
            self.agreement.append(record.meta["retokenized_agreement"])

    def sample(self, t: float, spent: float, in_flight: int, limit: int) -> None:
        self.timeline.append([round(t, 2), self.counts["recorded"], self.output_tokens, round(spent, 6), in_flight,
                              limit])

    def describe_errors(self, top: int | None = 3) -> str:
        """`errors 12 (rate_limit 10, bad_gateway 2)`: the total and the commonest classes (all when `top` is None)."""
        n = sum(self.errors.values())
        if not n:
            return "errors 0"
        return f"errors {n} ({', '.join(f'{k} {v}' for k, v in self.errors.most_common(top))})"


@dataclass(frozen=True)
class Snapshot:
    """Where a run stands, as the ticker sees it: what both the bar and the status line show."""

    t: float                      # seconds since this run started
    done: int                     # prompts finished, all runs (records + failures)
    total_prompts: int
    tokens: int                   # output tokens recorded, all runs
    in_flight: int
    limit: int                    # concurrency allowed now
    spent: float                  # charged so far in this run (the account's delta, plus answers since)
    cap: float | None = None      # max_spend_usd
    money_limit: float = math.inf  # what this run may spend: min(cap, balance - reserve)


class ProgressView(Protocol):
    def update(self, snap: Snapshot, stats: "RunStats") -> None: ...

    def close(self, snap: Snapshot, stats: "RunStats") -> None: ...


def status_line(dataset: str, snap: Snapshot, stats: RunStats, *, target: int | None, done_before: int,
                tokens_before: int) -> str:
    """One line a log reader can act on: progress, speed, money, concurrency, time left and errors by class.

    The ETA is the sooner of the work left (prompts, or output tokens when the run stops at a target) and the
    money left, each at this run's mean rate so far."""
    if target is not None:
        head = (f"{snap.tokens:,}/{target:,} output tokens ({100 * min(snap.tokens / target, 1):.1f}%), "
                f"{snap.done:,}/{snap.total_prompts:,} prompts")
        eta = eta_s(snap.tokens, target, snap.t, tokens_before)
    else:
        share = 100 * snap.done / snap.total_prompts if snap.total_prompts else 100.0
        head = f"{snap.done:,}/{snap.total_prompts:,} prompts ({share:.1f}%)"
        eta = eta_s(snap.done, snap.total_prompts, snap.t, done_before)
    why = ""
    if math.isfinite(snap.money_limit) and snap.spent > 0 and snap.t > 0:
        money_eta = max(snap.money_limit - snap.spent, 0.0) * snap.t / snap.spent
        if eta is None or money_eta < eta:
            eta, why = money_eta, " (money)"
    cap = f" of ${snap.cap:,.2f} cap" if snap.cap is not None else ""
    return (f"{dataset}: {head} | {stats.output_tokens / max(snap.t, 1e-9):,.0f} output tok/s | "
            f"charged ${snap.spent:,.4f}{cap} | in flight {snap.in_flight:,}/{snap.limit:,} | "
            f"ETA {duration(eta)}{why} | {stats.describe_errors(top=None)}")


class Progress:
    """A tqdm widget bar over prompts (or output tokens, when the run stops at a token target): JupyterLab."""

    def __init__(self, dataset: str, *, total_prompts: int, done: int, target: int | None, tokens: int):
        from tqdm.auto import tqdm

        self.by_tokens = target is not None
        if self.by_tokens:
            self.bar = tqdm(total=target, initial=min(tokens, target), unit="tok", unit_scale=True,
                            desc=f"{dataset} output tokens", dynamic_ncols=True)
        else:
            self.bar = tqdm(total=total_prompts, initial=done, unit="prompt", desc=f"{dataset} prompts",
                            dynamic_ncols=True)

    def update(self, snap: Snapshot, stats: RunStats) -> None:
        now = snap.tokens if self.by_tokens else snap.done
        self.bar.n = min(now, self.bar.total or now)
        cap_s = f"/{snap.cap:g}" if snap.cap else ""
        self.bar.set_postfix_str(
            f"done {snap.done:,}/{snap.total_prompts:,} | {stats.output_tokens / max(snap.t, 1e-9):,.0f} tok/s | "
            f"in flight {snap.in_flight}/{snap.limit} | ${snap.spent:,.2f}{cap_s} | {stats.describe_errors()}",
            refresh=False)
        self.bar.refresh()

    def close(self, snap: Snapshot, stats: RunStats) -> None:
        self.update(snap, stats)
        self.bar.close()


class StatusLines:
    """No widget frontend (papermill, the command): `status_line` through logging every `interval_s`, and once
    at the end."""

    def __init__(self, dataset: str, *, interval_s: float, target: int | None, done: int, tokens: int,
                 clock: Callable[[], float] = time.monotonic):
        ensure_log_handler()
        self.dataset, self.target, self.done_before, self.tokens_before = dataset, target, done, tokens
        self.log = StatusLog(interval_s, "eagledata.generate", clock=clock)

    def _line(self, snap: Snapshot, stats: RunStats) -> str:
        return status_line(self.dataset, snap, stats, target=self.target, done_before=self.done_before,
                           tokens_before=self.tokens_before)

    def update(self, snap: Snapshot, stats: RunStats) -> None:
        self.log.maybe(lambda: self._line(snap, stats))

    def close(self, snap: Snapshot, stats: RunStats) -> None:
        self.log.emit(self._line(snap, stats) + f" | ended after {duration(snap.t)}")


def make_progress(dataset: str, *, interval_s: float, total_prompts: int, done: int, target: int | None,
                  tokens: int, widget: bool | None = None) -> ProgressView:
    """The bar where a widget frontend shows it, else status lines."""
    if widget_frontend() if widget is None else widget:
        return Progress(dataset, total_prompts=total_prompts, done=done, target=target, tokens=tokens)
    return StatusLines(dataset, interval_s=interval_s, target=target, done=done, tokens=tokens)


def run_figures(stats: RunStats, *, wall_s: float, charged: float | None, spent: float) -> dict[str, Any]:
    """The money and speed figures of the summary: charged is the account's delta, recorded what the kept
    answers cost, wasted the difference (retried, cut or abandoned answers that were billed)."""
    paid = charged if charged is not None else spent
    return {
        "charged_usd": None if charged is None else round(charged, 8),
        "recorded_usd": round(stats.recorded_usd, 8),
        "wasted_usd": None if charged is None else round(charged - stats.recorded_usd, 8),
        "spend_usd": round(paid, 8),
        "output_tokens_per_s": round(stats.output_tokens / max(wall_s, 1e-9), 1),
        "usd_per_m_output": round(1e6 * paid / stats.output_tokens, 4) if stats.output_tokens else None,
    }
