"""The verifier model for extraction: loading a checkpoint and finding its text decoder."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from .quantized import check_quantization


# -- loading ----------------------------------------------------------------------------------------
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
               device_map: Any = None, trust_remote_code: bool = False, tp: int = 1, dp: int = 1,
               max_memory: dict | None = None) -> nn.Module:
    """A checkpoint dir or hub id through transformers (causal LM, else image-text-to-text such as kimi_k25).

    bf16 on GPU and fp32 on CPU unless told; `device_map` (e.g. "auto": accelerate spreads the layers
    over the visible devices, `max_memory` caps each) goes to `from_pretrained` as is. `tp > 1`: under
    torchrun, transformers' own tensor-parallel plan (`tp_plan="auto"`) shards the model over `tp`
    ranks of the default process group; `dp` such copies each run in a group of their own (see
    `eagledata.hidden_states._init_distributed`). compressed-tensors checkpoints
    load through transformers' quantizer (see `quantized.py` for what it keeps in memory).
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
    quantization = check_quantization(config.to_dict())
    if quantization is not None:
        # Dequantize every serialized weight while loading. transformers' default compressed-tensors route
        # also dequantizes the routed experts (its fused DeepseekV3Experts cannot hold packed INT4), but it
        # first turns every other Linear the config targets (kimi_k25's vision tower and projector, which
        # K2.5's `ignore` list does not name) into a packed module, and their bf16 weights then load as
        # missing. Either way the experts end up dense: quantized.py, memory.py.
        from transformers import CompressedTensorsConfig

        raw = config.to_dict().get("quantization_config") or {}
        kwargs["quantization_config"] = CompressedTensorsConfig(**{**raw, "dequantize": True})
    if device_map is not None:
        kwargs["device_map"] = device_map
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if tp > 1:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(tp_plan="auto", tp_size=tp)
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText, AutoModel):
        if type(config) in auto._model_mapping or (trust_remote_code and auto.__name__ in
                                                   getattr(config, "auto_map", {})):
            with warnings.catch_warnings():  # "the quantization_config from the model will be used": intended
                warnings.filterwarnings("ignore", message="You passed `quantization_config`")
                loaded: nn.Module = auto.from_pretrained(src, config=config, **kwargs)
            break
    else:
        raise InputError(f"transformers has no model class for model_type {config.model_type!r}", src, field="model")
    if device_map is None and tp == 1:
        loaded = loaded.to(device)
    if quantization is not None:  # dequantized experts arrive in the scales' dtype (bf16), wherever they were placed
        for param in loaded.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
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
