"""EAGLE-3 hidden states of the target model over the exact training ids, stored without padding.

Only the decoder stack runs (never the LM head: B×T×V logits would dwarf everything). Forward
hooks take the three aux states as they ENTER their layers (HF `hidden_states[i]`), and the final
state from the decoder's own output (post-norm) or the last layer's output (pre-norm), keeping
real tokens only. Work is split by a hash of the sample id, so a resume with another batch size
or world size skips exactly what is stored. How the states land on disk (eagledata's shards or a
trainer's own layout) and how a resume knows what is stored is `storage`'s business.
"""
from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..defaults import shared
from ..errors import InputError
from ..layout import hidden_state_files
from ..settings import Settings, nested, setting
from ..status import StatusLog, duration, ensure_log_handler, eta_s, widget_frontend
from .assembly import AssemblyPolicy, Sample
from .engine import (Backend, EngineOptions, check_backend, engine_layer_ids, extract_with_engine_async, model_config,
                     vllm_serve_command)
from .memory import (KIMI_K25_CHECKPOINT_BYTES, Devices, Layout, MemoryPlan, ModelShape, check_layout, checkpoint_bytes,
                     kimi_k25_config, plan_memory, visible_devices)
from .models import Decoder, config_vocab_size, find_decoder, load_model, model_name
from .quantized import read_config
from .storage import (STORAGE_DTYPES, Final, LayoutName, Storage, check_plan, check_stored, finalize, get_layout,
                      read_parts)


# -- the layer rule -----------------------------------------------------------------------------
def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """States entering layers {2, L//2, L-3}, in HF `hidden_states` numbering (0 = embeddings)."""
    if num_layers < 4:
        raise InputError(f"EAGLE-3 needs at least 4 decoder layers, the model has {num_layers}", field="layers")
    return 2, num_layers // 2, num_layers - 3


def resolve_layers(layers: Sequence[int] | None, num_layers: int) -> tuple[int, int, int]:
    if layers is None:
        return eagle3_layers(num_layers)
    layers = tuple(int(i) for i in layers)
    if len(layers) != 3 or not all(0 <= i < num_layers for i in layers):
        raise InputError(f"layers must be three HF hidden_states indices in 0..{num_layers - 1}, got {layers}",
                         field="layers")
    return layers  # type: ignore[return-value]


# -- planning (pure) ------------------------------------------------------------------------------
def owner(sample_id: str, world_size: int) -> int:
    """The rank that extracts a sample: by id, so any world size agrees on who did what."""
    return int.from_bytes(hashlib.sha1(sample_id.encode()).digest()[:8], "big") % world_size


