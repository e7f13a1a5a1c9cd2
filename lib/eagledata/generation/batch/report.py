"""What a batch run shows: the status line and the live panel's table of rounds (every `status_interval_s`, between
polls too), and the summaries (summary.json per dataset, the run's), read from the run's state only."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ...status import StatusLog, duration
from ..conversations.fidelity import FidelityJudge
from ..policy import StopReason
from ..report.panel import BatchPanel
from ..report.progress import RunStats, dataset_summary, run_figures, run_summary
from .service import VANISHED, BatchService
from .state import LaneBatches, RoundInfo

log = logging.getLogger("eagledata.generate")


@dataclass(frozen=True)
class BatchShown:
    """The settings a batch run's summaries show that no part owns (route.BatchRun makes it from the config)."""

    batch_model: str
    batch_base_url: str
    batch_window: str
    max_tokens: int
    turns: str


class BatchView(Protocol):
    """What the report reads of a run: a view of `route.BatchRun` (the loop itself, which owns the money's limits)."""

    shown: BatchShown
    max_spend_usd: float | None
    reserve_usd: float
    service: BatchService
    lanes: list[LaneBatches]
    judge: FidelityJudge
    panel: BatchPanel | None
    balance_start: float | None
    balance_end: float | None
    stop_reason: str
    fatal: dict[str, Any] | None
    started_at: str
    t0: float
    clock: Callable[[], float]
    timeline: list[list[float]]

    @property
    def spent(self) -> float: ...
    @property
    def booked(self) -> float: ...


def _clock_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M UTC")


def batch_eta_s(info: RoundInfo, now: float, since_poll_s: float = 0.0) -> float | None:
    """Seconds until a batch in progress is done: at the rate its lines were answered by the last poll (since it was
    submitted, validation and the queue included: an upper estimate), less the time since that poll, never past its
    window's end; before any answer only the window bounds it (None without one). `now`: the wall clock."""
    to_window = None if info.window_end is None else max(0.0, info.window_end - now)
    if info.answered <= 0 or info.waited_s <= 0:
        return to_window
    left = info.lines - info.answered - info.failed
    eta = max(0.0, left * info.waited_s / info.answered - since_poll_s)
    return eta if to_window is None else min(eta, to_window)


def status_line(run: BatchView, now: float | None = None) -> str:
    """What a batch run is doing, in one line: per dataset its tokens of the target, its round and that batch's
    lines answered of its total, the window's end and an ETA; then the money (answered, booked, the cap) and the
    time so far. `now`: the wall clock (time.time)."""
    now = time.time() if now is None else now
    elapsed = run.clock() - run.t0
    parts = []
    for lb in run.lanes:
        i, lane = lb.info, lb.lane
        head = f"{lane.name} {lane.store.output_tokens:,}" + (
            f"/{lane.target:,} tok ({100 * lane.store.output_tokens / lane.target:.1f} %)" if lane.target else " tok")
        if lb.entry is not None and i is not None:
            waited = elapsed - i.started
            head += (f", round {i.round} of {lb.planned_rounds} planned: {i.status} {i.answered:,}/{i.lines:,} lines "
                     "answered"
                     + (f", {i.failed:,} failed" if i.failed else "") + f", waiting {duration(waited)}")
            if i.window_end is not None:
                head += f", window ends {_clock_time(i.window_end)} (in {duration(i.window_end - now)})"
            eta = batch_eta_s(i, now, since_poll_s=max(0.0, waited - i.waited_s))
            head += (f", ETA at most {duration(eta)} (the window's end)" if i.answered <= 0 and eta is not None
                     else f", ETA {duration(eta)}")
        elif lane.stop_reason:
            head += f", {lane.stop_reason} in {lb.rounds_used} round(s) of {lb.planned_rounds} planned"
        parts.append(head)
    cap = f" of ${run.max_spend_usd:,.2f} cap" if run.max_spend_usd is not None else ""
    money = f"${run.spent:.4f} answered, ${run.booked:.4f} booked{cap}"
    return f"{' | '.join(parts)} | {money} | {duration(elapsed)} so far"


class BatchProgress:
    """What a batch run shows while it runs: the live panel in JupyterLab (`panel`), else a status line through
    logging, every `interval_s` (`status_interval_s`: between polls too, which may be minutes apart) and at each
    round's submission and end (`show`). The round events themselves are logged by the route."""

    def __init__(self, panel: BatchPanel | None, interval_s: float, clock: Callable[[], float]):
        self.panel, self.clock = panel, clock
        self.log = StatusLog(interval_s, "eagledata.generate", clock=clock)

    def next_in(self) -> float:
        """Seconds until the next status is due."""
        return max(0.0, self.log.next_at - self.clock())

    def maybe(self, run: BatchView) -> None:
        if self.log.due():
            self.show(run)

    def show(self, run: BatchView) -> None:
        self.log.next_at = self.clock() + self.log.interval_s
        line = status_line(run)
        if self.panel is not None:
            self.panel.update(line, [i.row() for lb in run.lanes for i in lb.rounds])
        else:
            self.log.emit(f"batch route: {line}")


