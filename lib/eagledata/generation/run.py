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
    if is_emulator(cfg.base_url):
        from ..emulator_process import serving

        specs = select_datasets(cfg.datasets_file, cfg.dataset)  # a bad name or file before the emulator starts
        async with serving(cfg.base_url, speed=cfg.emulator_speed, tool_datasets=[s.prompts for s in specs]) as url:
            ensure_log_handler()
            log.info(f"base_url emulator: an emulator at {url} for this run (speed {cfg.emulator_speed:g}, no key); "
                     f"records under {Path(cfg.output_dir) / 'datasets'}, routing from {cfg.params_dir}")
            return await run_realtime(dataclasses.replace(cfg, base_url=url), LOCAL_KEY, seams, transport, view)
    return await run_realtime(cfg, resolve_api_key(cfg.base_url, cfg.api_key_env, cfg.backend), seams, transport, view)


def generate(cfg: GenerateConfig) -> dict[str, Any]:
    return run_sync(run_generation(cfg), "run_generation")
