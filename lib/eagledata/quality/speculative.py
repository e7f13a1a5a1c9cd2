"""Greedy speculative decoding of one turn, as the EAGLE papers measure τ: a drafter proposes a chain of k tokens,
the verifier verifies them in one forward, the accepted prefix and the verifier's own next token (the bonus) are
emitted.

Greedy verification emits exactly what plain greedy decoding emits, whatever the drafter proposes: the drafter only
decides how many verifier forwards it takes. τ counts the tokens each verifying forward yields (accepted + 1), before
an end-of-turn token or the length cap ends the last chain early, as vLLM's metrics count them (1 + accepted / drafts);
the prefill forward, which yields the first token with no draft, is not a verifying forward. The verifier drafting
for itself therefore gives τ = k + 1 exactly, and per-position acceptance sums to τ − 1 (`tau.py`).

A drafter may propose fewer than k tokens, none included (prompt lookup with no match: `NgramDrafter`): the verifier
then runs over the chain it has (the last token alone when there is none), and that forward still counts, yielding
its accepted drafts and the bonus. τ is tokens per verifier forward, what the user's latency sees; vLLM's counters
count only forwards that carried a draft (`Decoded.drafted` keeps each chain's length, `tau.py` reports both).

Many turns at once: `batched.py`, the same loop over rows.

Torch only (plus `transformers.DynamicCache`): the same file runs in the project's environment and in the
speculators one (`eagle3.py`, `measure.py`), so every drafter goes through one decode loop.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


def new_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first `length` positions of a transformers cache (negative `crop`: transformers ≥ 5.18 refuses a
    positive one)."""
    remove = cache.get_seq_length() - length
    if remove < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} positions to {length}")
    if remove:
        cache.crop(-remove)


class Drafter(Protocol):
    """What proposes the chains: the seam between the decode loop and any drafter."""

    @property
    def aux_layers(self) -> tuple[int, ...] | None:
        """The verifier's hidden states the drafter reads (HF `hidden_states` indices, concatenated in this order),
        or None for a drafter that reads token ids only."""

    def start(self) -> None:
        """A new sequence: forget the last one."""

    def propose(self, ids: Sequence[int], states: torch.Tensor | None, k: int) -> list[int]:
        """Up to k token ids to follow `ids` (fewer, or none, where the drafter has nothing to propose), the verified
        sequence (prompt and emitted tokens; the verifier has run over
        all but the last). `states`: the verifier's `aux_layers` states, [n, len(aux_layers) · H], at the n positions
        verified since the last call (positions len(ids) − 1 − n … len(ids) − 2: each position once, in order)."""
        ...