def _settings(run: BatchView) -> dict[str, Any]:
    shown, service = run.shown, run.service
    return {"route": "batch", "batch_service": service.name, "batch_model": shown.batch_model,
            "batch_window": shown.batch_window, "max_spend_usd": run.max_spend_usd,
            "reserve_usd": run.reserve_usd, "balance_start_usd": run.balance_start,
            "budget_mode": "strict", "concurrency": None, "max_tokens": shown.max_tokens,
            "turns": shown.turns, "cheapest_eligible_usd_per_m_output": service.price.completion_per_m,
            "planned_usd_per_m_output": None}


def _common(run: BatchView) -> dict[str, Any]:
    return {"model": run.shown.batch_model, "base_url": run.shown.batch_base_url, "backend": run.service.name,
            "started_at": run.started_at, "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(run.clock() - run.t0, 3)}


def _answered(lb: LaneBatches) -> int:
    """Prompts (whole conversations) answered in this run: finished, less those failed for good."""
    lane = lb.lane
    return max(lane.store.conversations_finished - lane.done_before - lane.stats.counts["failed"], 0)


def sample(run: BatchView) -> None:
    """A point of each dataset's timeline and of the run's, at one tick (TIMELINE_COLUMNS): what the service
    charged for the lines settled so far (`spend_usd`, at the batch price), and as the requests in flight the lines
    of the batches in progress not answered yet against their lines (`limit`). Their bookings are worst cases for
    the money check, not charges: `at_bound_usd` stays 0."""
    t = run.clock() - run.t0
    waiting = lines = 0
    for lb in run.lanes:
        i = lb.info if lb.entry is not None else None
        w, n = (max(0, i.lines - i.answered - i.failed), i.lines) if i is not None else (0, 0)
        lb.lane.stats.sample(t, lb.usd, w, n, _answered(lb))
        waiting, lines = waiting + w, lines + n
    RunStats.combined([lb.lane.stats for lb in run.lanes], run.timeline).sample(
        t, run.spent, waiting, lines, sum(_answered(lb) for lb in run.lanes))


def _extra(lanes: list[LaneBatches]) -> dict[str, Any]:
    rounds = [i.row() for lb in lanes for i in lb.rounds]
    left = [lb.entry.batch_id for lb in lanes if lb.entry is not None]
    vanished = [i.batch_id for lb in lanes for i in lb.rounds if i.status == VANISHED]
    return {"rounds_used": max((lb.rounds_used for lb in lanes), default=0),  # side by side: the deepest's
            "rounds_planned": max((lb.planned_rounds for lb in lanes), default=0),
            "foreign_usd": 0.0, "money_left": None, "concurrency_changes": [], "batches": rounds,
            "batches_running": left, "batches_vanished": vanished,
            "waited_s": round(max((i.waited_s + i.started for lb in lanes for i in lb.rounds), default=0.0), 1)}


def write_summaries(run: BatchView) -> dict[str, Any]:
    """Every dataset's summary.json written; returns the summary (one dataset alone: its own; else the run's).

    The money: `charged_usd` is what the service charged for the lines this run settled (every answered line at the
    batch price; failed, expired and cancelled lines cost nothing), `recorded_usd` what the kept ones cost, and
    `wasted_usd` the rest (answers refused). The account's balance delta over the run is `account_delta_usd`, beside
    them and not the same: lines of a batch adopted from an earlier run were charged before this run read the balance,
    and lines of a batch left running are charged after it settled anything."""
    wall = run.clock() - run.t0
    delta = None if run.balance_start is None or run.balance_end is None else \
        round(max(0.0, run.balance_start - run.balance_end), 8)
    routing = {"provider": None, "source": f"{run.service.name} batch API", "route": "batch"}
    per: dict[str, dict[str, Any]] = {}
    single = len(run.lanes) == 1
    for lb in run.lanes:
        lane = lb.lane
        per[lane.name] = {**dataset_summary(
            lane.name, lane.store, lane.stats, common=_common(run),
            stop_reason=lane.stop_reason, fatal=run.fatal, prompts=lane.scan.total, target=lane.target,
            figures=run_figures(lane.stats, wall_s=wall, charged=lb.usd, spent=lb.usd),
            settings=_settings(run), done_before=lane.done_before, target_met_s=lane.target_met_s,
            extra={**_extra([lb]), **({"account_delta_usd": delta} if single else {})}, routing=routing),
            "fidelity": lane.fidelity.summary(verdicts=run.judge)}
        lane.store.write_summary(per[lane.name])
    if single:
        return per[run.lanes[0].lane.name]
    totals = RunStats.combined([lb.lane.stats for lb in run.lanes], run.timeline)
    return {**run_summary([lb.lane.name for lb in run.lanes], per, totals, common=_common(run),
                          stop_reason=run.stop_reason or StopReason.COMPLETED, fatal=run.fatal,
                          figures=run_figures(totals, wall_s=wall, charged=run.spent, spent=run.spent),
                          settings=_settings(run), extra={**_extra(run.lanes), "account_delta_usd": delta},
                          routing=routing),
            "fidelity": run.judge.summary()}
