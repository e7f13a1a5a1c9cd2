"""EAGLE-3 hidden states of the target model over the exact training ids, stored without padding.

Only the decoder stack runs (never the LM head: B×T×V logits would dwarf everything). Forward
hooks take the three aux states as they ENTER their layers (HF `hidden_states[i]`), and the final
state from the decoder's own output (post-norm) or the last layer's output (pre-norm), keeping
real tokens only. Work is split by a hash of the sample id, so a resume with another batch size
or world size skips exactly what is stored: a shard is claimed with `os.link` (atomic, never
overwrites) and only then listed in an index part; `finalize` merges the parts once all is done.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from torch import nn

from ..errors import InputError
from ..files import atomic_write_text
from ..layout import HiddenStateFiles, hidden_state_files
from ..defaults import shared
from ..settings import Settings, nested, setting
from ..status import StatusLog, duration, ensure_log_handler, eta_s, widget_frontend
from .assembly import AssemblyPolicy, Sample, samples_hash
from .models import Decoder, config_vocab_size, find_decoder, load_model, model_name

Final = Literal["post_norm", "pre_norm"]
Storage = Literal["bf16", "fp8", "fp32"]
STORAGE_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FORMAT = "eagledata.hidden_states/1"
ERROR_STRIDE = 8  # the storage error is estimated on every 8th token: exact enough, nearly free


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


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn with one float32 scale per token and layer ([N, 4]): amax maps to 448."""
    x = x.float()
    scales = (x.abs().amax(dim=-1) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (x / scales.unsqueeze(-1)).to(torch.float8_e4m3fn), scales


def dequantize_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.unsqueeze(-1)


# -- storage --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExtractOptions(Settings):
    """What to capture and how to store it (the notebook's and the command's settings)."""

    layers: list[int] | None = setting(None, "three HF hidden_states indices; None -> EAGLE-3 rule {2, L//2, L-3}")
    final: Final = setting("post_norm", "post_norm (SpecForge) or pre_norm (vLLM / speculators)")
    storage: Storage = setting("bf16", "bf16 (8*H bytes/token), fp8 (e4m3 + per-token scale, 4*H + 16) or fp32")
    max_tokens_per_batch: int = setting(16_384, "padded tokens (rows x longest) per forward")
    max_batch_size: int | None = setting(None, "rows per forward; None -> as many as the token budget allows")
    shard_bytes: int = setting(1 << 30, "a shard is written once its hidden states reach this size")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _claim_shard(directory: Path, tmp: Path) -> str:
    """Give a finished temp file the lowest free `shard-NNNNN` name: `os.link` never overwrites,
    so ranks and runs of any world size never collide."""
    n = len(list(directory.glob("shard-*.safetensors")))
    while True:
        name = f"shard-{n:05d}.safetensors"
        try:
            os.link(tmp, directory / name)
        except FileExistsError:
            n += 1
            continue
        tmp.unlink()
        _fsync_dir(directory)
        return name


@dataclass
class IndexEntry:
    id: str
    shard: str
    offset: int
    length: int
    digest: str = ""  # of the ids and mask, checked on resume; not in the final index.jsonl

    def line(self, with_digest: bool = True) -> str:
        d = asdict(self)
        if not with_digest:
            d.pop("digest")
        return json.dumps(d, separators=(",", ":")) + "\n"


def read_parts(files: HiddenStateFiles) -> dict[str, IndexEntry]:
    """Every stored sample from all index parts (any rank, any world size); a torn last line is a kill."""
    done: dict[str, IndexEntry] = {}
    parts = files.parts
    for part in sorted(parts.glob("*.jsonl")) if parts.is_dir() else []:
        with part.open("rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break
                e = IndexEntry(**json.loads(raw))
                done.setdefault(e.id, e)
    return done


class _ShardWriter:
    """Buffers whole batches and writes one shard at a time: temp file, fsync, claim, then index.

    Writing overlaps compute (a thread: safetensors and fsync release the GIL), so disk speed only
    shows when it is slower than the model."""

    def __init__(self, directory: Path, part: Path, storage: Storage, shard_bytes: int, hidden_size: int):
        self.directory, self.part, self.storage = directory, part, storage
        per_token = 4 * hidden_size * STORAGE_DTYPES[storage].itemsize
        self.shard_tokens = max(1, shard_bytes // per_token)
        self.samples: list[Sample] = []
        self.states: list[torch.Tensor] = []
        self.scales: list[torch.Tensor] = []
        self.tokens = 0
        self.sq_err = 0.0  # reconstruction error of the stored states vs the computed ones (sampled)
        self.sq_ref = 0.0
        # One shard is written in the background while the next batches compute (at most two in memory).
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="shard-writer")
        self.pending: Future | None = None

    def add(self, samples: Sequence[Sample], states: torch.Tensor) -> None:
        """`states` [N, 4, H] of `samples` back to back; cast (or quantized) once per batch."""
        ref = states[::ERROR_STRIDE].float()
        if self.storage == "fp8":
            stored, scales = quantize_fp8(states)
            back = dequantize_fp8(stored[::ERROR_STRIDE], scales[::ERROR_STRIDE])
            self.scales.append(scales.cpu())
        else:
            stored = states.to(STORAGE_DTYPES[self.storage])
            back = stored[::ERROR_STRIDE].float()
        self.sq_err += float((back - ref).pow(2).sum())
        self.sq_ref += float(ref.pow(2).sum())
        self.states.append(stored.cpu())
        self.samples.extend(samples)
        self.tokens += stored.shape[0]
        if self.tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered samples to the writer thread (after the previous shard is done)."""
        if not self.samples:
            return
        job = (self.samples, self.states, self.scales, self.sq_err, self.sq_ref)
        self.samples, self.states, self.scales, self.tokens, self.sq_err, self.sq_ref = [], [], [], 0, 0.0, 0.0
        self.wait()
        self.pending = self.pool.submit(self._write, *job)

    def wait(self) -> None:
        """Block until the shard in flight is written and indexed; its error, if any, is raised here."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        """Finish the shard in flight (it is complete data); what is still buffered is dropped."""
        try:
            self.wait()
        finally:
            self.pool.shutdown()

    def _write(self, samples: list[Sample], states: list[torch.Tensor], scales: list[torch.Tensor],
               sq_err: float, sq_ref: float) -> None:
        from safetensors.torch import save_file

        tensors = {
            "input_ids": torch.tensor([i for s in samples for i in s.input_ids], dtype=torch.int32),
            "loss_mask": torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.uint8),
            "hidden_states": torch.cat(states) if len(states) > 1 else states[0],
        }
        if self.storage == "fp8":
            tensors["scales"] = torch.cat(scales)
        meta = {"format": FORMAT, "sq_err": repr(sq_err), "sq_ref": repr(sq_ref)}
        tmp = self.directory / f".shard-tmp-{uuid.uuid4().hex}.safetensors"
        save_file(tensors, str(tmp), metadata=meta)
        os.chmod(tmp, 0o644)  # safetensors creates 0600; shards are shared data like every other output
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        name = _claim_shard(self.directory, tmp)
        lines, offset = [], 0
        for sample in samples:
            lines.append(IndexEntry(sample.id, name, offset, len(sample), sample.digest()).line())
            offset += len(sample)
        with self.part.open("ab") as f:  # one write: a kill leaves whole lines plus at most a torn tail
            f.write("".join(lines).encode())
            f.flush()
            os.fsync(f.fileno())


# -- extraction -----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class ExtractResult:
    directory: Path
    rank: int
    world_size: int
    extracted: int  # samples this call computed
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


def _plan_doc(model: str, decoder: Decoder, layers: tuple[int, ...], opts: ExtractOptions,
              compute_dtype: torch.dtype) -> dict[str, Any]:
    return {"format": FORMAT, "model": model, "decoder": decoder.path, "num_layers": decoder.num_layers,
            "layers": list(layers), "final": opts.final, "dtype": str(STORAGE_DTYPES[opts.storage]).replace("torch.", ""),
            "storage": opts.storage, "hidden_size": decoder.hidden_size, "vocab_size": decoder.vocab_size,
            "compute_dtype": str(compute_dtype).replace("torch.", "")}


def _check_plan(files: HiddenStateFiles, plan: dict[str, Any]) -> None:
    """A resume must take the same states in the same format; anything else is another data set."""
    path = files.plan
    if path.is_file():
        old = json.loads(path.read_text())
        keys = ("layers", "final", "storage", "hidden_size", "num_layers", "vocab_size")
        diff = [k for k in keys if old.get(k) != plan[k]]
        if diff:
            raise InputError(f"{files.directory} holds states made with other settings ({', '.join(diff)}: "
                             f"{[old.get(k) for k in diff]} vs {[plan[k] for k in diff]}); use another name",
                             path)
    else:
        atomic_write_text(path, json.dumps(plan, indent=1))


def extract(samples: Sequence[Sample], output_dir: str | Path, name: str, model: str | Path | nn.Module, *,
            options: ExtractOptions | None = None, device: str = "cpu", dtype: torch.dtype | None = None,
            device_map: Any = None, rank: int | None = None, world_size: int | None = None,
            tokenizer_fingerprint: str = "", records_hashes: dict[str, str] | None = None,
            progress: bool = True, status_interval_s: float = 10.0,
            on_batch: Callable[[int], None] | None = None) -> ExtractResult:
    """Hidden states of `samples` into `<output_dir>/hidden_states/<name>/`, resuming what is stored.

    `rank`/`world_size` default to torchrun's RANK/WORLD_SIZE. Each rank takes the samples whose
    id hashes to it; the manifest and `index.jsonl` are written by whichever call finds the set
    complete. `on_batch(n)` runs after each batch (progress reporting; tests inject a kill here). `progress`: a
    widget bar in JupyterLab, else a status line through logging every `status_interval_s` (at batch ends).
    """
    options = options or ExtractOptions()
    env_rank, env_world = torchrun_world()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} outside world size {world_size}", field="rank")
    files = hidden_state_files(name, output_dir)
    directory = files.directory
    if not isinstance(model, nn.Module):  # refuse bad ids before loading (minutes for Kimi), not after
        check_samples(samples, config_vocab_size(model))
    loaded = load_model(model, device=device, dtype=dtype, device_map=device_map)
    decoder = find_decoder(loaded)
    if isinstance(model, nn.Module):
        check_samples(samples, decoder.vocab_size)
    layers = resolve_layers(options.layers, decoder.num_layers)
    compute_dtype = next(decoder.module.parameters()).dtype
    in_device = decoder.module.embed_tokens.weight.device
    plan = _plan_doc(model_name(model), decoder, layers, options, compute_dtype)
    directory.mkdir(parents=True, exist_ok=True)
    files.parts.mkdir(exist_ok=True)
    _check_plan(files, plan)

    done = read_parts(files)
    for s in samples:
        if s.id in done and done[s.id].digest != s.digest():
            raise InputError(f"{directory} holds states of sample {s.id!r} over other ids; use another name",
                             files.parts, field="id")
    mine = [s for s in samples if owner(s.id, world_size) == rank and s.id not in done]
    skipped = sum(1 for s in samples if owner(s.id, world_size) == rank) - len(mine)
    part = files.parts / f"r{rank}-of-{world_size}-{uuid.uuid4().hex[:8]}.jsonl"
    writer = _ShardWriter(directory, part, options.storage, options.shard_bytes, decoder.hidden_size)
    batches = plan_batches([len(s) for s in mine], options.max_tokens_per_batch, options.max_batch_size)
    total = sum(len(s) for s in mine)
    start = time.perf_counter()
    bar, status = None, None
    if progress and widget_frontend():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="tok", desc=f"rank {rank}/{world_size}")
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
        with torch.inference_mode(), Capture(decoder, layers, options.final) as capture:
            for n, batch in enumerate(batches, 1):
                group = [mine[i] for i in batch]
                ids, mask = _pad([s.input_ids for s in group], in_device)
                states = capture.run(ids, mask, compute_dtype)
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
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    manifest = None
    if rank == 0 or world_size == 1 or not torch.distributed.is_initialized():
        manifest = finalize(files, samples, tokenizer_fingerprint=tokenizer_fingerprint,
                            records_hashes=records_hashes)
    return ExtractResult(directory=directory, rank=rank, world_size=world_size, extracted=len(mine), skipped=skipped,
                         tokens=total, seconds=seconds, complete=manifest is not None, manifest=manifest)


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


def finalize(files: HiddenStateFiles, samples: Sequence[Sample], *, tokenizer_fingerprint: str = "",
             records_hashes: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Once every sample is stored: `index.jsonl` in sample order, `manifest.json`, stray files removed.

    Returns None (and writes nothing) while samples are missing. Deterministic, so ranks that race
    here write the same bytes.
    """
    from safetensors import safe_open

    directory = files.directory
    done = read_parts(files)
    if any(s.id not in done for s in samples):
        return None
    entries = [done[s.id] for s in samples]
    shards = sorted({e.shard for e in entries})
    sq_err = sq_ref = 0.0
    for shard in shards:
        with safe_open(str(directory / shard), framework="pt") as f:
            meta = f.metadata() or {}
        sq_err += float(meta.get("sq_err", 0.0))
        sq_ref += float(meta.get("sq_ref", 0.0))
    for stray in [*directory.glob("shard-*.safetensors"), *directory.glob(".shard-tmp-*")]:
        if stray.name not in shards:
            stray.unlink()  # a shard claimed by a killed run before its index line was written
    plan = json.loads(files.plan.read_text())
    tokens = sum(e.length for e in entries)
    shard_bytes = sum((directory / s).stat().st_size for s in shards)
    manifest = {**plan, "shards": shards, "num_samples": len(entries), "num_tokens": tokens,
                "num_loss_tokens": sum(sum(s.loss_mask) for s in samples),
                "bytes": shard_bytes, "bytes_per_token": shard_bytes / tokens if tokens else 0.0,
                "reconstruction_rel_rmse": (sq_err / sq_ref) ** 0.5 if sq_ref else 0.0,  # sampled, see ERROR_STRIDE
                "tokenizer_fingerprint": tokenizer_fingerprint, "records_hashes": records_hashes or {},
                "samples_hash": samples_hash(samples)}
    atomic_write_text(files.index, "".join(e.line(with_digest=False) for e in entries))
    atomic_write_text(files.manifest, json.dumps(manifest, indent=1))
    return manifest


# -- settings ----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExtractionJob(Settings):
    """Which model, where the states go, on what device: shared by hidden_states.ipynb and the command."""

    output_dir: str = shared("output_dir", "states go to <output_dir>/hidden_states/<name>/")
    name: str = setting("train", "name of the hidden-states set", cli_required=True)
    model: str = setting("moonshotai/Kimi-K2.5", "checkpoint directory or hub id", cli_required=True)
    device: str | None = setting(None, "cuda or cpu; None -> cuda when available")
    device_map: str | None = setting(None, "e.g. auto when one process drives several GPUs")
    status_interval_s: float = shared("status_interval_s")
    options: ExtractOptions = nested(ExtractOptions)

    def resolved_device(self) -> str:
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def run(self, samples: Sequence[Sample], **kwargs: Any) -> ExtractResult:
        """`extract` with these settings; `kwargs` go to `extract` (rank, fingerprints, progress …)."""
        kwargs.setdefault("device", self.resolved_device())
        kwargs.setdefault("status_interval_s", self.status_interval_s)
        return extract(samples, self.output_dir, self.name, self.model, options=self.options,
                       device_map=self.device_map, **kwargs)


@dataclass(frozen=True, kw_only=True)
class HiddenStatesConfig(Settings):
    """Every setting of hidden_states.ipynb: which datasets, how they are assembled, and the extraction."""

    datasets: list[str] = setting(["B1"], "dataset names (their records.jsonl) or records.jsonl paths")
    tokenizer: str | None = shared("tokenizer")
    job: ExtractionJob = nested(ExtractionJob)
    assembly: AssemblyPolicy = nested(AssemblyPolicy)
