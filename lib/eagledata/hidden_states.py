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

from .assemble import Sample, samples_hash
from .errors import InputError
from .files import atomic_write_text

Final = Literal["post_norm", "pre_norm"]
Storage = Literal["bf16", "fp8", "fp32"]
STORAGE_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FORMAT = "eagledata.hidden_states/1"
ERROR_STRIDE = 8  # the storage error is estimated on every 8th token: exact enough, nearly free
MANIFEST, INDEX, PLAN, PARTS = "manifest.json", "index.jsonl", "plan.json", "index.parts"


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


# -- model ----------------------------------------------------------------------------------------
@dataclass
class Decoder:
    """The text decoder inside any supported model: what runs, and where the hooks go."""

    module: nn.Module  # called with (input_ids, attention_mask); returns last_hidden_state after the norm
    layers: nn.ModuleList
    vocab_size: int
    hidden_size: int
    path: str  # where it sits in the full model, e.g. "model.language_model"

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def find_decoder(model: nn.Module) -> Decoder:
    """The module holding `embed_tokens`, `layers` and `norm` (Llama, DeepseekV3, kimi_k25's language_model).

    Found by structure, so a multimodal wrapper needs no special case; the vision tower has no
    token embedding and is skipped.
    """
    candidates = [(name, m) for name, m in model.named_modules()
                  if isinstance(getattr(m, "layers", None), nn.ModuleList)
                  and isinstance(getattr(m, "embed_tokens", None), nn.Embedding) and hasattr(m, "norm")]
    if not candidates:
        raise InputError(f"no text decoder (embed_tokens + layers + norm) in {type(model).__name__}",
                         field="model")
    name, m = min(candidates, key=lambda c: c[0].count("."))
    emb = m.embed_tokens
    return Decoder(m, m.layers, emb.num_embeddings, emb.embedding_dim, name)


def load_model(model: str | Path | nn.Module, *, device: str = "cpu", dtype: torch.dtype | None = None,
               device_map: Any = None, trust_remote_code: bool = False) -> nn.Module:
    """A checkpoint dir or hub id through transformers (causal LM, else image-text-to-text such as kimi_k25).

    bf16 on GPU and fp32 on CPU unless told; `device_map` goes to `from_pretrained` as is, for
    a model that needs several GPUs.
    """
    if isinstance(model, nn.Module):
        return model.eval()
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText

    src = str(model)
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    try:
        config = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a model config: {e}", src, field="model") from None
    kwargs: dict[str, Any] = dict(dtype=dtype, trust_remote_code=trust_remote_code)
    if device_map is not None:
        kwargs["device_map"] = device_map
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText, AutoModel):
        if type(config) in auto._model_mapping or (trust_remote_code and auto.__name__ in
                                                   getattr(config, "auto_map", {})):
            loaded = auto.from_pretrained(src, config=config, **kwargs)
            break
    else:
        raise InputError(f"transformers has no model class for model_type {config.model_type!r}", src, field="model")
    if device_map is None:
        loaded = loaded.to(device)
    return loaded.eval()


