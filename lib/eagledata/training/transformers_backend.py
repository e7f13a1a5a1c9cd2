"""The transformers backend: the verifier model loaded here, its states captured by hooks, yielded batch by batch.

Only the decoder stack runs (never the LM head: B×T×V logits would dwarf everything). Forward hooks take the
three aux states as they ENTER their layers (HF `hidden_states[i]`), and the final state from the decoder's
own output (post-norm) or the last layer's output (pre-norm), keeping real tokens only. Before a byte of
weights loads, the checkpoint's config is checked (quantization format, tp against the heads) and its memory
plan must fit. Where the states go, resume and the manifest are the job's (`job.run_extraction`); this module
only yields (samples, states).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn

from ..errors import InputError
from .assembly import Sample
from .memory import (
    KIMI_K25_CHECKPOINT_BYTES,
    KIMI_K25_HUB_ID,
    Devices,
    MemoryPlan,
    ModelShape,
    Parallelism,
    check_parallelism,
    checkpoint_bytes,
    model_config,
    plan_memory,
    visible_devices,
)
from .models import Decoder, config_vocab_size, find_decoder, load_model, model_name
from .scoring import DEFAULT_CHUNK_TOKENS, output_head, scored_tokens, token_logprobs
from .source import StatesBatch, VerifierInfo
from .storage import FinalState

ModelLoader = Callable[..., nn.Module]  # `load_model`'s signature: (model, *, device, dtype, device_map, …)


# -- planning (pure) ------------------------------------------------------------------------------
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
    final: FinalState
    keep: torch.Tensor | None = None  # [B, T] bool: real tokens
    out: torch.Tensor | None = None  # [N, 4, H]
    handles: list[Any] = field(default_factory=list)

    def __enter__(self) -> Capture:
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
        assert self.out is not None, "only while run() runs the decoder"
        self.out[:, slot] = h[self.keep] if self.keep is not None else h.reshape(-1, h.shape[-1])

    def _pre_hook(self, slot: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._store(slot, args[0] if args else kwargs["hidden_states"])
        return hook

    def _post_hook(self, slot: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._store(slot, output[0] if isinstance(output, (tuple, list)) else output)
        return hook

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, dtype: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, 4, H] states of the real tokens, in row-major (sample, position) order, and the decoder's output
        [B, T, H] (post-norm, padding included) for the audit's LM head."""
        self.keep = attention_mask.bool() if attention_mask is not None else None
        n = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
        self.out = torch.empty(n, 4, self.decoder.hidden_size, dtype=dtype, device=input_ids.device)
        last = self.decoder.module(input_ids=input_ids, attention_mask=attention_mask,
                                   use_cache=False).last_hidden_state
        if self.final == "post_norm":
            self._store(3, last)
        out, self.out, self.keep = self.out, None, None
        return out, last


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


# -- before loading -------------------------------------------------------------------------------
def memory_plan(model: str | Path, *, tp: int = 1, dp: int = 1, device_map: Any = None,
                devices: Devices | None = None, max_tokens_per_batch: int = 16_384,
                device: str | None = None) -> MemoryPlan | None:
    """The checkpoint's memory plan for this split (None when its size on disk is unknown, e.g. a hub id)."""
    size = checkpoint_bytes(str(model))
    if size is None and str(model) == KIMI_K25_HUB_ID:  # the published facts: no download needed
        size = KIMI_K25_CHECKPOINT_BYTES
    elif size is None:
        return None
    devices = devices or visible_devices()
    compute_bytes = 4 if devices.kind == "cpu" or str(device or "").startswith("cpu") else 2
    return plan_memory(model_config(str(model)), size, devices,
                       Parallelism(tp=tp, dp=dp, device_map=device_map if device_map else None),
                       max_tokens_per_batch=max_tokens_per_batch, compute_bytes=compute_bytes)


def check_before_loading(model: str | Path, *, tp: int = 1, dp: int = 1, device_map: Any = None,
                         devices: Devices | None = None, max_tokens_per_batch: int = 16_384,
                         device: str | None = None) -> MemoryPlan | None:
    """Config-level refusals before a byte of weights loads: quantization format, tp vs heads, memory."""
    shape = ModelShape.from_config(model_config(str(model)))  # raises on an unsupported quantization_config
    check_parallelism(shape, Parallelism(tp=tp, dp=dp, device_map=device_map if isinstance(device_map, str) else None),
                      devices or visible_devices())
    if tp > 1 and shape.quantization is not None:
        # transformers 5.23 shards the checkpoint's per-expert tensors before dequantizing them, and
        # weight_packed/weight_shape cannot be sliced that way (IndexError in sharding_utils.shard_tensor)
        raise InputError(f"tp={tp} with a compressed-tensors checkpoint: transformers cannot shard packed "
                         "experts; use device_map=auto (one process, all GPUs) or the vLLM backend "
                         "(lib/eagledata/training/README.md, 'vLLM backend')", field="tp")
    if device_map is not None and not isinstance(device_map, str):
        return None  # an explicit placement: the caller planned it
    plan = memory_plan(model, tp=tp, dp=dp, device_map=device_map, devices=devices,
                       max_tokens_per_batch=max_tokens_per_batch, device=device)
    if plan is not None:
        plan.check()
    return plan


