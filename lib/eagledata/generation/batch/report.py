"""What a batch run shows: the status line and the live panel's table of rounds, and the summaries (summary.json per
dataset, the run's), read from the run's state only."""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from ..config import GenerateConfig
from ..conversations.fidelity import FidelityJudge
from ..policy import StopReason
from ..report.panel import BatchPanel
from ..report.progress import RunStats, dataset_summary, run_figures, run_summary
from .service import VANISHED, BatchService
from .state import LaneBatches

log = logging.getLogger("eagledata.generate")


class BatchRun(Protocol):
    """What the report reads of a run (route.BatchRun)."""

    cfg: GenerateConfig
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

    @property
    def spent(self) -> float: ...
    @property
    def booked(self) -> float: ...


def show_status(run: BatchRun) -> None:
    """A status line (logging) every poll, and the live panel's table of rounds in JupyterLab."""
    parts = []
    for lb in run.lanes:
        i, lane = lb.info, lb.lane
        head = f"{lane.name} {lane.store.output_tokens:,}" + (f"/{lane.target:,}" if lane.target else "") + " tok"
        if lb.entry is not None and i is not None:
            head += (f", round {i.round} {i.status} {i.answered}/{i.lines} answered, {i.failed} failed, "
                     f"waiting {i.waited_s / 60:.1f} min")
        parts.append(head)
    line = f"{' | '.join(parts)} | ${run.spent:.4f} answered, ${run.booked:.4f} booked"
    log.info("batch route: %s", line)
    if run.panel is not None:
        run.panel.update(line, [i.row() for lb in run.lanes for i in lb.rounds])


def _settings(run: BatchRun) -> dict[str, Any]:
    cfg, service = run.cfg, run.service
    return {"route": "batch", "batch_service": service.name, "batch_model": cfg.batch_model,
            "batch_window": cfg.batch_window, "max_spend_usd": cfg.max_spend_usd,
            "reserve_usd": cfg.reserve_usd, "balance_start_usd": run.balance_start,
            "budget_mode": "strict", "concurrency": None, "max_tokens": cfg.max_tokens,
            "turns": cfg.turns, "cheapest_eligible_usd_per_m_output": service.price.completion_per_m,
            "planned_usd_per_m_output": None}


def _common(run: BatchRun) -> dict[str, Any]:
    return {"model": run.cfg.batch_model, "base_url": run.cfg.batch_base_url, "backend": run.service.name,
            "started_at": run.started_at, "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(run.clock() - run.t0, 3)}


def _extra(lanes: list[LaneBatches]) -> dict[str, Any]:
    rounds = [i.row() for lb in lanes for i in lb.rounds]
    left = [lb.entry.batch_id for lb in lanes if lb.entry is not None]
    vanished = [i.batch_id for lb in lanes for i in lb.rounds if i.status == VANISHED]
    return {"foreign_usd": 0.0, "money_left": None, "concurrency_changes": [], "batches": rounds,
            "batches_running": left, "batches_vanished": vanished,
            "waited_s": round(max((i.waited_s + i.started for lb in lanes for i in lb.rounds), default=0.0), 1)}


def write_summaries(run: BatchRun) -> dict[str, Any]:
    """Every dataset's summary.json written; returns the summary (one dataset alone: its own; else the run's)."""
    wall = run.clock() - run.t0
    charged = None if run.balance_start is None or run.balance_end is None else \
        max(0.0, run.balance_start - run.balance_end)
    routing = {"provider": None, "source": f"{run.service.name} batch API", "route": "batch"}
    per: dict[str, dict[str, Any]] = {}
    single = len(run.lanes) == 1
    for lb in run.lanes:
        lane = lb.lane
        per[lane.name] = {**dataset_summary(
            lane.name, lane.store, lane.stats, common=_common(run),
            stop_reason=lane.stop_reason, fatal=run.fatal, prompts=lane.scan.total, target=lane.target,
            figures=run_figures(lane.stats, wall_s=wall, charged=charged if single else lb.usd, spent=lb.usd),
            settings=_settings(run), done_before=lane.done_before, target_met_s=lane.target_met_s,
            extra=_extra([lb]), routing=routing), "fidelity": lane.fidelity.summary(verdicts=run.judge)}
        lane.store.write_summary(per[lane.name])
    if single:
        return per[run.lanes[0].lane.name]
    totals = RunStats.combined([lb.lane.stats for lb in run.lanes])
    return {**run_summary([lb.lane.name for lb in run.lanes], per, totals, common=_common(run),
                          stop_reason=run.stop_reason or StopReason.COMPLETED, fatal=run.fatal,
                          figures=run_figures(totals, wall_s=wall, charged=charged, spent=run.spent),
                          settings=_settings(run), extra=_extra(run.lanes), routing=routing),
            "fidelity": run.judge.summary()}