def plan_batches(lengths: Sequence[int], max_tokens: int, max_batch_size: int | None = None) -> list[list[int]]:
    """Indices grouped longest first, each batch's padded size (rows × longest) within `max_tokens`.

    Sorting by length keeps padding (compute, never storage) small; a sequence longer than the
    budget runs alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        full = max_batch_size is not None and len(current) >= max_batch_size
        if current and (full or longest * (len(current) + 1) > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


# -- capture --------------------------------------------------------------------------------------
@dataclass
class Capture:
    """Hooks that copy the aux states entering three layers (and the pre-norm final state) for real tokens.

    Each hook writes straight into one [N, 4, H] buffer (N = real tokens in the batch), so no
    per-layer [B, T, H] copy outlives the hook and padding never leaves the device step.
    """

    decoder: Decoder
    layers: tuple[int, int, int]
    final: Final
    keep: torch.Tensor | None = None  # [B, T] bool: real tokens
    out: torch.Tensor | None = None  # [N, 4, H]
    handles: list[Any] = field(default_factory=list)

    def __enter__(self) -> "Capture":
        for slot, i in enumerate(self.layers):
            self.handles.append(self.decoder.layers[i].register_forward_pre_hook(
                self._pre_hook(slot), with_kwargs=True))
        if self.final == "pre_norm":
            self.handles.append(self.decoder.layers[-1].register_forward_hook(self._post_hook(3)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _store(self, slot: int, h: torch.Tensor) -> None:
        self.out[:, slot] = h[self.keep] if self.keep is not None else h.reshape(-1, h.shape[-1])

    def _pre_hook(self, slot: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._store(slot, args[0] if args else kwargs["hidden_states"])
        return hook

    def _post_hook(self, slot: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._store(slot, output[0] if isinstance(output, (tuple, list)) else output)
        return hook

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """[N, 4, H] states of the real tokens, in row-major (sample, position) order."""
        self.keep = attention_mask.bool() if attention_mask is not None else None
        n = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
        self.out = torch.empty(n, 4, self.decoder.hidden_size, dtype=dtype, device=input_ids.device)
        last = self.decoder.module(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        if self.final == "post_norm":
            self._store(3, last)
        out, self.out, self.keep = self.out, None, None
        return out


# -- settings ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExtractOptions(Settings):
    """What to capture and how to store it (the notebook's and the command's settings)."""

    layers: list[int] | None = setting(None, "three HF hidden_states indices; None -> EAGLE-3 rule {2, L//2, L-3}")
    layout: LayoutName = setting("eagledata", "eagledata (shards), speculators (Arrow dataset + hs_{i} files) "
                                              "or specforge (a torch file per sample)")
    final: Final | None = setting(None, "post_norm or pre_norm; None -> the layout's trainer convention "
                                        "(post_norm for eagledata)")
    storage: Storage = setting("bf16", "bf16 (8*H bytes/token), fp8 (e4m3 + per-token scale, 4*H + 16; "
                                       "eagledata layout only) or fp32")
    max_tokens_per_batch: int = setting(16_384, "padded tokens (rows x longest) per forward")
    max_batch_size: int | None = setting(None, "rows per forward; None -> as many as the token budget allows")
    shard_bytes: int = setting(1 << 30, "states are written (a shard, or a batch of per-sample files) once "
                                        "they reach this size")

    def resolved_final(self) -> Final:
        return self.final or get_layout(self.layout).final or "post_norm"

    def convention_mismatch(self) -> str | None:
        """Why an explicit `final` will mislead the layout's trainer (None when it agrees)."""
        expected = get_layout(self.layout).final
        if self.final is None or expected is None or self.final == expected:
            return None
        return (f"final={self.final}, but {self.layout}'s trainer expects {expected} as the last state "
                f"({get_layout(self.layout).about})")


# -- extraction -----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class ExtractResult:
    directory: Path
    rank: int
    world_size: int
    tp: int = 1
    weight_bytes: int = 0  # this process's share of the weights (tensor parallel: about 1/tp of the sharded ones)
    extracted: int  # samples this call computed (and wrote: 0 on a tensor-parallel group's other ranks)
    skipped: int  # samples already stored (resume)
    tokens: int
    seconds: float
    complete: bool  # every sample of the set is stored and the manifest is written
    manifest: dict[str, Any] | None = None


def torchrun_world() -> tuple[int, int]:
    """(rank, world size) as torchrun sets them; (0, 1) in a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def check_samples(samples: Sequence[Sample], vocab_size: int) -> None:
    """Refuse bad input before any compute: duplicate ids, ids the model cannot embed, bad masks."""
    seen: set[str] = set()
    for s in samples:
        if s.id in seen:
            raise InputError(f"sample id {s.id!r} appears twice", field="id")
        seen.add(s.id)
        if not s.input_ids or len(s.input_ids) != len(s.loss_mask):
            raise InputError(f"sample {s.id!r}: input_ids and loss_mask must be non-empty and of equal length")
        bad = [i for i in s.input_ids if not 0 <= i < vocab_size]
        if bad:
            raise InputError(f"sample {s.id!r} ({s.dataset or 'no dataset'}): token ids {bad[:5]} outside the "
                             f"model's vocabulary (0..{vocab_size - 1})", field="input_ids")


def memory_plan(model: str | Path, *, tp: int = 1, dp: int = 1, device_map: Any = None,
                devices: Devices | None = None, max_tokens_per_batch: int = 16_384,
                device: str | None = None) -> MemoryPlan | None:
    """The checkpoint's memory plan for this layout (None when its size on disk is unknown, e.g. a hub id)."""
    size = checkpoint_bytes(str(model))
    if size is None and str(model) == "moonshotai/Kimi-K2.5":  # the published facts: no download needed
        config, size = kimi_k25_config(), KIMI_K25_CHECKPOINT_BYTES
    elif size is None:
        return None
    else:
        config = read_config(model)
    devices = devices or visible_devices()
    compute_bytes = 4 if devices.kind == "cpu" or str(device or "").startswith("cpu") else 2
    return plan_memory(config, size, devices, Layout(tp=tp, dp=dp, device_map=device_map if device_map else None),
                       max_tokens_per_batch=max_tokens_per_batch, compute_bytes=compute_bytes)