def config_vocab_size(model: str | Path, trust_remote_code: bool = False) -> int:
    """The text vocabulary from the checkpoint's config alone (a wrapper's `text_config` when present)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a model config: {e}", str(model), field="model") from None
    return int((getattr(config, "text_config", None) or config).vocab_size)


def model_name(model: str | Path | nn.Module) -> str:
    if isinstance(model, nn.Module):
        return getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
    return str(model)


TINY_FAMILIES = ("llama", "deepseek_v3", "kimi_k25")


def tiny_config(family: str, *, hidden_size: int = 64, num_layers: int = 6, vocab_size: int = 163_840) -> Any:
    """A small random-weight config of a supported family, sized for Kimi ids (tests, demo, bench)."""
    from transformers import DeepseekV3Config, LlamaConfig
    from transformers.models.kimi_k25 import Kimi_K25Config

    heads = max(2, hidden_size // 32)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=heads, max_position_embeddings=8192)
    if family == "llama":
        return LlamaConfig(num_key_value_heads=max(1, heads // 2), **common)
    deepseek = dict(common, num_key_value_heads=heads, moe_intermediate_size=hidden_size // 2, n_routed_experts=8,
                    num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
                    q_lora_rank=hidden_size // 2, kv_lora_rank=hidden_size // 4, qk_rope_head_dim=8,
                    qk_nope_head_dim=8, v_head_dim=hidden_size // heads)
    if family == "deepseek_v3":
        return DeepseekV3Config(**deepseek)
    if family == "kimi_k25":
        return Kimi_K25Config(text_config=dict(model_type="deepseek_v3", **deepseek),
                              vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64), projection_hidden_size=32)
    raise InputError(f"unknown family {family!r}; one of {TINY_FAMILIES}", field="family")


def build_tiny_model(family: str, directory: str | Path | None = None, *, seed: int = 0, **config: Any) -> nn.Module:
    """A random model of `family`; saved to `directory` (a checkpoint `load_model` reads) when given."""
    from transformers import AutoModelForCausalLM
    from transformers.models.kimi_k25 import Kimi_K25ForConditionalGeneration

    cfg = tiny_config(family, **config)
    torch.manual_seed(seed)
    model = Kimi_K25ForConditionalGeneration(cfg) if family == "kimi_k25" else AutoModelForCausalLM.from_config(cfg)
    model.eval()
    if directory is not None:
        model.save_pretrained(str(directory))
    return model


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
@dataclass
class ExtractOptions:
    layers: Sequence[int] | None = None  # None: the EAGLE-3 rule
    final: Final = "post_norm"
    storage: Storage = "bf16"
    max_tokens_per_batch: int = 16_384  # padded tokens (rows × longest) per forward
    max_batch_size: int | None = None
    shard_bytes: int = 1 << 30  # a shard is written once its hidden states reach this size


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


def read_parts(directory: Path) -> dict[str, IndexEntry]:
    """Every stored sample from all index parts (any rank, any world size); a torn last line is a kill."""
    done: dict[str, IndexEntry] = {}
    parts = directory / PARTS
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
@dataclass
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


def _dist() -> tuple[int, int]:
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


def _check_plan(directory: Path, plan: dict[str, Any]) -> None:
    """A resume must take the same states in the same format; anything else is another data set."""
    path = directory / PLAN
    if path.is_file():
        old = json.loads(path.read_text())
        keys = ("layers", "final", "storage", "hidden_size", "num_layers", "vocab_size")
        diff = [k for k in keys if old.get(k) != plan[k]]
        if diff:
            raise InputError(f"{directory} holds states made with other settings ({', '.join(diff)}: "
                             f"{[old.get(k) for k in diff]} vs {[plan[k] for k in diff]}); use another name",
                             path)
    else:
        atomic_write_text(path, json.dumps(plan, indent=1))


def extract(samples: Sequence[Sample], output_dir: str | Path, name: str, model: str | Path | nn.Module, *,
            options: ExtractOptions = ExtractOptions(), device: str = "cpu", dtype: torch.dtype | None = None,
            device_map: Any = None, rank: int | None = None, world_size: int | None = None,
            tokenizer_fingerprint: str = "", records_hashes: dict[str, str] | None = None,
            progress: bool = True, on_batch: Callable[[int], None] | None = None) -> ExtractResult:
    """Hidden states of `samples` into `<output_dir>/hidden_states/<name>/`, resuming what is stored.

    `rank`/`world_size` default to torchrun's RANK/WORLD_SIZE. Each rank takes the samples whose
    id hashes to it; the manifest and `index.jsonl` are written by whichever call finds the set
    complete. `on_batch(n)` runs after each batch (progress reporting; tests inject a kill here).
    """
    env_rank, env_world = _dist()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} outside world size {world_size}", field="rank")
    directory = Path(output_dir) / "hidden_states" / name
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
    (directory / PARTS).mkdir(exist_ok=True)
    _check_plan(directory, plan)

    done = read_parts(directory)
    for s in samples:
        if s.id in done and done[s.id].digest != s.digest():
            raise InputError(f"{directory} holds states of sample {s.id!r} over other ids; use another name",
                             directory / PARTS, field="id")
    mine = [s for s in samples if owner(s.id, world_size) == rank and s.id not in done]
    skipped = sum(1 for s in samples if owner(s.id, world_size) == rank) - len(mine)
    part = directory / PARTS / f"r{rank}-of-{world_size}-{uuid.uuid4().hex[:8]}.jsonl"
    writer = _ShardWriter(directory, part, options.storage, options.shard_bytes, decoder.hidden_size)
    batches = plan_batches([len(s) for s in mine], options.max_tokens_per_batch, options.max_batch_size)
    total = sum(len(s) for s in mine)
    start = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="tok", desc=f"rank {rank}/{world_size}")
    try:
        with torch.inference_mode(), Capture(decoder, layers, options.final) as capture:
            for n, batch in enumerate(batches, 1):
                group = [mine[i] for i in batch]
                ids, mask = _pad([s.input_ids for s in group], in_device)
                states = capture.run(ids, mask, compute_dtype)
                writer.add(group, states)
                if bar is not None:
                    bar.update(states.shape[0])
                if on_batch is not None:
                    on_batch(n)
            writer.flush()
    finally:
        writer.close()
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - start
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    manifest = None
    if rank == 0 or world_size == 1 or not torch.distributed.is_initialized():
        manifest = finalize(directory, samples, tokenizer_fingerprint=tokenizer_fingerprint,
                            records_hashes=records_hashes)
    return ExtractResult(directory, rank, world_size, len(mine), skipped, total, seconds, manifest is not None,
                         manifest)


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


def finalize(directory: str | Path, samples: Sequence[Sample], *, tokenizer_fingerprint: str = "",
             records_hashes: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Once every sample is stored: `index.jsonl` in sample order, `manifest.json`, stray files removed.

    Returns None (and writes nothing) while samples are missing. Deterministic, so ranks that race
    here write the same bytes.
    """
    from safetensors import safe_open

    directory = Path(directory)
    done = read_parts(directory)
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
    plan = json.loads((directory / PLAN).read_text())
    tokens = sum(e.length for e in entries)
    shard_bytes = sum((directory / s).stat().st_size for s in shards)
    manifest = {**plan, "shards": shards, "num_samples": len(entries), "num_tokens": tokens,
                "num_loss_tokens": sum(sum(s.loss_mask) for s in samples),
                "bytes": shard_bytes, "bytes_per_token": shard_bytes / tokens if tokens else 0.0,
                "reconstruction_rel_rmse": (sq_err / sq_ref) ** 0.5 if sq_ref else 0.0,  # sampled, see ERROR_STRIDE
                "tokenizer_fingerprint": tokenizer_fingerprint, "records_hashes": records_hashes or {},
                "samples_hash": samples_hash(samples)}
    atomic_write_text(directory / INDEX, "".join(e.line(with_digest=False) for e in entries))
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1))
    return manifest



