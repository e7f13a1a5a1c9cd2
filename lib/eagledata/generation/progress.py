"""What a run counts and shows: counters, the timeline for the report's plots, the progress bar."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..records import Record, Usage

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

    def describe_errors(self) -> str:
        n = sum(self.errors.values())
        if not n:
            return "errors 0"
        return f"errors {n} ({', '.join(f'{k} {v}' for k, v in self.errors.most_common(3))})"


class Progress:
    """A tqdm bar over prompts (or output tokens, when the run stops at a token target)."""

    def __init__(self, dataset: str, *, total_prompts: int, done: int, target: int | None, tokens: int):
        from tqdm.auto import tqdm

        self.by_tokens = target is not None
        if self.by_tokens:
            self.bar = tqdm(total=target, initial=min(tokens, target), unit="tok", unit_scale=True,
                            desc=f"{dataset} output tokens", dynamic_ncols=True)
        else:
            self.bar = tqdm(total=total_prompts, initial=done, unit="prompt", desc=f"{dataset} prompts",
                            dynamic_ncols=True)

    def update(self, *, done: int, total_prompts: int, tokens: int, t: float, stats: RunStats, in_flight: int,
               limit: int, spent: float, cap: float | None) -> None:
        now = tokens if self.by_tokens else done
        self.bar.n = min(now, self.bar.total or now)
        cap_s = f"/{cap:g}" if cap else ""
        self.bar.set_postfix_str(
            f"done {done:,}/{total_prompts:,} | {stats.output_tokens / max(t, 1e-9):,.0f} tok/s | "
            f"in flight {in_flight}/{limit} | ${spent:,.2f}{cap_s} | {stats.describe_errors()}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


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