def check_before_loading(model: str | Path, *, tp: int = 1, dp: int = 1, device_map: Any = None,
                         devices: Devices | None = None, max_tokens_per_batch: int = 16_384,
                         device: str | None = None) -> MemoryPlan | None:
    """Config-level refusals before a byte of weights loads: quantization format, tp vs heads, memory."""
    config = kimi_k25_config() if str(model) == "moonshotai/Kimi-K2.5" else read_config(model)
    shape = ModelShape.from_config(config)  # raises on an unsupported quantization_config
    check_layout(shape, Layout(tp=tp, dp=dp, device_map=device_map if isinstance(device_map, str) else None),
                 devices or visible_devices())
    if tp > 1 and shape.quantization is not None:
        # transformers 5.23 shards the checkpoint's per-expert tensors before dequantizing them, and
        # weight_packed/weight_shape cannot be sliced that way (IndexError in sharding_utils.shard_tensor)
        raise InputError(f"tp={tp} with a compressed-tensors checkpoint: transformers cannot shard packed "
                         "experts; use device_map=auto (one process, all GPUs) or the vLLM backend "
                         "(lib/eagledata/training/README.md, 'Engine backend')", field="tp")
    if device_map is not None and not isinstance(device_map, str):
        return None  # an explicit placement: the caller planned it
    plan = memory_plan(model, tp=tp, dp=dp, device_map=device_map, devices=devices,
                       max_tokens_per_batch=max_tokens_per_batch, device=device)
    if plan is not None:
        plan.check()
    return plan


def plan_doc(model: str, decoder: str, num_layers: int, hidden_size: int, vocab_size: int, layers: Sequence[int],
             opts: ExtractOptions, compute_dtype: torch.dtype) -> dict[str, Any]:
    """`plan.json`: what every run adding to a set must share (either backend)."""
    layout = get_layout(opts.layout)
    return {"model": model, "layout": layout.name, "decoder": decoder,
            "num_layers": num_layers, "layers": list(layers), "final": opts.resolved_final(),
            "dtype": str(STORAGE_DTYPES[opts.storage]).replace("torch.", ""), "storage": opts.storage,
            "hidden_size": hidden_size, "vocab_size": vocab_size,
            "compute_dtype": str(compute_dtype).replace("torch.", "")}


