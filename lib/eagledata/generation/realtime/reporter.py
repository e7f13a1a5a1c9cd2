"""The reporter: where a run stands (snapshots for the live panel or the status line, points of the timelines) and
what it comes to (every dataset's summary.json and the run's summary). It reads the run's parts and writes none of
their state."""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...openrouter import RoutingDecision
from ..conversations.fidelity import FidelityJudge
from ..lanes import DatasetRun
from ..money.ledger import Ledger
from ..policy import StopReason
from ..report.environments import Tally, read_rollouts
from ..report.progress import (
    DatasetSnapshot,
    RunSnapshot,
    RunStats,
    dataset_summary,
    merge_provider_health,
    merge_timelines,
    run_figures,
    run_summary,
)
from .congestion import Congestion
from .dispatcher import Dispatcher


@dataclass(frozen=True)
class RunShown:
    """The settings a run's summaries show that no part owns (parts.py makes it from the config)."""

    model: str
    base_url: str
    backend: str
    budget_mode: str
    max_tokens: int
    turns: str


@dataclass
class Reporter:
    """The run's status and summaries, from the parts' state. Of the settings it takes only what the summaries show
    and nothing the parts own (the cap and the reserve are the ledger's)."""

    shown: RunShown
    dispatcher: Dispatcher
    ledger: Ledger
    congestion: Congestion
    fidelity: FidelityJudge
    routing: RoutingDecision
    t0: float
    idle: bool    # nothing to send: an earlier run's work is reported
    single: str | None  # the one dataset named alone: its summary is the run's (None: several, or `all`)
    streamed: Callable[[], tuple[int, int]] | None = None  # the streams in flight and the characters they delivered
    slots_end: float | None = None  # when the slots ended (the engine says): what follows is the summaries' work

    def __post_init__(self) -> None:
        self.lanes = self.dispatcher.lanes
        self.timeline: list[list[float]] = []  # the run's own samples (each dataset keeps its own)
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.before_start_s = _process_age_s()  # the process's life before the run: imports, a kernel's start

    @property
    def in_flight(self) -> int:
        """HTTP requests under way, over every dataset."""
        return sum(lane.stats.in_flight for lane in self.lanes.values())

    def totals(self) -> RunStats:
        """The run's counters: its datasets' added up, with the run's timeline."""
        return RunStats.combined([lane.stats for lane in self.lanes.values()], self.timeline)

    def sample(self, now: float, final: bool = False) -> None:
        """A point of the timelines. Money is what the account has charged, which never falls and ends at the
        summaries' `charged_usd`; bookings at a bound that no reading has settled are a column apart. (The books
        that admission counts are neither: they hold an unreadable answer at its bound, then drop to its cost.)"""
        t, books = now - self.t0, self.ledger.books
        self.dispatcher.pool.sample(now)
        charged, limit = self.ledger.charged(), self.congestion.allowed
        self.totals().sample(t, charged, self.in_flight, limit, self._answered(), books.at_bound())
        for lane in self.lanes.values():  # one dataset alone: the run's figures
            lane.stats.sample(t, charged if self.single else self._lane_charged(lane, final), lane.stats.in_flight,
                              limit, self._answered(lane), books.at_bound(None if self.single else lane.name))

    def _answered(self, lane: DatasetRun | None = None) -> int:
        """Prompts (whole conversations) answered in this run, of one dataset or all: finished, less those failed
        for good (as a dataset without a target is measured)."""
        lanes = self.lanes.values() if lane is None else [lane]
        return sum(max(one.store.conversations_finished - one.done_before - one.stats.counts["failed"], 0)
                   for one in lanes)

    def _lane_charged(self, lane: DatasetRun, final: bool) -> float:
        """One dataset's money in a run over several: what its readable answers cost (the account's readings are
        the run's, not a dataset's), and at the end its part of the account's delta (`Books.lane_charged`)."""
        books = self.ledger.books
        return books.lane_charged(lane.name) if final else books.known_by_lane.get(lane.name, 0.0)

    def snapshot(self, now: float, final: bool = False) -> RunSnapshot:
        """Where the run stands."""
        streams, chars = self.streamed() if self.streamed is not None and not final else (0, 0)
        return RunSnapshot(t=now - self.t0, in_flight=self.in_flight, limit=self.congestion.allowed,
                           streams=streams, streamed_chars=chars,
                           spent=self.ledger.spent(final), charged=self.ledger.charged(),
                           at_bound=self.ledger.books.at_bound(), cap=self.ledger.max_spend_usd,
                           money_limit=self.ledger.limit(), foreign=self.ledger.books.foreign_usd,
                           suspects=self.fidelity.suspect_headlines(), usable=self.ledger.limit(cap=False),
                           verdicts={name: p.verdict for name, p in self.fidelity.providers.items()},
                           planned_usd_per_m=self._planned_per_m(),
                           stop_reason=(self.dispatcher.stop.reason or StopReason.COMPLETED) if final else None,
                           stats=self.totals(), datasets=[DatasetSnapshot(
                               name=lane.name, done=lane.store.conversations_finished,
                               total_prompts=lane.scan.total, tokens=lane.store.output_tokens, target=lane.target,
                               in_flight=lane.stats.in_flight, stats=lane.stats, done_before=lane.done_before,
                               tokens_before=lane.tokens_before, failed=lane.store.failed)
                               for lane in self.lanes.values()])

    # -- summaries --------------------------------------------------------------------------------
    def summaries(self, now: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """Every dataset's summary.json, and the run's summary (one dataset named alone: that dataset's)."""
        per = {lane.name: self._dataset_summary(lane, now) for lane in self.lanes.values()}
        tallies = {lane.name: read_rollouts(lane.store.files, lane.name) for lane in self.lanes.values()
                   if lane.scan.rollouts or "rollouts" in (lane.summary_before or {})}
        for name, tally in tallies.items():  # the dataset's whole trajectories, read from its records
            per[name]["rollouts"] = tally.figures()
        if self.single:
            return per, per[self.single]
        run = self._run_summary(per, now)
        if tallies:
            run["rollouts"] = functools.reduce(Tally.merge, tallies.values(), Tally()).figures()
        return per, run

    def _run_settings(self) -> dict[str, Any]:
        cheapest = self.routing.cheapest()
        return {"max_spend_usd": self.ledger.max_spend_usd, "reserve_usd": self.ledger.reserve_usd,
                "balance_start_usd": self.ledger.balance_start, "budget_mode": self.shown.budget_mode,
                "concurrency": self.ledger.concurrency, "max_tokens": self.shown.max_tokens, "turns": self.shown.turns,
                "cheapest_eligible_usd_per_m_output": cheapest.completion_per_m if cheapest else None,
                "planned_usd_per_m_output": self._planned_per_m()}

    def _planned_per_m(self) -> float | None:
        """The budget plan's $ per million output tokens over this run's targets: the spend line it expects (None
        when a dataset with a target has no plan)."""
        planned = [(lane.planned_usd, lane.target) for lane in self.lanes.values() if lane.target is not None]
        if not planned or any(usd is None for usd, _ in planned):
            return None
        return round(1e6 * sum(usd or 0.0 for usd, _ in planned) / sum(t or 0 for _, t in planned), 4)

    def _shared(self, wall: float) -> dict[str, Any]:
        """What every summary of the run says alike."""
        return {"common": {"model": self.shown.model, "base_url": self.shown.base_url, "backend": self.shown.backend,
                           "started_at": self.started_at,
                           "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
                           "wall_s": round(wall, 3)},
                "fatal": self.dispatcher.stop.fatal.error_dict() if self.dispatcher.stop.fatal else None,
                "settings": self._run_settings(),
                "routing": {"provider": self.routing.provider, "source": self.routing.source}}

    def _extra(self, now: float) -> dict[str, Any]:
        changes = [[round(t - self.t0, 1), round(share, 3), round(limit)]
                   for t, share, limit in self.congestion.history if limit < self.ledger.concurrency][-200:]
        readback = self.ledger.readback
        return {"foreign_usd": round(self.ledger.books.foreign_usd, 8), "money_left": self.ledger.money_left,
                "concurrency_changes": changes,
                **({"killed_wasted_usd": round(self.ledger.killed_wasted_usd, 8)}
                   if self.ledger.killed_wasted_usd is not None else {}),
                **({"read_back": readback.figures()} if readback is not None and readback.counts.streams else {}),
                "timing": self._timing(), "pool": self.dispatcher.pool.figures(now)}

    def _timing(self) -> dict[str, float | None]:
        """Where the user's wait went: the process before the run, the run to its last target, to its slots' end
        (answers still in flight, retries waiting), and `wall_s` once the summaries are written."""
        met = [lane.target_met_s for lane in self.lanes.values() if lane.target is not None]
        times = [t for t in met if t is not None]
        return {"before_start_s": self.before_start_s,
                "last_target_s": round(max(times), 3) if times and len(times) == len(met) else None,
                "slots_end_s": None if self.slots_end is None else round(self.slots_end - self.t0, 3)}

    def _dataset_summary(self, lane: DatasetRun, now: float) -> dict[str, Any]:
        """summary.json of one dataset. In a run over several, its money is its part of the account's delta
        (`Books.lane_charged`; `run.shared_with` names the others)."""
        wall = now - self.t0
        charged = self.ledger.books.charged_usd
        if charged is not None and not self.single:
            charged = self._lane_charged(lane, final=True)
        summary = {**dataset_summary(
            lane.name, lane.store, lane.stats, **self._shared(wall), stop_reason=lane.stop_reason,
            prompts=lane.scan.total, target=lane.target,
            figures=run_figures(lane.stats, wall_s=wall, charged=charged,
                                spent=self.ledger.books.spent() if self.single else lane.stats.booked_usd),
            done_before=lane.done_before, target_met_s=lane.target_met_s,
            extra={**self._extra(now),
                   **({"killed_before": lane.killed_before.figures()} if lane.killed_before else {}),
                   **({"shared_with": [n for n in self.lanes if n != lane.name]} if not self.single else {})}),
            "fidelity": lane.fidelity.summary(verdicts=self.fidelity)}
        return self._carried(summary, [lane.summary_before or {}])

    def _run_summary(self, summaries: dict[str, dict[str, Any]], now: float) -> dict[str, Any]:
        wall = now - self.t0
        totals = self.totals()
        summary = {**run_summary(list(self.lanes), summaries, totals, **self._shared(wall),
                                 stop_reason=self.dispatcher.stop.reason or StopReason.COMPLETED,
                                 figures=run_figures(totals, wall_s=wall, charged=self.ledger.books.charged_usd,
                                                     spent=self.ledger.books.spent()),
                                 extra=self._extra(now)),
                   "fidelity": self.fidelity.summary()}
        return self._carried(summary, list(summaries.values()))

    def _carried(self, summary: dict[str, Any], before: list[dict[str, Any]]) -> dict[str, Any]:
        """An idle run (nothing to send: a finished report run again) keeps the timeline and provider health of
        the run that did the work, so the report, and the panel's last frame, show that run, not an empty one."""
        if not self.idle:
            return summary
        summary["timeline"] = merge_timelines([b.get("timeline") or [] for b in before])
        summary["run"]["provider_health"] = merge_provider_health(
            [(b.get("run") or {}).get("provider_health") or {} for b in before])
        return summary


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), None elsewhere. In a notebook it is the kernel's."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None
