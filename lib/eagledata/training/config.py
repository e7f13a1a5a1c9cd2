"""The training stage's notebook settings: hidden_states.ipynb's (`HiddenStatesConfig`) and the groups only it
and the command are made of (`ExtractionJob`, also the flags of `python -m eagledata.hidden_states`; `AuditActions`).

The rule (lib/eagledata/README.md): a notebook's settings class lives in `config.py` of the package that owns its
stage; its parameters cell and its command's flags are made from these fields. The groups that are a domain
function's own parameters stay beside it and are nested here: `ExtractOptions` (`job.extract`), `VllmOptions`
(`vllm_backend.VllmSource`), `AssemblyPolicy` (`assembly.assemble`), `AuditPolicy` (`audit.audit`). Nothing in
the package imports this module but its `__init__`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..aio import run_sync
from ..defaults import shared
from ..settings import Settings, nested, setting
from .assembly import AssemblyPolicy, Sample
from .audit import AuditPolicy
from .job import ExtractOptions, ExtractResult, extract, extract_with_vllm_async, torchrun_world
from .layers import resolve_layers, vllm_layer_ids
from .memory import Devices, MemoryPlan, model_config
from .storage import LayoutName
from .transformers_backend import memory_plan
from .vllm_backend import VllmOptions, vllm_serve_command


@dataclass(frozen=True, kw_only=True)
class ExtractionJob(Settings):
    """Which model, where the states go, on what device: shared by hidden_states.ipynb and the command."""

    output_dir: str = shared("output_dir", "states go to <output_dir>/hidden_states/<name>/")
    name: str = setting("train", "name of the hidden-states set", cli_required=True)
    model: str = setting("moonshotai/Kimi-K2.5", "checkpoint directory or hub id", cli_required=True)
    device: str | None = setting(None, "cuda or cpu; None -> cuda when available")
    device_map: str | None = setting(None, "auto: one process spreads the model over all visible GPUs (accelerate)")
    tp: int = setting(1, "tensor-parallel ranks per model copy: under torchrun (transformers' tp_plan auto; the "
                         "world is dp groups x tp), or the vllm serve command's --tensor-parallel-size")
    status_interval_s: float = shared("status_interval_s")
    backend: Literal["transformers", "vllm"] = setting(
        "transformers", "transformers: load the model here; vllm: a running vllm serve with speculators' "
                        "hidden-states connector (server, vllm_command())")
    options: ExtractOptions = nested(ExtractOptions)
    vllm: VllmOptions = nested(VllmOptions)

    def resolved_device(self) -> str:
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def memory_plan(self, devices: Devices | None = None, world_size: int | None = None) -> MemoryPlan | None:
        """The plan `run` checks before loading (None when the checkpoint's size is unknown, e.g. a hub id)."""
        world = world_size or torchrun_world()[1]
        return memory_plan(self.model, tp=self.tp, dp=max(world // self.tp, 1), device_map=self.device_map,
                           devices=devices, max_tokens_per_batch=self.options.max_tokens_per_batch,
                           device=self.resolved_device())

    def run(self, samples: Sequence[Sample], **kwargs: Any) -> ExtractResult:
        """`extract` with these settings; `kwargs` go to `extract` (rank, fingerprints, progress …). The vllm
        backend runs `extract_with_vllm_async` (from plain code; in Jupyter await `run_async`)."""
        if self.backend == "vllm":
            return run_sync(self.run_async(samples, **kwargs), "ExtractionJob.run_async")
        kwargs.setdefault("device", self.resolved_device())
        kwargs.setdefault("status_interval_s", self.status_interval_s)
        return extract(samples, self.output_dir, self.name, self.model, options=self.options,
                       device_map=self.device_map, tp=self.tp, **kwargs)

    async def run_async(self, samples: Sequence[Sample], **kwargs: Any) -> ExtractResult:
        """Either backend from a running event loop (the notebook): the vllm client awaits the server; the
        transformers backend computes here, in this thread, as `run` does. The vllm backend takes
        `tokenizer_fingerprint`, `records_hashes`, `assembly`, `progress`, `status_interval_s`, `on_batch` and
        `transport`."""
        if self.backend != "vllm":
            return self.run(samples, **kwargs)
        kwargs.setdefault("status_interval_s", self.status_interval_s)
        return await extract_with_vllm_async(samples, self.output_dir, self.name, self.model, vllm=self.vllm,
                                             options=self.options, **kwargs)

    def vllm_command(self, num_layers: int | None = None) -> list[str]:
        """The `vllm serve` argv for the vllm backend with these settings (model, tp, layers, the connector's
        folder); `num_layers` defaults to the checkpoint's config."""
        if num_layers is None:
            config = model_config(self.model)
            num_layers = int((config.get("text_config") or config)["num_hidden_layers"])
        layers = resolve_layers(self.options.layers, num_layers)
        return vllm_serve_command(self.model, vllm_layer_ids(layers, num_layers), tp=self.tp,
                                  shared_storage_path=self.vllm.shared_storage_path)


@dataclass(frozen=True, kw_only=True)
class AuditActions(Settings):
    """What hidden_states.ipynb does with a verdict: nothing unless asked (each is a decision about the data)."""

    routing_file: str | None = setting(None, "audit: a routing decision (params/routing/<model>.yaml) to write the "
                                             "suspects into (provider.ignore, evidence as the reason); None: leave it")
    export_layout: LayoutName | None = setting(
        None, "audit: export the set without the suspects' samples and the outliers as <name>-audited in this "
              "layout (the manifest's `excluded` says what and why); None: no export")


@dataclass(frozen=True, kw_only=True)
class HiddenStatesConfig(Settings):
    """Every setting of hidden_states.ipynb: which datasets, how they are assembled, and the extraction."""

    datasets: list[str] = setting(["B1"], "dataset names (their records.jsonl) or records.jsonl paths")
    tokenizer: str | None = shared("tokenizer")
    job: ExtractionJob = nested(ExtractionJob)
    assembly: AssemblyPolicy = nested(AssemblyPolicy)
    audit: AuditPolicy = nested(AuditPolicy)
    act: AuditActions = nested(AuditActions)