def extract(samples: Sequence[Sample], output_dir: str | Path, name: str, model: str | Path | nn.Module, *,
            options: ExtractOptions | None = None, device: str = "cpu", dtype: torch.dtype | None = None,
            device_map: Any = None, max_memory: dict | None = None, tp: int = 1, rank: int | None = None,
            world_size: int | None = None, tokenizer_fingerprint: str = "",
            records_hashes: dict[str, str] | None = None, devices: Devices | None = None,
            progress: bool = True, status_interval_s: float = 10.0,
            on_batch: Callable[[int], None] | None = None) -> ExtractResult:
    """Hidden states of `samples` into `<output_dir>/hidden_states/<name>/`, resuming what is stored.

    `rank`/`world_size` default to torchrun's RANK/WORLD_SIZE; the world is `world_size // tp`
    data-parallel groups of `tp` tensor-parallel ranks (consecutive ranks form a group). Each group
    takes the samples whose id hashes to it, and only its first rank writes; the manifest and
    `index.jsonl` are written by whichever call finds the set complete. Before any weight loads, the
    checkpoint's config is checked (quantization format, tp against the heads) and its memory plan
    for `devices` (default: the visible ones) must fit. `on_batch(n)` runs after each batch
    (progress reporting; tests inject a kill here). `progress`: a widget bar in JupyterLab, else a status
    line through logging every `status_interval_s` (at batch ends).
    """
    options = options or ExtractOptions()
    env_rank, env_world = torchrun_world()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} outside world size {world_size}", field="rank")
    if tp < 1 or world_size % tp:
        raise InputError(f"tp={tp} does not divide the world size {world_size} (the world is dp × tp)", field="tp")
    dp, dp_rank, tp_rank = world_size // tp, rank // tp, rank % tp
    files = hidden_state_files(name, output_dir)
    directory = files.directory
    layout = get_layout(options.layout)
    layout.check_storage(options.storage)
    if not isinstance(model, nn.Module):  # refuse bad input before loading (minutes for Kimi), not after
        check_samples(samples, config_vocab_size(model))
        check_before_loading(model, tp=tp, dp=dp, device_map=device_map, devices=devices,
                             max_tokens_per_batch=options.max_tokens_per_batch, device=device)
    elif tp > 1:
        raise InputError("tp > 1 needs a checkpoint (transformers shards it while loading), not a loaded module",
                         field="tp")
    loaded = load_model(model, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory, tp=tp, dp=dp)
    decoder = find_decoder(loaded)
    if isinstance(model, nn.Module):
        check_samples(samples, decoder.vocab_size)
    layers = resolve_layers(options.layers, decoder.num_layers)
    compute_dtype = next(decoder.module.parameters()).dtype
    in_device = decoder.module.embed_tokens.weight.device
    plan = plan_doc(model_name(model), decoder.path, decoder.num_layers, decoder.hidden_size, decoder.vocab_size,
                    layers, options, compute_dtype)
    directory.mkdir(parents=True, exist_ok=True)
    files.parts.mkdir(exist_ok=True)
    check_backend(files, "transformers")
    check_plan(files, plan)

    part = files.parts / f"r{rank}-of-{world_size}-{uuid.uuid4().hex[:8]}.jsonl"
    writer = layout.writer(files, part, options.storage, options.shard_bytes, decoder.hidden_size,
                           {s.id: i for i, s in enumerate(samples)})
    writes = tp_rank == 0  # the other ranks of a tensor-parallel group compute the same states
    done = read_parts(files)
    check_stored(files, writer, samples, done)
    # A group's ranks agree on `done` for the group's own samples: only its first rank writes them, and
    # only after a forward every rank of the group takes part in.
    mine = [s for s in samples if owner(s.id, dp) == dp_rank and s.id not in done]
    skipped = sum(1 for s in samples if owner(s.id, dp) == dp_rank) - len(mine)
    batches = plan_batches([len(s) for s in mine], options.max_tokens_per_batch, options.max_batch_size)
    total = sum(len(s) for s in mine)
    start = time.perf_counter()
    bar, status = None, None
    if progress and widget_frontend():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="tok", desc=f"dp {dp_rank}/{dp}" + (f" tp {tp_rank}/{tp}" if tp > 1 else ""))
    elif progress:
        ensure_log_handler()
        status = StatusLog(status_interval_s, "eagledata.hidden_states")
    done_tokens = done_samples = 0

    def line() -> str:
        elapsed = time.perf_counter() - start
        share = 100 * done_tokens / total if total else 100.0
        return (f"hidden states {name} rank {rank}/{world_size}: {done_tokens:,}/{total:,} tokens ({share:.1f}%), "
                f"{done_samples:,}/{len(mine):,} samples | {done_tokens / max(elapsed, 1e-9):,.0f} tok/s | "
                f"ETA {duration(eta_s(done_tokens, total, elapsed))}")

    try:
        with torch.inference_mode(), Capture(decoder, layers, options.resolved_final()) as capture:
            for n, batch in enumerate(batches, 1):
                group = [mine[i] for i in batch]
                ids, mask = _pad([s.input_ids for s in group], in_device)
                states = capture.run(ids, mask, compute_dtype)
                if writes:
                    writer.add(group, states)
                done_tokens += states.shape[0]
                done_samples += len(group)
                if bar is not None:
                    bar.update(states.shape[0])
                if status is not None:
                    status.maybe(line)
                if on_batch is not None:
                    on_batch(n)
            writer.flush()
    finally:
        writer.close()
    if bar is not None:
        bar.close()
    if status is not None:
        status.emit(line() + f" | ended after {duration(time.perf_counter() - start)}")
    seconds = time.perf_counter() - start
    distributed = world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed:
        torch.distributed.barrier()
    # One process group over the world: its rank 0 finalizes after the barrier. One group per tensor-parallel
    # copy (dp > 1 and tp > 1): each copy's writer tries, and the last to finish finds the set complete
    # (finalize is deterministic, so two that race write the same bytes).
    whole_world = distributed and torch.distributed.get_world_size() == world_size
    manifest = None
    if (rank == 0 if whole_world else writes):
        manifest = finalize(files, samples, tokenizer_fingerprint=tokenizer_fingerprint,
                            records_hashes=records_hashes)
    return ExtractResult(directory=directory, rank=rank, world_size=world_size, tp=tp, weight_bytes=local_bytes(loaded),
                         extracted=len(mine) if writes else 0, skipped=skipped if writes else 0,
                         tokens=total, seconds=seconds, complete=manifest is not None, manifest=manifest)


