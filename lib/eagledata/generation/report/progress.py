"""What a run counts and shows: counters, the timeline for the report's plots, and its progress: the live panel
in JupyterLab (panel.py), else a status line every `status_interval_s` through `logging` (papermill, the command)."""
from __future__ import annotations

import math
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...records import CUT, Record, Usage
from ...status import StatusLog, duration, ensure_log_handler, eta_s
from ..conversations.turns import MISMATCHES, TOOL_MISMATCH, mismatch_kind

# spend_usd: the account's charge (never falls); at_bound_usd: bookings at a bound no reading has settled yet, apart;
# prompts_answered: prompts (whole conversations) answered this run, what a dataset without a target is measured in.
TIMELINE_COLUMNS = ["t_s", "recorded", "output_tokens", "spend_usd", "in_flight", "limit", "prompts_answered",
                    "at_bound_usd"]
SUMMED = [c for c in TIMELINE_COLUMNS if c not in ("t_s", "limit")]  # a run's figure is its datasets' added up
NO_PROVIDER = "-"  # provider_health's name for attempts no provider answered (a connection or gateway error)
TIMELINE_POINTS = 2000  # a summary's timeline is thinned to this many samples, first and last kept
LATENCY_WINDOW = 500    # a provider's median latency is over its last this many attempts: how it serves now


@dataclass
class ProviderStats:
    """How one provider serves this run: its attempts, answers, errors (429s among them) and recent latencies."""

    attempts: int = 0
    answers: int = 0
    errors: int = 0
    rate_limited: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def add(self, other: ProviderStats) -> None:
        self.attempts += other.attempts
        self.answers += other.answers
        self.errors += other.errors
        self.rate_limited += other.rate_limited
        self.latencies = deque([*self.latencies, *other.latencies])  # a run's total: every dataset's window

    def figures(self) -> dict[str, Any]:
        """summary.json's `run.provider_health[<provider>]`."""
        return {"attempts": self.attempts, "answers": self.answers, "errors": self.errors,
                "rate_limited": self.rate_limited,
                "median_latency_s": round(statistics.median(self.latencies), 3) if self.latencies else None}


def merge_timelines(timelines: list[list[list[float]]]) -> list[list[float]]:
    """The run's timeline from its datasets' (sampled at the same ticks): counts, tokens, $ and requests in flight
    added up, the time and the limit (the pool's) as they are. Datasets whose samples do not line up (they ran
    apart) give none."""
    timelines = [tl for tl in timelines if tl]
    if not timelines or len({len(tl) for tl in timelines}) != 1:
        return []
    summed = {TIMELINE_COLUMNS.index(c) for c in SUMMED}  # $ to the 6 places a sample keeps (no float noise)
    return [[round(sum(r[i] for r in rows), 6) if i in summed else rows[0][i] for i in range(len(rows[0]))]
            for rows in zip(*timelines)]


