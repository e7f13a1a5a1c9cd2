"""Quantized checkpoints: which formats the extraction path accepts (the tiny INT4 test checkpoint is `tiny.py`'s).

Kimi-K2.5 ships its routed experts as compressed-tensors INT4 (`pack-quantized`, symmetric, group 32);
attention, shared experts, the dense MLP, lm_head and the vision tower stay bf16. transformers loads such
experts by DEQUANTIZING them into its fused `DeepseekV3Experts` parameters, so in memory they cost the
compute dtype per weight, not half a byte: `expert_storage` says so, and the memory plan counts it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import InputError

# Kimi-K2.5's `quantization_config`, as its config.json on the hub (moonshotai/Kimi-K2.5) declares it.
KIMI_K25_QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "kv_cache_scheme": None,
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                        "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
                        "observer_kwargs": {}},
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"],
}

@dataclass(frozen=True)
class Quantization:
    """What a checkpoint's `quantization_config` asks for, once accepted."""

    method: str
    format: str
    num_bits: int
    group_size: int
    symmetric: bool
    ignore: tuple[str, ...]

    @property
    def bytes_per_weight(self) -> float:
        """Packed bytes per quantized weight on disk: the bits plus one bf16 scale per group."""
        return self.num_bits / 8 + 2 / self.group_size

    # transformers 5.23 dequantizes compressed-tensors weights into its dense/fused modules at load time
    # (CompressedTensorsDequantize): the extraction path never keeps INT4 packed in memory.
    expert_storage: str = "dequantized to the compute dtype at load (transformers)"


SUPPORTED = "no quantization_config, or compressed-tensors pack-quantized INT weights (symmetric, group strategy, " \
            "no activation quantization) as Kimi-K2.5 ships"


def check_quantization(config: dict[str, Any]) -> Quantization | None:
    """The checkpoint's quantization as this path supports it, else an InputError naming the field.

    Read from config.json before any weight loads: an unsupported format must fail in seconds, not
    after minutes of loading (or, worse, load silently as something else).
    """
    q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not q:
        return None
    method, fmt = q.get("quant_method"), q.get("format")
    if method != "compressed-tensors":
        raise InputError(f"quant_method {method!r} is not supported; supported: {SUPPORTED}",
                         field="quantization_config.quant_method")
    if fmt != "pack-quantized":
        raise InputError(f"compressed-tensors format {fmt!r} is not supported; supported: {SUPPORTED}",
                         field="quantization_config.format")
    groups = q.get("config_groups") or {}
    if not groups:
        raise InputError("compressed-tensors config without config_groups", field="quantization_config.config_groups")
    schemes = []
    for name, group in groups.items():
        w = group.get("weights") or {}
        field = f"quantization_config.config_groups.{name}"
        if group.get("input_activations") or group.get("output_activations"):
            raise InputError(f"activation quantization is not supported; supported: {SUPPORTED}", field=field)
        if w.get("type") != "int" or not 1 <= int(w.get("num_bits", 0)) <= 8:
            raise InputError(f"weights {w.get('type')!r} {w.get('num_bits')}-bit are not supported; "
                             f"supported: {SUPPORTED}", field=f"{field}.weights")
        if w.get("strategy") != "group" or not w.get("symmetric", False) or w.get("dynamic"):
            raise InputError(f"weights strategy {w.get('strategy')!r}, symmetric={w.get('symmetric')}, "
                             f"dynamic={w.get('dynamic')} are not supported; supported: {SUPPORTED}",
                             field=f"{field}.weights")
        schemes.append((int(w["num_bits"]), int(w["group_size"])))
    if len(set(schemes)) != 1:
        raise InputError(f"config groups with different schemes {schemes} are not supported",
                         field="quantization_config.config_groups")
    bits, group = schemes[0]
    return Quantization(method=method, format=fmt, num_bits=bits, group_size=group, symmetric=True,
                        ignore=tuple(q.get("ignore") or ()))


def read_config(model: str | Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """config.json as a dict: read directly from a local directory, else through transformers (hub cache)."""
    path = Path(str(model)) / "config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"config.json is not valid JSON: {e}", str(path), field="model") from None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model), trust_remote_code=trust_remote_code).to_dict()
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a model config: {e}", str(model), field="model") from None


def routed_expert_bytes(model: nn.Module) -> int:
    """Bytes the loaded model spends on routed experts (fused `experts` modules or per-expert Linears)."""
    total = 0
    for name, module in model.named_modules():
        if name.endswith(".experts") and not name.endswith("shared_experts"):
            total += sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
    return total