class Verifier:
    """The verifier: a transformers causal LM run over one sequence at a time with a KV cache that is cropped back
    to the accepted positions after each verification."""

    def __init__(self, model: Any, aux_layers: Sequence[int] | None = None):
        self.model = model.eval()
        self.aux_layers = tuple(aux_layers) if aux_layers is not None else None
        self.cache: Any = None
        self.forwards = 0

    def start(self) -> None:
        self.cache = new_cache()

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    @torch.no_grad()
    def forward(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, V] for `ids` appended to the cached positions, and the aux states [n, S] (None without
        `aux_layers`)."""
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.model.device), past_key_values=self.cache,
                         use_cache=True, output_hidden_states=self.aux_layers is not None)
        self.forwards += 1
        states = None
        if self.aux_layers is not None:
            states = torch.cat([out.hidden_states[i][0] for i in self.aux_layers], dim=-1)
        return out.logits[0], states

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length)


@dataclass
class Decoded:
    """One turn decoded: its output and how many tokens each verifying forward yielded."""

    prompt_length: int
    output_ids: list[int]
    accepted: list[int] = field(default_factory=list)  # per verifying forward: draft tokens accepted, 0..k
    k: int = 0
    drafted: list[int] = field(default_factory=list)  # per verifying forward: the chain's length, 0..k

    @property
    def steps(self) -> int:
        """Verifying verifier forwards (the prefill not counted)."""
        return len(self.accepted)

    @property
    def tokens(self) -> int:
        """Tokens the verifying forwards yielded (accepted + the bonus each), up to where a stop ends the turn."""
        return sum(self.accepted) + len(self.accepted)

    @property
    def tau(self) -> float | None:
        return self.tokens / self.steps if self.steps else None


def turn_ends(token: int, out: list[int], stop_ids: Collection[int], max_new_tokens: int) -> bool:
    return token in stop_ids or len(out) >= max_new_tokens


def greedy_decode(verifier: Verifier, prompt_ids: Sequence[int], *, max_new_tokens: int,
                  stop_ids: Collection[int] = ()) -> list[int]:
    """Plain greedy decoding, one verifier forward per token: what speculative decoding must reproduce."""
    if max_new_tokens < 1 or not prompt_ids:
        raise ValueError("needs a prompt and max_new_tokens >= 1")
    verifier.start()
    logits, _ = verifier.forward(prompt_ids)
    out = [int(logits[-1].argmax())]
    while not turn_ends(out[-1], out, stop_ids, max_new_tokens):
        logits, _ = verifier.forward(out[-1:])
        out.append(int(logits[-1].argmax()))
    return out


def speculative_decode(verifier: Verifier, drafter: Drafter, prompt_ids: Sequence[int], *, k: int,
                       max_new_tokens: int, stop_ids: Collection[int] = ()) -> Decoded:
    """Greedy speculative decoding of one turn: the output equals `greedy_decode`'s, up to the first stop id
    (included) or `max_new_tokens`."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if max_new_tokens < 1 or not prompt_ids:
        raise ValueError("needs a prompt and max_new_tokens >= 1")
    if drafter.aux_layers is not None and tuple(drafter.aux_layers) != verifier.aux_layers:
        raise ValueError(f"the drafter reads the verifier's layers {drafter.aux_layers}, the verifier gives "
                         f"{verifier.aux_layers}")
    verifier.start()
    drafter.start()
    logits, states = verifier.forward(prompt_ids)
    ids = [*prompt_ids, int(logits[-1].argmax())]
    result = Decoded(len(prompt_ids), ids[len(prompt_ids):], k=k)
    out = result.output_ids
    while not turn_ends(out[-1], out, stop_ids, max_new_tokens):
        drafts = [int(t) for t in drafter.propose(ids, states, k)]
        if len(drafts) > k:
            raise ValueError(f"the drafter proposed {len(drafts)} tokens, more than k = {k}")
        logits, states = verifier.forward([ids[-1], *drafts])
        best = logits.argmax(-1).tolist()  # best[i]: the verifier's token after ids[-1], d1 … di
        a = 0
        while a < len(drafts) and drafts[a] == best[a]:
            a += 1
        result.accepted.append(a)
        result.drafted.append(len(drafts))
        verifier.crop(len(ids) + a)  # ids[-1] and the accepted drafts are verified positions now
        states = states[:a + 1] if states is not None else None
        for token in [*drafts[:a], best[a]]:
            ids.append(token)
            out.append(token)
            if turn_ends(token, out, stop_ids, max_new_tokens):
                break
    return result


class ModelDrafter:
    """A causal LM drafting greedily from the token ids alone, with its own cache: the verifier drafting for itself
    (τ = k + 1), or a model with random weights (τ ≈ 1)."""

    aux_layers = None

    def __init__(self, model: Any):
        self.model = model.eval()
        self.cache: Any = None
        self.cached: list[int] = []  # the tokens whose positions the cache holds

    def start(self) -> None:
        self.cache, self.cached = new_cache(), []

    @torch.no_grad()
    def _next(self, ids: Sequence[int]) -> int:
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.model.device), past_key_values=self.cache,
                         use_cache=True)
        self.cached += ids
        return int(out.logits[0, -1].argmax())

    def propose(self, ids: Sequence[int], states: torch.Tensor | None, k: int) -> list[int]:
        keep = 0
        for a, b in zip(self.cached, ids[:-1]):  # at least the last id is fed again, for its logits
            if a != b:
                break
            keep += 1
        crop_cache(self.cache, keep)
        del self.cached[keep:]
        drafts = [self._next(ids[keep:])]
        while len(drafts) < k:
            drafts.append(self._next(drafts[-1:]))
        return drafts


class NgramDrafter:
    """Prompt lookup, vLLM's `method: ngram` (a drafter any user has for free, no data, no weights): for n from
    `max_n` down to `min_n`, the most recent earlier occurrence of the sequence's last n tokens (prompt and output so
    far); the up to k tokens that followed it are the chain. No occurrence: no draft (the loop's forward then yields
    the bonus alone)."""

    aux_layers = None

    def __init__(self, max_n: int = 4, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}..{max_n}")
        self.max_n, self.min_n = max_n, min_n

    def start(self) -> None:
        pass

    def propose(self, ids: Sequence[int], states: torch.Tensor | None, k: int) -> list[int]:
        ids = list(ids)
        length = len(ids)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            tail = ids[length - n:]
            # an earlier occurrence ends before the last token: start j with j + n <= length - 1
            for j in range(length - n - 1, -1, -1):
                if ids[j:j + n] == tail:
                    return ids[j + n:j + n + k]
        return []