def merge_provider_health(parts: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The run's provider health from its datasets': counts added up, the median latency the attempts-weighted
    mean of theirs (their samples are gone)."""
    counts = ("attempts", "answers", "errors", "rate_limited")
    out: dict[str, dict[str, Any]] = {}
    latencies: dict[str, list[tuple[float, int]]] = {}
    for part in parts:
        for name, h in part.items():
            o = out.setdefault(name, dict.fromkeys(counts, 0))
            for k in counts:
                o[k] += h[k]
            if h.get("median_latency_s") is not None:
                latencies.setdefault(name, []).append((h["median_latency_s"], h["attempts"]))
    for name, o in out.items():
        total = sum(w for _, w in latencies.get(name, []))
        o["median_latency_s"] = round(sum(m * w for m, w in latencies[name]) / total, 3) if total else None
    return dict(sorted(out.items()))


def thin(timeline: list[list[float]], n: int = TIMELINE_POINTS) -> list[list[float]]:
    """At most `n` samples of a timeline, evenly spread, the first and the last kept: a long run's report shows
    the whole run (not its last `n` samples), and the live panel and the summary thin alike."""
    if len(timeline) <= n:
        return list(timeline)
    step = (len(timeline) - 1) / (n - 1)
    return [timeline[round(i * step)] for i in range(n)]


@dataclass
class RunStats:
    counts: Counter = field(default_factory=Counter)      # recorded, failed, retried
    errors: Counter = field(default_factory=Counter)      # by error class
    providers: Counter = field(default_factory=Counter)
    finish: Counter = field(default_factory=Counter)
    turns: Counter = field(default_factory=Counter)       # records by turn number
    tool_calls: Counter = field(default_factory=Counter)  # answers (with calls), calls, ids_rebuilt, mismatched
    by_provider: dict[str, ProviderStats] = field(default_factory=dict)  # attempts that reached a provider
    output_tokens: int = 0
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    chars: int = 0                # reasoning and content characters of the records (tokens per character, streamed)
    recorded_usd: float = 0.0
    agreement: list[float] = field(default_factory=list)
    timeline: list[list[float]] = field(default_factory=list)
    in_flight: int = 0            # requests under way now
    booked_usd: float = 0.0       # what its attempts were booked at (known costs, unreadable ones at their bound)
    abandoned: int = 0            # requests left in flight when the run ended after every target was met
    lengths: dict[bool, list[int]] = field(default_factory=lambda: {True: [], False: []})  # output tokens: cut or not
    not_kept: Counter = field(default_factory=Counter)  # streams the run closed to keep, kept as no cut sample: why

    @classmethod
    def combined(cls, parts: list[RunStats], timeline: list[list[float]] | None = None) -> RunStats:
        """The run's figures: its datasets' counters added up (`timeline`: the run's own samples, appended to)."""
        total = cls(timeline=[] if timeline is None else timeline)
        for p in parts:
            for mine, theirs in ((total.counts, p.counts), (total.errors, p.errors), (total.providers, p.providers),
                                 (total.finish, p.finish), (total.turns, p.turns), (total.tool_calls, p.tool_calls),
                                 (total.not_kept, p.not_kept)):
                mine.update(theirs)
            total.agreement.extend(p.agreement)
            for cut in (True, False):
                total.lengths[cut].extend(p.lengths[cut])
            for name, ps in p.by_provider.items():
                total.by_provider.setdefault(name, ProviderStats()).add(ps)
            for name in ("output_tokens", "prompt_tokens", "reasoning_tokens", "chars", "recorded_usd", "in_flight",
                         "booked_usd", "abandoned"):
                setattr(total, name, getattr(total, name) + getattr(p, name))
        return total

    def add_record(self, record: Record, usage: Usage, cost: float) -> None:
        self.counts["recorded"] += 1
        self.output_tokens += record.output_tokens
        self.chars += len(record.reasoning) + len(record.content)
        self.prompt_tokens += usage.prompt_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.recorded_usd += cost
        self.providers[record.provider or "?"] += 1
        self.finish[record.finish_reason] += 1
        self.lengths[record.finish_reason == CUT].append(record.output_tokens)
        self.turns[record.turn] += 1
        if record.tool_calls:
            self.tool_calls["answers"] += 1
            self.tool_calls["calls"] += len(record.tool_calls)
            self.tool_calls["ids_rebuilt"] += "served_tool_call_ids" in record.meta
        if record.meta.get("ended") == TOOL_MISMATCH:  # and how: mismatched_plain, _called, _other
            self.tool_calls["mismatched"] += 1
            ours = [c["function"]["name"] for c in record.tool_calls or ()]
            self.tool_calls[f"mismatched_{mismatch_kind(ours, record.meta.get('dataset_calls') or ())}"] += 1
        if "retokenized_agreement" in record.meta:
            self.agreement.append(record.meta["retokenized_agreement"])

    def attempt(self, provider: str | None, *, ok: bool, rate_limited: bool, latency_s: float) -> None:
        """An attempt ended: `ok`, an answer came (kept, or refused on its content). Attempts no provider answered
        (a connection error before routing) count under `NO_PROVIDER`."""
        ps = self.by_provider.setdefault(provider or NO_PROVIDER, ProviderStats())
        ps.attempts += 1
        ps.answers += ok
        ps.errors += not ok
        ps.rate_limited += rate_limited
        ps.latencies.append(latency_s)

    def sample(self, t: float, charged: float, in_flight: int, limit: int, prompts_answered: int = 0,
               at_bound: float = 0.0) -> None:
        """A row of TIMELINE_COLUMNS: `charged` the account's charge (never falling), `at_bound` apart from it."""
        self.timeline.append([round(t, 2), self.counts["recorded"], self.output_tokens, round(charged, 6), in_flight,
                              limit, prompts_answered, round(at_bound, 6)])

    def describe_errors(self, top: int | None = 3) -> str:
        """`errors 12 (rate_limit 10, bad_gateway 2)`: the total and the commonest classes (all when `top` is None)."""
        n = sum(self.errors.values())
        if not n:
            return "errors 0"
        return f"errors {n} ({', '.join(f'{k} {v}' for k, v in self.errors.most_common(top))})"


@dataclass(frozen=True)
class DatasetSnapshot:
    """Where one dataset of the run stands."""

    name: str
    done: int                     # prompts finished, all runs (records + failures)
    total_prompts: int
    tokens: int                   # output tokens recorded, all runs
    target: int | None
    in_flight: int
    stats: RunStats
    done_before: int = 0
    tokens_before: int = 0
    failed: int = 0               # of `done`, failed for good, all runs: finished, but not a share of the work done

    @property
    def share(self) -> float:
        """How far along: tokens ÷ target (past 1 once answers pass it: `at_target: finish` ends wherever the last
        answer does), else prompts answered (finished, less those failed) ÷ prompts."""
        if self.target is not None:
            return self.tokens / self.target if self.target else 1.0
        return max(self.done - self.failed, 0) / self.total_prompts if self.total_prompts else 1.0


@dataclass(frozen=True)
class RunSnapshot:
    """Where a run stands, as the ticker sees it: what both the bars and the status line show."""

    t: float                      # seconds since this run started
    in_flight: int
    limit: int                    # concurrency allowed now
    spent: float                  # the books (the account's delta, plus answers since, unread ones at their bound)
    stats: RunStats               # the whole run's counters
    datasets: list[DatasetSnapshot]
    cap: float | None = None      # max_spend_usd
    money_limit: float = math.inf  # what this run may spend: min(cap, balance - reserve)
    foreign: float = 0.0          # usage on the account this run did not book (another spender)
    suspects: tuple[str, ...] = ()  # providers left out for good: their answers are not the model's (fidelity.py)
    usable: float = math.inf      # what the balance allows above the reserve (the money's end without a cap)
    verdicts: dict[str, str] = field(default_factory=dict)  # provider -> fidelity verdict
    planned_usd_per_m: float | None = None  # the budget plan's $ per M output tokens (its spend line)
    stop_reason: str | None = None  # set on the final snapshot
    charged: float | None = None  # what the account has charged (never falls); None: `spent`
    at_bound: float = 0.0         # bookings at a bound no account reading has settled yet (in `spent`, not `charged`)
    streams: int = 0              # streamed answers in flight
    streamed_chars: int = 0       # the reasoning and content characters they have delivered so far

    def streamed_tokens(self) -> int | None:
        """What the streams in flight have delivered, in tokens at this run's tokens per character (the service counts
        tokens only in a stream's last chunk); None before a record gives the ratio."""
        return round(self.streamed_chars * self.stats.output_tokens / self.stats.chars) if self.stats.chars else None


class ProgressView(Protocol):
    def update(self, snap: RunSnapshot) -> None: ...

    def close(self, snap: RunSnapshot, summary: dict[str, Any] | None = None) -> None:
        """The run ended: `snap` is its last state, `summary` what it returns (None when it failed first)."""


def run_etas(snap: RunSnapshot) -> tuple[float | None, float | None]:
    """(seconds to the work's end, seconds to the money's end), each at this run's mean rate so far: the work is
    the slowest dataset's prompts, or output tokens when it stops at a target; None where there is no rate yet
    or no limit."""
    if len(snap.datasets) == 1:
        work = _head(snap.datasets[0], snap.t)[1]
    else:
        etas = [_head(d, snap.t)[1] for d in snap.datasets if d.share < 1]
        work = max((e for e in etas if e is not None), default=None) if etas else 0.0
    money = None
    if math.isfinite(snap.money_limit) and snap.spent > 0 and snap.t > 0:
        money = max(snap.money_limit - snap.spent, 0.0) * snap.t / snap.spent
    return work, money


def sooner(work: float | None, money: float | None) -> tuple[float | None, str]:
    """The ETA to show, and " (money)" when the money ends first."""
    if money is not None and (work is None or money < work):
        return money, " (money)"
    return work, ""


def _head(d: DatasetSnapshot, t: float) -> tuple[str, float | None]:
    if d.target is not None:
        head = (f"{d.tokens:,}/{d.target:,} output tokens ({100 * d.share:.1f}%), "
                f"{d.done:,}/{d.total_prompts:,} prompts")
        return head, eta_s(d.tokens, d.target, t, d.tokens_before)
    failed = f"; {d.failed:,} failed" if d.failed else ""  # finished, not answered: 100 % would say otherwise
    return (f"{d.done:,}/{d.total_prompts:,} prompts ({100 * d.share:.1f}%{failed})",
            eta_s(d.done, d.total_prompts, t, d.done_before))


def status_line(snap: RunSnapshot) -> str:
    """One line a log reader can act on: progress, speed, money, concurrency, time left and errors by class;
    for several datasets the totals first, then each dataset's share of its target.

    The ETA is the sooner of the work left (prompts, or output tokens when the run stops at a target) and the
    money left, each at this run's mean rate so far; for several datasets, the slowest dataset's. A run that ended
    has none: its stop reason instead. Charged is the account's (it never falls); bookings at a bound that no
    reading has settled yet are said apart."""
    if len(snap.datasets) == 1:
        d = snap.datasets[0]
        who, head = d.name, _head(d, snap.t)[0]
    else:
        tokens, done = sum(d.tokens for d in snap.datasets), sum(d.done for d in snap.datasets)
        targets = [d.target for d in snap.datasets if d.target is not None]
        who = f"{len(snap.datasets)} datasets"
        total = sum(d.total_prompts for d in snap.datasets)
        head = (f"{tokens:,}/{sum(targets):,} output tokens" if len(targets) == len(snap.datasets)
                else f"{tokens:,} output tokens") + f", {done:,}/{total:,} prompts"
    if snap.stop_reason:
        when = f"stopped: {snap.stop_reason}"
    else:
        eta, why = sooner(*run_etas(snap))
        when = f"ETA {duration(eta)}{why}"
    cap = f" of ${snap.cap:,.2f} cap" if snap.cap is not None else ""
    bound = f" (+${snap.at_bound:,.4f} booked at a bound, not yet read)" if round(snap.at_bound, 4) > 0 else ""
    other = f" | other spending on this key ${snap.foreign:,.4f}" if snap.foreign else ""
    charged = snap.spent if snap.charged is None else snap.charged
    streamed = ""
    if snap.streams and (delivered := snap.streamed_tokens()) is not None:  # how far the answers in flight have got
        streamed = f" (~{delivered:,} tokens streamed)"
    line = (f"{who}: {head} | {snap.stats.output_tokens / max(snap.t, 1e-9):,.0f} output tok/s | "
            f"charged ${charged:,.4f}{cap}{bound}{other} | in flight {snap.in_flight:,}/{snap.limit:,}{streamed} | "
            f"{when} | {snap.stats.describe_errors(top=None)}")
    if len(snap.datasets) > 1:
        line += " | " + ", ".join(f"{d.name} {100 * d.share:.1f}%" for d in snap.datasets)
    if snap.suspects:
        line += f" | left out as fidelity suspects: {', '.join(snap.suspects)}"
    return line


class StatusLines:
    """No widget frontend (papermill, the command): `status_line` through logging every `interval_s`, and once
    at the end."""

    def __init__(self, *, interval_s: float, clock: Callable[[], float] = time.monotonic):
        ensure_log_handler()
        self.log = StatusLog(interval_s, "eagledata.generate", clock=clock)

    def update(self, snap: RunSnapshot) -> None:
        self.log.maybe(lambda: status_line(snap))

    def close(self, snap: RunSnapshot, summary: dict[str, Any] | None = None) -> None:
        self.log.emit(status_line(snap) + f" | ended after {duration(snap.t)}")


def run_figures(stats: RunStats, *, wall_s: float, charged: float | None, spent: float) -> dict[str, Any]:
    """The money and speed figures of the summary: charged is the account's delta, recorded what the kept
    answers cost, wasted the difference (retried, cut or abandoned answers that were billed). Wasted is never
    below zero: an account that charged exactly what the kept answers cost differs from their sum by float
    rounding (which printed "$-0.0000"), and one read before it billed them all (its lag) wasted nothing."""
    paid = charged if charged is not None else spent
    return {
        "charged_usd": None if charged is None else round(charged, 8),
        "recorded_usd": round(stats.recorded_usd, 8),
        "wasted_usd": None if charged is None else max(0.0, round(charged - stats.recorded_usd, 8)),
        "spend_usd": round(paid, 8),
        "output_tokens_per_s": round(stats.output_tokens / max(wall_s, 1e-9), 1),
        "usd_per_m_output": round(1e6 * paid / stats.output_tokens, 4) if stats.output_tokens else None,
    }


def _run_counts(s: RunStats) -> dict[str, Any]:
    return {"recorded": s.counts["recorded"], "failed": s.counts["failed"], "retried": s.counts["retried"],
            "abandoned": s.abandoned, "output_tokens": s.output_tokens, "prompt_tokens": s.prompt_tokens,
            "reasoning_tokens": s.reasoning_tokens}


def _run_tail(s: RunStats) -> dict[str, Any]:
    return {"errors": dict(s.errors), "providers": dict(s.providers), "finish_reasons": dict(s.finish),
            "provider_health": {name: ps.figures() for name, ps in sorted(s.by_provider.items())},
            "by_turn": {str(t): n for t, n in sorted(s.turns.items())},
            "tool_calls": {**{k: s.tool_calls[k] for k in ("answers", "calls", "ids_rebuilt", "mismatched")},
                           "mismatches": {kind: s.tool_calls[f"mismatched_{kind}"] for kind in MISMATCHES}},
            "retokenized_agreement_mean": (sum(s.agreement) / len(s.agreement)) if s.agreement else None,
            "cut_samples": cut_samples(s)}


def cut_samples(s: RunStats) -> dict[str, Any]:
    """The cut samples among this run's records (streams the run closed at a target or on Ctrl-C, kept as the
    prefix they delivered): how many, their share, their lengths beside the finished answers', and the streams closed
    to keep that were no cut sample, by why (their prompts stay to do). `paused`: how many of them pause their turn
    (a Ctrl-C's: the turn is asked again by the next run); `finished_after_pause`: turns this run answered that an
    earlier pause sample had cut."""
    cut, whole = s.lengths[True], s.lengths[False]

    def quantiles(xs: list[int]) -> list[int] | None:
        return [int(q) for q in np.quantile(xs, [0.1, 0.5, 0.9])] if xs else None

    return {"records": len(cut), "share": round(len(cut) / (len(cut) + len(whole)), 4) if cut or whole else None,
            "tokens_p10_p50_p90": quantiles(cut), "finished_tokens_p10_p50_p90": quantiles(whole),
            "closed_not_kept": dict(s.not_kept), "paused": s.counts["paused"],
            "finished_after_pause": s.counts["finished_after_pause"]}


def dataset_summary(name: str, store: Any, stats: RunStats, *, common: dict[str, Any], stop_reason: str,
                    fatal: dict | None, prompts: int, target: int | None, figures: dict[str, Any],
                    settings: dict[str, Any], done_before: int, target_met_s: float | None, extra: dict[str, Any],
                    routing: dict[str, Any]) -> dict[str, Any]:
    """summary.json of one dataset (docs/FORMATS.md#summaryjson): dataset totals over all runs, then this run."""
    return {
        "dataset": name, **common, "stop_reason": stop_reason, "fatal_error": fatal,
        # dataset totals (all runs), read by budget.ipynb's planned-vs-actual
        "output_tokens": store.output_tokens, "spend_usd": round(store.spend_usd, 8), "records": store.answers,
        "pause_samples": store.recorded - store.answers, "failures": store.failed, "prompts": prompts,
        "remaining": prompts - store.conversations_finished,
        "open_conversations": len(store.chains),
        "target_output_tokens": target,
        "run": {**_run_counts(stats), **figures, **settings, **_run_tail(stats), **extra,
                "target_met_s": None if target_met_s is None else round(target_met_s, 1),
                "torn_bytes_repaired": store.torn_bytes, "done_before": done_before},
        "routing": routing, "timeline_columns": TIMELINE_COLUMNS, "timeline": thin(stats.timeline),
    }


def run_summary(names: list[str], summaries: dict[str, dict[str, Any]], stats: RunStats, *, common: dict[str, Any],
                stop_reason: str, fatal: dict | None, figures: dict[str, Any], settings: dict[str, Any],
                extra: dict[str, Any], routing: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run over several datasets: the totals, the account's figures, and each dataset's
    summary.json under `datasets` (docs/FORMATS.md#the-run-summary)."""
    per = [summaries[n] for n in names]
    targets = [s["target_output_tokens"] for s in per]
    return {
        "datasets": {n: summaries[n] for n in names}, **common, "stop_reason": stop_reason, "fatal_error": fatal,
        "output_tokens": sum(s["output_tokens"] for s in per), "spend_usd": round(sum(s["spend_usd"] for s in per), 8),
        "records": sum(s["records"] for s in per), "pause_samples": sum(s["pause_samples"] for s in per),
        "failures": sum(s["failures"] for s in per),
        "prompts": sum(s["prompts"] for s in per), "remaining": sum(s["remaining"] for s in per),
        "target_output_tokens": sum(targets) if all(t is not None for t in targets) else None,
        "run": {**_run_counts(stats), **figures, **settings, **_run_tail(stats), **extra},
        "routing": routing, "timeline_columns": TIMELINE_COLUMNS, "timeline": thin(stats.timeline),
    }
