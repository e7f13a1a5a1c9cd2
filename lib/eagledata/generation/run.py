"""A generation run's entry: the route (realtime or batch) and the service (the one named, or an emulator started
for the run), chosen once from the settings; `generate` is its sync wrapper."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ..aio import run_sync
from ..defaults import is_emulator
from ..openrouter import resolve_api_key
from ..openrouter.client import LOCAL_KEY
from ..status import ensure_log_handler
from .batch.route import run_batch_route
from .config import GenerateConfig
from .conversations.datasets import select_datasets
from .realtime.attempt import Transport
from .realtime.engine import ViewFactory, run_realtime
from .realtime.parts import Seams

log = logging.getLogger("eagledata.generate")


async def run_generation(cfg: GenerateConfig, *, transport: Transport | None = None, view: ViewFactory | None = None,
                         seams: Seams | None = None) -> dict[str, Any]:
    """Generate one dataset, or several in one pool on one budget; returns the summary (one dataset named alone: its
    summary.json; otherwise the run's, with each dataset's inside). Every input error is raised before the first
    request; a fatal API error (bad key, no endpoints) is raised after the summaries are written. `transport` sends
    each request, `view` shows the run, `seams` replaces the rest (tests and benches pass their own).
    `base_url: emulator` runs against an emulator started for this run (`emulator_speed`; its model follows the
    datasets' tool calls) and stopped after it; no key is read or sent. `route: batch`: the batch route
    (batch/route.py), the same records through Moonshot's Batch API."""
    if cfg.route == "batch":
        return await run_batch_route(cfg)
    seams = with_environments(cfg, seams or (Seams(transport=transport) if transport else Seams()))
    if is_emulator(cfg.base_url):
        from ..emulator_process import serving

        specs = select_datasets(cfg.datasets_file, cfg.dataset)  # a bad name or file before the emulator starts
        async with serving(cfg.base_url, speed=cfg.emulator_speed, tool_datasets=[s.prompts for s in specs]) as url:
            ensure_log_handler()
            log.info(f"base_url emulator: an emulator at {url} for this run (speed {cfg.emulator_speed:g}, no key); "
                     f"records under {Path(cfg.output_dir) / 'datasets'}, routing from {cfg.params_dir}")
            return await run_realtime(dataclasses.replace(cfg, base_url=url), LOCAL_KEY, seams, transport, view)
    return await run_realtime(cfg, resolve_api_key(cfg.base_url, cfg.api_key_env, cfg.backend), seams, transport, view)


def with_environments(cfg: GenerateConfig, seams: Seams) -> Seams:
    """The run's environments executor for agentic tasks, where the caller passed none: each step in a contained worker
    (`agentic.RolloutExecutor`, the settings' time and memory limits, at most `tool_envs` kept live between steps;
    BFCL's backends fetched into .cache/agentic on the first `bfcl` task). Made for every run (it starts nothing until a
    task's step is due), so a task file runs from the command and the notebook as any prompt file does."""
    if seams.environments is not None:
        return seams
    from ..agentic import ContainedEnvironments, Limits
    from ..agentic.executor import RolloutExecutor

    limits = Limits(call_s=cfg.tool_call_s, memory_bytes=cfg.tool_memory_mb << 20)
    return dataclasses.replace(seams, environments=RolloutExecutor(ContainedEnvironments(limits), live=cfg.tool_envs))


def generate(cfg: GenerateConfig) -> dict[str, Any]:
    return run_sync(run_generation(cfg), "run_generation")