# -- command line (torchrun) ----------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """`torchrun --nproc-per-node N -m eagledata.hidden_states --samples speculators.jsonl …`: data parallel,
    one model copy per GPU (or `--device-map auto` in a single process for a model that needs several)."""
    import argparse

    from .assemble import read_samples

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--samples", required=True, help="speculators export: {id, input_ids, loss_mask} per line")
    ap.add_argument("--output-dir", default="outputs")
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", required=True, help="checkpoint directory or hub id")
    ap.add_argument("--layers", type=int, nargs=3, default=None)
    ap.add_argument("--final", choices=["post_norm", "pre_norm"], default="post_norm")
    ap.add_argument("--storage", choices=list(STORAGE_DTYPES), default="bf16")
    ap.add_argument("--max-tokens-per-batch", type=int, default=ExtractOptions.max_tokens_per_batch)
    ap.add_argument("--max-batch-size", type=int, default=None)
    ap.add_argument("--shard-bytes", type=int, default=ExtractOptions.shard_bytes)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--device-map", default=None)
    args = ap.parse_args(argv)
    rank, world_size = _dist()
    device = args.device
    if world_size > 1:
        cuda = device.startswith("cuda")
        if cuda:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    options = ExtractOptions(layers=args.layers, final=args.final, storage=args.storage,
                             max_tokens_per_batch=args.max_tokens_per_batch, max_batch_size=args.max_batch_size,
                             shard_bytes=args.shard_bytes)
    try:
        result = extract(read_samples(args.samples), args.output_dir, args.name, args.model, options=options,
                         device=device, device_map=args.device_map, progress=rank == 0)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    print(json.dumps({"rank": rank, "world_size": world_size, "extracted": result.extracted,
                      "skipped": result.skipped, "tokens": result.tokens, "seconds": round(result.seconds, 3),
                      "complete": result.complete}), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