def local_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this process holds (a DTensor counts its local shard)."""
    total = 0
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total


def _pad(seqs: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right padding (positions of real tokens unchanged); no mask at all for a lone sequence."""
    if len(seqs) == 1:
        return torch.tensor([list(seqs[0])], device=device), None
    longest = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), longest, dtype=torch.long)
    mask = torch.zeros(len(seqs), longest, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
    return ids.to(device), mask.to(device)


# -- settings ----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExtractionJob(Settings):
    """Which model, where the states go, on what device: shared by hidden_states.ipynb and the command."""

    output_dir: str = shared("output_dir", "states go to <output_dir>/hidden_states/<name>/")
    name: str = setting("train", "name of the hidden-states set", cli_required=True)
    model: str = setting("moonshotai/Kimi-K2.5", "checkpoint directory or hub id", cli_required=True)
    device: str | None = setting(None, "cuda or cpu; None -> cuda when available")
    device_map: str | None = setting(None, "auto: one process spreads the model over all visible GPUs (accelerate)")
    tp: int = setting(1, "tensor-parallel ranks per model copy: under torchrun (tp_plan=auto; the world is dp "
                         "groups x tp), or the vllm serve command's --tensor-parallel-size")
    status_interval_s: float = shared("status_interval_s")
    backend: Backend = setting("transformers", "transformers: load the model here; vllm: a running vllm serve "
                                               "with speculators' hidden-states connector (server, vllm_command())")
    options: ExtractOptions = nested(ExtractOptions)
    engine: EngineOptions = nested(EngineOptions)

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
        backend runs `engine.extract_with_engine_async` (from plain code; in Jupyter await `run_async`)."""
        if self.backend == "vllm":
            from ..aio import run_sync

            return run_sync(self.run_async(samples, **kwargs), "ExtractionJob.run_async")
        kwargs.setdefault("device", self.resolved_device())
        kwargs.setdefault("status_interval_s", self.status_interval_s)
        return extract(samples, self.output_dir, self.name, self.model, options=self.options,
                       device_map=self.device_map, tp=self.tp, **kwargs)

    async def run_async(self, samples: Sequence[Sample], **kwargs: Any) -> ExtractResult:
        """Either backend from a running event loop (the notebook): the vllm client awaits the server; the
        transformers path computes here, in this thread, as `run` does. The vllm backend takes
        `tokenizer_fingerprint`, `records_hashes`, `progress` and `status_interval_s` only."""
        if self.backend != "vllm":
            return self.run(samples, **kwargs)
        kwargs.setdefault("status_interval_s", self.status_interval_s)
        return await extract_with_engine_async(samples, self.output_dir, self.name, self.model, engine=self.engine,
                                               options=self.options, **kwargs)

    def vllm_command(self, num_layers: int | None = None) -> list[str]:
        """The `vllm serve` argv for the vllm backend with these settings (model, tp, layers, the connector's
        folder); `num_layers` defaults to the checkpoint's config."""
        if num_layers is None:
            config = model_config(self.model)
            num_layers = int((config.get("text_config") or config)["num_hidden_layers"])
        layers = resolve_layers(self.options.layers, num_layers)
        return vllm_serve_command(self.model, engine_layer_ids(layers, num_layers), tp=self.tp,
                                  shared_storage_path=self.engine.shared_storage_path)


@dataclass(frozen=True, kw_only=True)
class HiddenStatesConfig(Settings):
    """Every setting of hidden_states.ipynb: which datasets, how they are assembled, and the extraction."""

    datasets: list[str] = setting(["B1"], "dataset names (their records.jsonl) or records.jsonl paths")
    tokenizer: str | None = shared("tokenizer")
    job: ExtractionJob = nested(ExtractionJob)
    assembly: AssemblyPolicy = nested(AssemblyPolicy)