def local_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this process holds (a DTensor counts its local shard)."""
    total = 0
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total


# -- the source ---------------------------------------------------------------------------------------
@dataclass
class TransformersSource:
    """States computed here by a model that `load_fn` loads (`load_model`; tests inject one that refuses).

    `model` is a checkpoint directory, a hub id or a loaded module. `tp`/`dp`: this process's share of the
    world, for the memory plan and transformers' tensor-parallel loading."""

    model: str | Path | nn.Module
    device: str = "cpu"
    dtype: torch.dtype | None = None
    device_map: Any = None
    max_memory: dict | None = None
    tp: int = 1
    dp: int = 1
    devices: Devices | None = None
    max_tokens_per_batch: int = 16_384
    max_batch_size: int | None = None
    score_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    load_fn: ModelLoader = load_model
    backend: ClassVar[str] = "transformers"
    decoder: Decoder | None = field(default=None, init=False)  # set by open()
    capture: Capture | None = field(default=None, init=False)  # set by prepare()
    head: nn.Module | None = field(default=None, init=False)  # the LM head, when scoring (set by prepare())
    loaded: nn.Module | None = field(default=None, init=False)
    weight_bytes: int = field(default=0, init=False)

    def vocab_size(self) -> int:
        """The vocabulary samples are checked against, from the config alone (or the module)."""
        if isinstance(self.model, nn.Module):
            return find_decoder(self.model).vocab_size
        return config_vocab_size(self.model)

    def open(self) -> VerifierInfo:
        """Refuse what cannot work from the config (minutes of loading for Kimi come after), then load."""
        if isinstance(self.model, nn.Module):
            if self.tp > 1:
                raise InputError("tp > 1 needs a checkpoint (transformers shards it while loading), not a loaded "
                                 "module", field="tp")
        else:
            check_before_loading(self.model, tp=self.tp, dp=self.dp, device_map=self.device_map, devices=self.devices,
                                 max_tokens_per_batch=self.max_tokens_per_batch, device=self.device)
        loaded = self.load_fn(self.model, device=self.device, dtype=self.dtype, device_map=self.device_map,
                              max_memory=self.max_memory, tp=self.tp, dp=self.dp)
        self.loaded = loaded
        self.decoder = decoder = find_decoder(loaded)
        self.weight_bytes = local_bytes(loaded)
        return VerifierInfo(model=model_name(self.model), decoder=decoder.path, num_layers=decoder.num_layers,
                      hidden_size=decoder.hidden_size, vocab_size=decoder.vocab_size,
                      compute_dtype=next(decoder.module.parameters()).dtype)

    def prepare(self, layers: tuple[int, int, int], final: FinalState, score: bool = False) -> None:
        """Where the hooks go: any three layers and either final state are fine here. Scoring needs the
        model's LM head (a decoder alone is refused)."""
        assert self.decoder is not None and self.loaded is not None, "open() first"
        self.capture = Capture(self.decoder, layers, final)
        self.head = output_head(self.loaded) if score else None

    def batches(self, todo: Sequence[Sample]) -> Generator[StatesBatch, None, None]:
        """Token-budget batches of `todo`, longest first, each with its [N, 4, H] states and, when scoring, the
        scored tokens' log-probabilities: the LM head over the decoder's own (post-norm) output, in chunks."""
        assert self.capture is not None, "prepare() first"
        decoder = self.capture.decoder
        compute_dtype = next(decoder.module.parameters()).dtype
        in_device = cast(nn.Embedding, decoder.module.embed_tokens).weight.device  # find_decoder checked it
        with torch.inference_mode(), self.capture as capture:
            for batch in plan_batches([len(s) for s in todo], self.max_tokens_per_batch, self.max_batch_size):
                group = [todo[i] for i in batch]
                ids, mask = _pad([s.input_ids for s in group], in_device)
                states, last = capture.run(ids, mask, compute_dtype)
                logprobs, scoring_s = None, None
                if self.head is not None:
                    t0 = time.perf_counter()
                    where, tokens, counts = scored_tokens(group)
                    scored = token_logprobs(last, where, tokens, self.head, self.score_chunk_tokens).cpu()
                    logprobs, scoring_s = list(scored.split(counts)), time.perf_counter() - t0
                del last
                yield StatesBatch(group, states, logprobs, scoring_s)

    def manifest_extra(self) -> dict[str, Any]:
        return {}
