"""The target model for extraction: loading a checkpoint, finding its text decoder, and tiny random models
of each supported family for tests, the demo and benchmarks."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError

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
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a tiny model saves in a blink: no bar in the demo's output
        try:
            model.save_pretrained(str(directory))
        finally:
            if shown:
                hf_logging.enable_progress_bar()
    return model


