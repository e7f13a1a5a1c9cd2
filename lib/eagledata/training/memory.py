"""A memory plan before any weight loads: will this checkpoint, split this way, fit these devices?

Pure: from config.json (a dict), the checkpoint's size on disk and the devices (count × bytes each,
injectable), it predicts per-device weight and activation memory for a `Parallelism` (tp × dp, or one process
over all devices with device_map) and a token budget, and refuses with a split that would fit.
Estimates, not measurements: weights are exact to the parameter count (replicated norms and routers
ignored); activations are an upper bound of the largest live set in one decoder layer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InputError
from .quantized import Quantization, check_quantization

GB = 1e9
HEADROOM = 0.90  # of each device's memory: CUDA context, allocator fragmentation, the capture buffers' churn


@dataclass(frozen=True)
class Devices:
    count: int
    bytes_each: int
    kind: str = "cuda"

    def __str__(self) -> str:
        return f"{self.count}×{_size(self.bytes_each)} {self.kind}"


def visible_devices() -> Devices:
    """The GPUs this process sees (CPU: one device with the machine's memory)."""
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return Devices(n, min(torch.cuda.get_device_properties(i).total_memory for i in range(n)), "cuda")
    return Devices(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "cpu")


def memory_in_use() -> list[tuple[str, int, int]]:
    """(device, bytes in use, bytes in all) per device, as a run watches it: each GPU's whole use (this process
    and any other on it, e.g. a vLLM server's), else this process's resident memory against the machine's."""
    import torch

    if torch.cuda.is_available():
        out = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            out.append((f"cuda:{i}", total - free, total))
        return out
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return [("cpu", resident, visible_devices().bytes_each)]


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs from config.json (a multimodal wrapper's text_config when present)."""

    hidden_size: int
    num_layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    intermediate_size: int
    routed_expert_weights: int  # elements of all routed experts (0 for a dense model)
    experts_per_token: int
    moe_intermediate_size: int
    shared_experts: int
    qk_head_dim: int
    v_head_dim: int
    quantization: Quantization | None
    stored_bytes: int = 2  # bytes per unquantized weight in the checkpoint (config dtype)
    mlp_weights: int = 0  # dense MLPs and shared experts (what a MoE's tensor-parallel plan shards besides the experts)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        text = config.get("text_config") or config
        h, n = int(text["hidden_size"]), int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        experts = int(text.get("n_routed_experts") or text.get("num_local_experts") or 0)
        moe_inter = int(text.get("moe_intermediate_size") or 0)
        dense = min(int(text.get("first_k_dense_replace", 0)), n) if experts else n
        head_dim = h // heads
        qk = int(text.get("qk_nope_head_dim", 0)) + int(text.get("qk_rope_head_dim", 0)) or head_dim
        return cls(hidden_size=h, num_layers=n, heads=heads, kv_heads=int(text.get("num_key_value_heads") or heads),
                   vocab_size=int(text["vocab_size"]), intermediate_size=int(text.get("intermediate_size") or 4 * h),
                   routed_expert_weights=(n - dense) * experts * 3 * h * moe_inter,
                   experts_per_token=int(text.get("num_experts_per_tok") or 0), moe_intermediate_size=moe_inter,
                   shared_experts=int(text.get("n_shared_experts") or 0), qk_head_dim=qk,
                   v_head_dim=int(text.get("v_head_dim") or head_dim), quantization=check_quantization(config),
                   mlp_weights=3 * h * (dense * int(text.get("intermediate_size") or 4 * h)
                                        + (n - dense) * int(text.get("n_shared_experts") or 0) * moe_inter),
                   stored_bytes=4 if (config.get("dtype") or config.get("torch_dtype")) == "float32" else 2)


@dataclass(frozen=True)
class Parallelism:
    """How the world is split: dp groups × tp ranks each, or one process over all devices (device_map)."""

    tp: int = 1
    dp: int = 1
    device_map: str | None = None

    def __str__(self) -> str:
        return f"device_map={self.device_map}" if self.device_map else f"tp={self.tp} × dp={self.dp}"


@dataclass(frozen=True)
class MemoryPlan:
    parallelism: Parallelism
    devices: Devices
    backend: str
    max_tokens_per_batch: int
    expert_storage: str
    weights_total: int  # bytes of weights in memory, all devices together
    weights_per_device: int
    activations_per_device: int
    budget_per_device: int  # HEADROOM × device memory
    reason: str | None  # why it does not fit (None: it fits)
    suggestion: str | None = None
    suggested: Parallelism | None = None  # the split the suggestion names (None: none of these devices fits)
    suggested_tokens: int | None = None  # its max_tokens_per_batch

    @property
    def fits(self) -> bool:
        return self.reason is None

    @property
    def per_device(self) -> int:
        return self.weights_per_device + self.activations_per_device

    def rows(self) -> list[dict[str, Any]]:
        """The plan as a table (hidden_states.ipynb shows it before loading)."""
        return [
            {"item": "devices", "value": str(self.devices)},
            {"item": "parallelism", "value": str(self.parallelism)},
            {"item": "backend", "value": self.backend},
            {"item": "routed experts in memory", "value": self.expert_storage},
            {"item": "weights, all devices", "value": _size(self.weights_total)},
            {"item": "weights per device", "value": _size(self.weights_per_device)},
            {"item": f"activations per device ({self.max_tokens_per_batch:,} tokens)",
             "value": _size(self.activations_per_device)},
            {"item": "per device / usable", "value": f"{_size(self.per_device)} / {_size(self.budget_per_device)}"},
            {"item": "verdict", "value": "fits" if self.fits else f"does not fit: {self.reason}"},
            *([{"item": "suggestion", "value": self.suggestion}] if self.suggestion else []),
        ]

    def check(self) -> None:
        """Refuse a split that cannot fit, before any weight loads (the error names the field `layout`, as the
        README documents)."""
        if not self.fits:
            raise InputError(f"{self.reason}. {self.suggestion or 'No layout of these devices fits.'}",
                             field="layout")


BACKENDS = ("transformers", "vllm")


def _size(n: float) -> str:
    return f"{n / GB:,.1f} GB" if n >= GB else f"{n / 1e6:,.1f} MB"


def check_parallelism(shape: ModelShape, split: Parallelism, devices: Devices) -> None:
    """A split the model and the devices allow: tp divides the heads, the world fits the devices."""
    if split.tp < 1 or split.dp < 1:
        raise InputError(f"tp and dp must be ≥ 1, got {split}", field="tp")
    if shape.heads % split.tp or shape.kv_heads % split.tp:
        choices = [t for t in range(1, shape.heads + 1) if shape.heads % t == 0 and shape.kv_heads % t == 0]
        raise InputError(f"tp={split.tp} does not divide the model's {shape.heads} attention heads "
                         f"({shape.kv_heads} key/value heads); choose one of {choices}", field="tp")
    if split.device_map and (split.tp > 1 or split.dp > 1):
        raise InputError(f"device_map={split.device_map} runs one process over all devices: tp and dp must be 1",
                         field="device_map")
    if not split.device_map and split.tp * split.dp > devices.count and devices.kind != "cpu":
        raise InputError(f"{split} needs {split.tp * split.dp} devices, {devices.count} visible", field="tp")


def weight_bytes(shape: ModelShape, checkpoint_bytes: int, backend: str, compute_bytes: int = 2) -> tuple[int, str]:
    """Bytes of weights in memory, and how the routed experts are held."""
    q = shape.quantization
    if q is None:
        return checkpoint_bytes * compute_bytes // shape.stored_bytes, "as stored (no quantization)"
    packed = int(shape.routed_expert_weights * q.bytes_per_weight)
    others = max(checkpoint_bytes - packed, 0) * compute_bytes // shape.stored_bytes
    if backend == "vllm":
        return packed + others, f"INT{q.num_bits} packed ({q.bytes_per_weight:.4f} B/weight, vLLM kernels)"
    return shape.routed_expert_weights * compute_bytes + others, \
        f"dequantized to {8 * compute_bytes}-bit at load (transformers): {compute_bytes / q.bytes_per_weight:.1f}× disk"


def activation_bytes(shape: ModelShape, tokens: int, tp: int, compute_bytes: int = 2) -> int:
    """Largest live set of one forward over `tokens` padded tokens (one row of that length, the worst case).

    Residual stream and norms (~6·H), this rank's attention projections, the attention scores of one
    row if materialized (heads/tp × T² in fp32), the MLP or routed-expert intermediates, the captured
    [T, 4, H] buffer. No LM head: extraction never computes logits.
    """
    h, heads = shape.hidden_size, shape.heads // tp
    residual = 6 * h
    attention = heads * (2 * shape.qk_head_dim + 2 * shape.v_head_dim)
    if shape.routed_expert_weights:
        mlp = 3 * shape.moe_intermediate_size * (shape.experts_per_token + shape.shared_experts) // tp
        mlp = max(mlp, 3 * shape.intermediate_size // tp)
    else:
        mlp = 3 * shape.intermediate_size // tp
    per_token = (residual + attention + mlp + 4 * h) * compute_bytes
    scores = heads * tokens * tokens * 4
    return tokens * per_token + scores


def plan_memory(config: dict[str, Any], checkpoint_bytes: int, devices: Devices,
                split: Parallelism = Parallelism(), *, max_tokens_per_batch: int = 16_384,
                backend: str = "transformers", compute_bytes: int = 2, suggest: bool = True) -> MemoryPlan:
    """Per-device weights + activations for `split`; when it does not fit, a split that would (or why none does)."""
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r}; one of {BACKENDS}", field="backend")
    shape = ModelShape.from_config(config)
    check_parallelism(shape, split, devices)
    total, storage = weight_bytes(shape, checkpoint_bytes, backend, compute_bytes)
    if split.device_map:
        # accelerate places whole layers: the fullest device can hold up to one more layer than its share
        per_device = total // devices.count + total // max(shape.num_layers, 1)
        acts = activation_bytes(shape, max_tokens_per_batch, 1, compute_bytes)
    elif backend == "transformers" and shape.routed_expert_weights:
        # transformers' DeepseekV3 plan shards the experts and MLPs only: MLA attention, embeddings, norms and
        # lm_head stay whole on every rank
        mlps = (shape.routed_expert_weights + shape.mlp_weights) * compute_bytes
        per_device = (total - mlps) + mlps // split.tp
        acts = activation_bytes(shape, max_tokens_per_batch, split.tp, compute_bytes)
    else:
        per_device = total // split.tp
        acts = activation_bytes(shape, max_tokens_per_batch, split.tp, compute_bytes)
    budget = int(devices.bytes_each * HEADROOM)
    reason = None
    if per_device + acts > budget:
        reason = (f"{split} needs {_size(per_device + acts)} per device "
                  f"({_size(per_device)} weights + {_size(acts)} activations), "
                  f"{_size(budget)} usable of {devices}")
    plan = MemoryPlan(parallelism=split, devices=devices, backend=backend, max_tokens_per_batch=max_tokens_per_batch,
                      expert_storage=storage, weights_total=total, weights_per_device=per_device,
                      activations_per_device=acts, budget_per_device=budget, reason=reason)
    if reason and suggest:
        text, suggested, tokens = suggest_parallelism(config, checkpoint_bytes, devices,
                                                      max_tokens_per_batch=max_tokens_per_batch, backend=backend,
                                                      compute_bytes=compute_bytes)
        plan = replace(plan, suggestion=text, suggested=suggested, suggested_tokens=tokens)
    return plan


def suggest_parallelism(config: dict[str, Any], checkpoint_bytes: int, devices: Devices, *, max_tokens_per_batch: int,
                   backend: str = "transformers", compute_bytes: int = 2) -> tuple[str, Parallelism | None, int | None]:
    """The split with the most data parallelism that fits (smaller token budgets next), else what would be needed.

    Returns (the sentence for the error, that split, its token budget)."""
    shape = ModelShape.from_config(config)
    budgets = [t for t in (max_tokens_per_batch, 8192, 4096, 2048) if t <= max_tokens_per_batch]
    tps = [t for t in range(1, devices.count + 1) if shape.heads % t == 0 and shape.kv_heads % t == 0]
    for tokens in budgets:
        candidates = [Parallelism(tp=t, dp=devices.count // t) for t in tps] + [Parallelism(device_map="auto")]
        for split in candidates:
            p = plan_memory(config, checkpoint_bytes, devices, split, max_tokens_per_batch=tokens, backend=backend,
                            compute_bytes=compute_bytes, suggest=False)
            if p.fits:
                budget = "" if tokens == max_tokens_per_batch else f" with max_tokens_per_batch={tokens}"
                return f"{split}{budget} fits ({_size(p.per_device)} per device)", split, tokens
    total, _ = weight_bytes(shape, checkpoint_bytes, backend, compute_bytes)
    usable = devices.bytes_each * HEADROOM
    need = -(-int(total + activation_bytes(shape, min(budgets), 1, compute_bytes) * devices.count) // int(usable))
    text = (f"no layout fits: the {backend} path holds {total / GB:,.0f} GB of weights, "
            f"at least {need} devices of {devices.bytes_each / GB:.0f} GB")
    if backend == "transformers" and shape.quantization is not None:
        alt = plan_memory(config, checkpoint_bytes, devices, Parallelism(tp=max(tps), dp=devices.count // max(tps)),
                          max_tokens_per_batch=min(budgets), backend="vllm", compute_bytes=compute_bytes,
                          suggest=False)
        text += (f"; the vLLM backend keeps INT{shape.quantization.num_bits} packed: tp={max(tps)} needs "
                 f"{alt.per_device / GB:,.1f} GB per device ({'fits' if alt.fits else 'does not fit'}; "
                 f"docs: lib/eagledata/training/README.md, 'vLLM backend')")
    return text, None, None


def checkpoint_bytes(model: str) -> int | None:
    """Bytes of the checkpoint's weights: the safetensors index's total_size, else the files' sizes (local only)."""
    import json
    from pathlib import Path

    d = Path(model)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if total:
            return int(total)
    files = list(d.glob("*.safetensors")) if d.is_dir() else []
    return sum(f.stat().st_size for f in files) or None


def model_config(model: str) -> dict[str, Any]:
    """config.json of the checkpoint (K2.5's published values for its hub id: nothing to download)."""
    from pathlib import Path

    from .quantized import read_config

    if str(model) == KIMI_K25_HUB_ID and not Path(str(model), "config.json").is_file():
        return kimi_k25_config()
    return read_config(model)


# -- Kimi-K2.5 as published (the hub's moonshotai/Kimi-K2.5 config.json: the Kimi K2 text model, compressed-tensors
# INT4 experts; about 595 GB of safetensors): plans without downloading anything --
def kimi_k25_config() -> dict[str, Any]:
    """K2.5's config.json, the fields a plan reads: Kimi K2 text model values, K2.5's quantization_config."""
    from .quantized import KIMI_K25_QUANTIZATION_CONFIG

    return {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "quantization_config": KIMI_K25_QUANTIZATION_CONFIG,
        "text_config": {
            "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 1,
            "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 384,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048,
            "intermediate_size": 18432, "vocab_size": 163840,
        },
    }


KIMI_K25_CHECKPOINT_BYTES = 595 * 10**9  # "about 595 GB on disk"
KIMI_K25_HUB_ID = "moonshotai/Kimi-K2.5"


def kimi_k25_plans(devices: Devices = Devices(8, 96 * 10**9), max_tokens_per_batch: int = 16_384
                   ) -> dict[str, MemoryPlan]:
    """K2.5 INT4 on 8×96 GB (the seed's machine): the transformers path (tp=8, device_map) and the vLLM backend."""
    config = kimi_k25_config()
    plans = {f"transformers {split}": plan_memory(config, KIMI_K25_CHECKPOINT_BYTES, devices, split,
                                                   max_tokens_per_batch=max_tokens_per_batch)
             for split in (Parallelism(tp=devices.count), Parallelism(device_map="auto"))}
    plans[f"vllm tp={devices.count}"] = plan_memory(config, KIMI_K25_CHECKPOINT_BYTES, devices,
                                                    Parallelism(tp=devices.count), backend="vllm",
                                                    max_tokens_per_batch=max_tokens_per_batch)
    return plans


def plans_table(plans: dict[str, MemoryPlan]) -> dict[str, dict[str, Any]]:
    """{plan name: {item: value}}: one column per plan (pandas.DataFrame(plans_table(...)))."""
    return {name: {row["item"].split(" (")[0]: row["value"] for row in plan.rows()} for name, plan in plans.items()}
