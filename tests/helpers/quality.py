"""Tiny targets and tokenizers for the quality stage's tests: built from configs, never from a hub."""
from __future__ import annotations

from collections import deque

import torch

from eagledata.quality.speculative import ModelDrafter
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


def hf_greedy(model, prompt, max_new_tokens, eos=None):
    """transformers' own greedy `generate`: the reference no code of ours computes."""
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


class StatesChecked:
    """Drafts the target's greedy tokens with one made wrong at a place that moves (0 … k accepted), after holding
    the aux states it is given to transformers' own forward over the verified ids: the Drafter protocol's positions
    (len(ids) − 1 − n … len(ids) − 2 for n states, each position once, in order)."""

    def __init__(self, model, aux):
        self.model, self.aux_layers, self.inner = model, aux, ModelDrafter(model)
        self.worst, self.seen = 0.0, 0

    def start(self):
        self.inner.start()
        self.seen = 0

    def propose(self, ids, states, k):
        n = states.shape[0]
        assert len(ids) - 1 - n == self.seen, "states for positions other than the next ones"
        self.seen += n
        with torch.no_grad():
            hidden = self.model(torch.tensor([list(ids[:-1])]), output_hidden_states=True).hidden_states
        expected = torch.cat([hidden[i][0, len(ids) - 1 - n:] for i in self.aux_layers], dim=-1)
        self.worst = max(self.worst, float((states - expected).abs().max()))
        drafts = self.inner.propose(ids, None, k)
        wrong = len(ids) % (k + 2)
        if wrong < k:
            drafts[wrong] = (drafts[wrong] + 1) % 256
        return drafts


class KeepingStates:
    """`StatesChecked` per row as a batched drafter that keeps what it drew from the positions a new sequence
    shares with the row's last one (as `BatchEagle3Drafter` keeps its rows): the states it is then given must start
    where it stopped."""

    def __init__(self, model, aux, rows):
        self.checks, self.aux_layers = [StatesChecked(model, aux) for _ in range(rows)], aux

    def start(self, row, keep=0):
        self.checks[row].inner.start()
        self.checks[row].seen = min(self.checks[row].seen, keep)
        return self.checks[row].seen

    def propose(self, rows, k):
        return {r: self.checks[r].propose(ids, states, k) for r, (ids, states) in rows.items()}


class FollowUps:
    """A `TurnFeed` of two-turn chats: each prompt, then (ready once its answer is) the prompt, the answer and
    `more[i]`, as a chat's next turn carries the earlier ones."""

    def __init__(self, first, more):
        self.first, self.more, self.given, self.later, self.decoded = list(first), more, 0, deque(), {}

    def next_turn(self):
        if self.later:
            return self.later.popleft()
        if self.given < len(self.first):
            self.given += 1
            return (self.given - 1, 0), self.first[self.given - 1]
        return None

    def finished(self, key, decoded):
        self.decoded[key] = decoded
        if key[1] == 0:
            self.later.append(((key[0], 1), [*self.first[key[0]], *decoded.output_ids, *self.more[key[0]]]))
