"""Tiny random-weight models of each supported family, sized for Kimi ids: for tests, the demo and benchmarks
(never on the path of a real extraction)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError

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


