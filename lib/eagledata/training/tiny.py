"""Tiny random-weight models of each supported family, sized for Kimi ids, and a tiny INT4 checkpoint in K2.5's
format (`write_int4_checkpoint`): for tests, the demo and benchmarks, never on the path of a real extraction.
Of the library, only the demo imports it."""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..errors import InputError
from .models import load_model
from .quantized import KIMI_K25_QUANTIZATION_CONFIG

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TINY_FAMILIES = ("llama", "deepseek_v3", "kimi_k25")
# A DeepseekV3 with K2.5's MLA dimensions and routing method (tiny otherwise): for the real-vLLM tests, not in
# TINY_FAMILIES (its attention alone outweighs the other tiny models).
K25_MLA_FAMILY = "deepseek_v3_k25_mla"
K25_MLA: dict[str, Any] = dict(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                               v_head_dim=128, n_group=2, topk_group=1, routed_scaling_factor=2.827,
                               norm_topk_prob=True)


def tiny_config(family: str, *, hidden_size: int = 64, num_layers: int = 6, vocab_size: int = 163_840,
                k25_shape: bool = False) -> Any:
    """A small random-weight config of a supported family, sized for Kimi ids (tests, demo, bench).
    `k25_shape` (DeepseekV3-style families): K2.5's MLA dimensions and routing method (`K25_MLA`), what a
    serving engine's MLA kernels accept (`K25_MLA_FAMILY` is deepseek_v3 with it), and for kimi_k25 K2.5's
    untied lm_head (Kimi_K25Config defaults to tied: its checkpoint then has no lm_head, which vLLM's
    KimiK25ForConditionalGeneration, reading the text config's `tie_word_embeddings: false`, leaves unloaded)."""
    from transformers import DeepseekV3Config, LlamaConfig
    from transformers.models.kimi_k25 import Kimi_K25Config

    heads = max(2, hidden_size // 32)
    common: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                  num_hidden_layers=num_layers, num_attention_heads=heads, max_position_embeddings=8192)
    if family == "llama":
        return LlamaConfig(num_key_value_heads=max(1, heads // 2), **common)
    deepseek: dict[str, Any] = dict(
        common, num_key_value_heads=heads, moe_intermediate_size=hidden_size // 2, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
        q_lora_rank=hidden_size // 2, kv_lora_rank=hidden_size // 4, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=hidden_size // heads)
    if k25_shape or family == K25_MLA_FAMILY:
        # K2.5's attention and routing with few heads, experts and layers: what an engine must run for K2.5
        # (vLLM's CPU MLA takes kv_lora_rank + qk_rope_head_dim in {320, 512, 576}: K2.5's is 576).
        # topk_method/scoring_func are K2.5's; vLLM loads `e_score_correction_bias` only with noaux_tc and
        # defaults to softmax scoring, while transformers' DeepseekV3 always routes with sigmoid + that bias.
        deepseek.update(K25_MLA, topk_method="noaux_tc", scoring_func="sigmoid")
    if family in ("deepseek_v3", K25_MLA_FAMILY):
        return DeepseekV3Config(**deepseek)
    if family == "kimi_k25":
        untied: dict[str, Any] = {"tie_word_embeddings": False} if k25_shape else {}
        return Kimi_K25Config(text_config=dict(model_type="deepseek_v3", **deepseek),
                              vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64), projection_hidden_size=32,
                              **untied)
    raise InputError(f"unknown family {family!r}; one of {(*TINY_FAMILIES, K25_MLA_FAMILY)}", field="family")


def build_tiny_model(family: str, directory: str | Path | None = None, *, seed: int = 0, **config: Any) -> nn.Module:
    """A random model of `family`; saved to `directory` (a checkpoint `load_model` reads) when given."""
    from transformers import AutoModelForCausalLM
    from transformers.models.kimi_k25 import Kimi_K25ForConditionalGeneration

    cfg = tiny_config(family, **config)
    torch.manual_seed(seed)
    model = Kimi_K25ForConditionalGeneration(cfg) if family == "kimi_k25" else AutoModelForCausalLM.from_config(cfg)
    # Norm weights start at one, which makes RMSNorm idempotent: a state taken after the final norm would then
    # pass every check written for one taken before it. Random weights keep the two sides apart.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
    model.eval()
    if directory is not None:
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a tiny model saves in a blink: no bar in the demo's output
        try:
            model.save_pretrained(str(directory))
        finally:
            if shown:
                hf_logging.enable_progress_bar()
    return model


# K2.5's own config.json names its class so (vLLM's registry too); transformers 5.23 saves `Kimi_K25…`.
K25_ARCHITECTURE = "KimiK25ForConditionalGeneration"


# transformers 5.23's reverse key mapping (save_pretrained) writes some kimi_k25 keys under other names than K2.5's
# files use, and its forward mapping reads either: the text decoder's layers as `blocks` (its rule for the vision
# encoder's blocks catches them too), the patch embedding inside the encoder, the projector's norm under `model.`.
K25_KEYS = ((r"^language_model\.model\.blocks\.", "language_model.model.layers."),
            (r"^vision_tower\.encoder\.patch_embed\.", "vision_tower.patch_embed."),
            (r"^model\.mm_projector\.", "mm_projector."))


def k25_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a saved tiny kimi_k25 under K2.5's own names."""
    out = {}
    for key, value in state.items():
        for pattern, name in K25_KEYS:
            key = re.sub(pattern, name, key)
        out[key] = value
    return out


def as_k25_files(directory: str | Path) -> None:
    """A saved tiny kimi_k25 rewritten to K2.5's own names (tensor keys, `architectures`), what a serving engine
    that reads K2.5 expects (vLLM's `KimiK25ForConditionalGeneration`); transformers loads either."""
    from safetensors.torch import load_file, save_file

    directory = Path(directory)
    for path in sorted(directory.glob("*.safetensors")):
        save_file(k25_keys(load_file(str(path))), str(path), metadata={"format": "pt"})
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = [K25_ARCHITECTURE]
    config_path.write_text(json.dumps(config, indent=2) + "\n")


# -- the tiny INT4 checkpoint: a tiny kimi_k25 in K2.5's format (tests, and the first check on a GPU node) --
# Checkpoint keys of the routed experts (per-expert Linear weights, the layout K2.5 and save_pretrained write).
ROUTED_EXPERT_KEY = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


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
    model.to(torch.bfloat16)  # in place, as Module.to is
    cast("PreTrainedModel", model).save_pretrained(str(directory))  # a transformers model: it saves itself
    model.to(torch.float32)
    files = sorted(directory.glob("*.safetensors"))
    if len(files) != 1:
        raise InputError(f"expected one safetensors file for a tiny model, found {len(files)}", str(directory))
    state = load_file(str(files[0]))
    out: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    packed_bytes = weights = 0
    state = k25_keys(state)
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
    reference = load_model(reference_dir, dtype=torch.float32)
    return Int4Checkpoint(directory=directory, reference=reference, packed_expert_bytes=packed_bytes,
                          expert_weights=weights)
