"""Tiny targets and tokenizers for the quality stage's tests: built from configs, never from a hub."""
from __future__ import annotations

import torch

from eagledata.training.tiny import build_tiny_model

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]


def sharp_llama(seed: int = 0, *, vocab_size: int = 256, num_layers: int = 4, hidden_size: int = 64,
                sharpen: float = 20.0):
    """A random Llama whose LM head is scaled up: next-token distributions far from uniform, as a trained model's
    are, so greedy choices are not near-ties that float rounding could flip between a one-token forward and a
    verifying one."""
    model = build_tiny_model("llama", seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                             vocab_size=vocab_size).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def word_tokenizer(vocab_size: int = 256):
    """A word-level transformers tokenizer of `vocab_size` ids (SPECIALS, then w6, w7, …) with a ChatML-like chat
    template, eos `<|im_end|>` (id 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), vocab_size)]
    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def prompts(n: int, *, vocab_size: int = 256, seed: int = 0, low: int = 6) -> list[list[int]]:
    """n prompts of 4..19 random ids in low..vocab_size-1."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab_size, (4 + (7 * i) % 16,), generator=g).tolist() for i in range(n)]
