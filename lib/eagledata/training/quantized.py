"""Quantized checkpoints: which formats the extraction path accepts, and the tiny INT4 kimi_k25 test checkpoint.

Kimi-K2.5 ships its routed experts as compressed-tensors INT4 (`pack-quantized`, symmetric, group 32);
attention, shared experts, the dense MLP, lm_head and the vision tower stay bf16. transformers loads such
experts by DEQUANTIZING them into its fused `DeepseekV3Experts` parameters, so in memory they cost the
compute dtype per weight, not half a byte: `expert_storage` says so, and the memory plan counts it.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError

# Kimi-K2.5's `quantization_config`, as its config.json declares it (../shared/DESIGN.md, "Kimi-K2.5 checkpoint").
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

# Checkpoint keys of the routed experts (per-expert Linear weights, the layout K2.5 and save_pretrained write).
ROUTED_EXPERT_KEY = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


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


# -- the tiny INT4 checkpoint ----------------------------------------------------------------------
def _scheme(qconfig: dict[str, Any]):
    from compressed_tensors.quantization import QuantizationScheme

    group = qconfig["config_groups"]["group_0"]
    return QuantizationScheme(targets=group["targets"], weights=group["weights"])


def quantize_expert_weight(weight: torch.Tensor, qconfig: dict[str, Any] = KIMI_K25_QUANTIZATION_CONFIG
                           ) -> dict[str, torch.Tensor]:
    """One Linear weight [out, in] as compressed-tensors writes it: weight_packed (int32), weight_scale, weight_shape.

    Scales come from compressed-tensors' own min/max rule and packing from its `pack-quantized`
    compressor, so the file is what its decompressor (and transformers, vLLM) expects.
    """
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    scheme = _scheme(qconfig)
    scale, zero_point = compute_dynamic_scales_and_zp(weight, scheme.weights, module=None)
    compressor = BaseCompressor.get_value_from_registry(qconfig["format"])
    out = compressor.compress({"weight": weight, "weight_scale": scale, "weight_zero_point": zero_point}, scheme)
    return {k: v.contiguous() for k, v in out.items()}


def dequantize_expert_weight(packed: dict[str, torch.Tensor],
                             qconfig: dict[str, Any] = KIMI_K25_QUANTIZATION_CONFIG) -> torch.Tensor:
    """The inverse, through compressed-tensors' decompressor: the weight the model really computes with."""
    from compressed_tensors.compressors import BaseCompressor

    compressor = BaseCompressor.get_value_from_registry(qconfig["format"])
    return compressor.decompress(dict(packed), _scheme(qconfig))["weight"]


@dataclass(frozen=True)
class Int4Checkpoint:
    directory: Path  # the compressed-tensors checkpoint (what K2.5 looks like)
    reference: nn.Module  # the same model with every routed expert replaced by its dequantized weight
    packed_expert_bytes: int  # weight_packed + weight_scale + weight_shape of all routed experts, as stored
    expert_weights: int  # routed expert weights (elements)


def write_int4_checkpoint(model: nn.Module, directory: str | Path,
                          qconfig: dict[str, Any] = KIMI_K25_QUANTIZATION_CONFIG) -> Int4Checkpoint:
    """Save `model` (a kimi_k25 / DeepseekV3 model) in K2.5's format: bf16, routed experts compressed-tensors INT4.

    Returns the directory and a dequantized reference model (float32, built from the very tensors
    written), the ground truth the loaded checkpoint is compared with.
    """
    from safetensors.torch import load_file, save_file

    directory = Path(directory)
    model.to(torch.bfloat16).save_pretrained(str(directory))
    model.to(torch.float32)
    files = sorted(directory.glob("*.safetensors"))
    if len(files) != 1:
        raise InputError(f"expected one safetensors file for a tiny model, found {len(files)}", str(directory))
    state = load_file(str(files[0]))
    out: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    packed_bytes = weights = 0
    # transformers 5.23's reverse key mapping writes the text decoder's layers as `blocks` (its rule for the
    # vision encoder's blocks catches them too); K2.5's files and the forward mapping say `layers`.
    state = {re.sub(r"^language_model\.model\.blocks\.", "language_model.model.layers.", k): v
             for k, v in state.items()}
    for key, tensor in state.items():
        if not ROUTED_EXPERT_KEY.match(key):
            out[key] = tensor
            continue
        packed = quantize_expert_weight(tensor, qconfig)
        for name, value in packed.items():
            out[key.removesuffix("weight") + name] = value
            packed_bytes += value.numel() * value.element_size()
        dequantized[key] = dequantize_expert_weight(packed, qconfig)
        weights += tensor.numel()
    if not dequantized:
        raise InputError("the model has no routed experts (…mlp.experts.N.{gate,up,down}_proj.weight)", str(directory))
    save_file(out, str(files[0]), metadata={"format": "pt"})
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = copy.deepcopy(qconfig)
    config_path.write_text(json.dumps(config, indent=2) + "\n")

    reference_dir = directory.parent / f".{directory.name}-reference"
    reference_dir.mkdir(exist_ok=True)
    save_file({k: dequantized.get(k, v).float() for k, v in state.items()}, str(reference_dir / files[0].name),
              metadata={"format": "pt"})
    for extra in directory.iterdir():
        if extra.suffix == ".json" and extra.name != "config.json":
            (reference_dir / extra.name).write_bytes(extra.read_bytes())
    plain = dict(config)
    plain.pop("quantization_config")
    (reference_dir / "config.json").write_text(json.dumps(plain, indent=2) + "\n")
    from .models import load_model

    reference = load_model(reference_dir, dtype=torch.float32)
    return Int4Checkpoint(directory=directory, reference=reference, packed_expert_bytes=packed_bytes,
                          expert_weights=weights)


def routed_expert_bytes(model: nn.Module) -> int:
    """Bytes the loaded model spends on routed experts (fused `experts` modules or per-expert Linears)."""
    total = 0
    for name, module in model.named_modules():
        if name.endswith(".experts") and not name.endswith("shared_experts"):
            total += sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
    return total
