"""Greedy speculative decoding, as the EAGLE papers measure τ: a drafter proposes a chain of k tokens, the verifier
verifies them in one forward, the accepted prefix and the verifier's own next token (the bonus) are emitted.

Greedy verification emits exactly what plain greedy decoding emits, whatever the drafter proposes: the drafter only
decides how many verifier forwards it takes. τ counts the tokens each verifying forward yields (accepted + 1), before
an end-of-turn token or the length cap ends the last chain early, as vLLM's metrics count them (1 + accepted / drafts);
the prefill forward, which yields the first token with no draft, is not a verifying forward. The verifier drafting
for itself therefore gives τ = k + 1 exactly, and per-position acceptance sums to τ − 1 (`tau.py`).

A drafter may propose fewer than k tokens, none included (prompt lookup with no match: `NgramDrafter`): the verifier
then runs over the chain it has (the last token alone when there is none), and that forward still counts, yielding
its accepted drafts and the bonus. τ is tokens per verifier forward, what the user's latency sees; vLLM's counters
count only forwards that carried a draft (`Decoded.drafted` keeps each chain's length, `tau.py` reports both).

Many turns at once (`speculative_decode_batch`, `measure.py --batch`): each row decodes one turn as
`speculative_decode` does (its own drafts, acceptance, crop and count), the rows' chains verified together, either
by one batched verifying forward over them (`BatchVerifier.verify`) or against the verifier's own greedy decode run
ahead, one token per row a forward (`GreedyVerifier`): every position a greedy verification reads lies on that
sequence, so both give the same tokens and counts, and the second costs a token's forward per emitted token instead
of a chain's per verification (τ ≈ 1.3–1.8: 2–3× less arithmetic). A chat's next turn keeps the positions it shares
with its earlier turns in its row.

Torch only (plus `transformers.DynamicCache`): the same file runs in the project's environment and in the
speculators one (`eagle3.py`, `measure.py`), so every drafter goes through one decode loop.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
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


def _stops(token: int, out: list[int], stop_ids: Collection[int], max_new_tokens: int) -> bool:
    return token in stop_ids or len(out) >= max_new_tokens


def greedy_decode(verifier: Verifier, prompt_ids: Sequence[int], *, max_new_tokens: int,
                  stop_ids: Collection[int] = ()) -> list[int]:
    """Plain greedy decoding, one verifier forward per token: what speculative decoding must reproduce."""
    if max_new_tokens < 1 or not prompt_ids:
        raise ValueError("needs a prompt and max_new_tokens >= 1")
    verifier.start()
    logits, _ = verifier.forward(prompt_ids)
    out = [int(logits[-1].argmax())]
    while not _stops(out[-1], out, stop_ids, max_new_tokens):
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
    while not _stops(out[-1], out, stop_ids, max_new_tokens):
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
            if _stops(token, out, stop_ids, max_new_tokens):
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


# -- several sequences in one forward (issue 59 item 3) -------------------------------------------------------------
class RowCache:
    """A KV cache of `rows` sequences, each with its own length: row r's positions sit at slots [0, lengths[r]), so
    a forward writes each row's new tokens at that row's own next slots and cropping a row only lowers its length
    (what lies past it is masked, then overwritten). No row's cache is ever copied to crop or to pad another.

    Duck-typed for transformers' decoder layers (`update`, `get_seq_length`), for a caller that runs them itself
    (`eagle3.BatchEagle3Drafter`): it sets `write` and `span` around each forward and passes explicit position ids
    and a 4-D mask, so transformers neither counts positions nor builds a mask from it."""

    def __init__(self, rows: int):
        self.lengths = [0] * rows
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows [R, 1], slots [R, S]) of this forward
        self.span = 0  # slots the forward's keys cover

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.span

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the forward's [R, H, S, D] keys and values at each row's slots; return the R rows' [R, H, span, D]
        (a view when every row takes part)."""
        if self.write is None:
            raise RuntimeError("RowCache.update outside a forward that set its write slots")
        rows, slots = self.write
        while len(self.keys) <= layer_idx:
            self.keys.append(key.new_zeros(0))
            self.values.append(value.new_zeros(0))
        for store, new in ((self.keys, key), (self.values, value)):
            buffer = store[layer_idx]
            if buffer.shape[0] != len(self.lengths) or buffer.shape[2] < self.span:
                grown = new.new_zeros(len(self.lengths), new.shape[1], max(2 * self.span, 256), new.shape[3])
                if buffer.numel():
                    grown[:, :, :buffer.shape[2]] = buffer
                store[layer_idx] = buffer = grown
            buffer[rows, :, slots] = new.permute(0, 2, 1, 3)
        if rows.shape[0] == len(self.lengths):
            return self.keys[layer_idx][:, :, :self.span], self.values[layer_idx][:, :, :self.span]
        index = rows[:, 0]
        return (self.keys[layer_idx][:, :, :self.span].index_select(0, index),
                self.values[layer_idx][:, :, :self.span].index_select(0, index))


@dataclass
class RowOutput:
    """One row's share of a batched forward: logits [n, V] (only the last position's after a prefill with
    `last_only`), and the aux states [n, S] of all n new positions (None without aux layers)."""

    logits: torch.Tensor
    states: torch.Tensor | None


@dataclass
class Verification:
    """One row's verification (`BatchVerifier.verify`): `best`, the verifier's greedy token after the chain's first
    token and each accepted draft, through the first draft it rejects (or its last), so the drafts accepted are
    `best[:-1]` and the bonus `best[-1]`; `states`, the aux states [≥ a + 1, S] of the chain's positions, at
    least its first token's and the accepted drafts' (a prefill: the prompt's, `best` its first token)."""

    best: list[int]
    states: torch.Tensor | None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class BatchVerifier:
    """The verifier over `rows` sequences at once: each forward appends a token list to any subset of rows (lengths
    differ), every row at its own positions, in one pass over the weights.

    The rows' new tokens go through the decoder's projections and MLPs packed, [T, H] for T tokens in all (no
    padding: a row with a 1-token chain costs 1 token); only attention lays them out per row, [rows, width], each
    query over its own row's keys up to its position. Keys and values live in one preallocated buffer per layer,
    [rows, kv heads, capacity, head dim]: a forward writes each new token's at its row's next slot, cropping a row
    only lowers its length (what lies past it is masked, then overwritten), no row is ever copied or padded, and the
    grouped query heads read their key/value head where it lies (no repeated K/V). The LM head runs only where a
    logit is read: a prefill's last position; `verify`, each row's positions up to the first rejected draft.

    Written for transformers' Llama (`LlamaForCausalLM`: its modules and rotary embedding called as they are, the
    attention computed here as its eager attention computes it)."""

    def __init__(self, model: Any, rows: int, aux_layers: Sequence[int] | None = None):
        self.model = model.eval()
        self.rows = rows
        self.aux_layers = tuple(aux_layers) if aux_layers is not None else None
        decoder = model.get_decoder()
        config = model.config
        if getattr(config, "model_type", None) != "llama" or not all(
                hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
            raise ValueError(f"BatchVerifier runs Llama decoders (transformers' LlamaForCausalLM), not "
                             f"{getattr(config, 'model_type', type(model).__name__)!r}")
        self.decoder = decoder
        self.head = model.get_output_embeddings()
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        layers = len(decoder.layers)
        if self.aux_layers is not None and not all(0 <= i <= layers for i in self.aux_layers):
            raise ValueError(f"aux layers {self.aux_layers}: the verifier's hidden states are 0 … {layers}")
        self.lengths = [0] * rows
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.forwards = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def length(self, row: int) -> int:
        return self.lengths[row]

    def reset(self, row: int, keep: int = 0) -> None:
        """A new sequence in `row` that begins with the first `keep` positions it holds (the same tokens)."""
        if not 0 <= keep <= self.lengths[row]:
            raise ValueError(f"row {row} holds {self.lengths[row]} positions, not {keep}")
        self.lengths[row] = keep

    def crop(self, row: int, length: int) -> None:
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot crop row {row} of {self.lengths[row]} positions to {length}")
        self.lengths[row] = length

    def _reserve(self, span: int) -> None:
        """Room for `span` positions in every row (grown in steps of 256, the rows' positions copied over)."""
        if span <= self.capacity:
            return
        capacity = -(-max(span, self.capacity + self.capacity // 4) // 256) * 256
        weight = self.head.weight
        for store in (self.keys, self.values):
            for i in range(len(self.decoder.layers)):
                grown = weight.new_zeros(self.rows, self.kv_heads, capacity, self.head_dim)
                if i < len(store):
                    grown[:, :, :store[i].shape[2]] = store[i]
                    store[i] = grown
                else:
                    store.append(grown)

    def _plan(self, order: list[int], lengths: list[int], batch: torch.Tensor, column: torch.Tensor,
              span: int) -> dict[str, Any]:
        """How a forward's attention is laid out: a long chain (a prefill) row by row, over its own positions only;
        short chains (verifications, greedy steps) in one batch of rows, each padded to the longest chain, over the
        rows' keys where they lie (the range of rows from the first to the last in the forward, rows outside it
        computed and dropped) or, where the forward leaves most of that range out, over a copy of its rows'."""
        device = batch.device
        width = max(lengths)
        if width > 8:
            ends = torch.tensor(lengths).cumsum(0).tolist()
            return {"rows": [(r, e - n, e, self.lengths[r] + n) for r, e, n in zip(order, ends, lengths)]}
        lo, hi = order[0], order[-1] + 1
        if hi - lo <= 3 * len(order):
            place = torch.tensor(order, device=device) - lo
            starts = torch.tensor(self.lengths[lo:hi], device=device)
            rows: slice | torch.Tensor = slice(lo, hi)
        else:
            place = torch.arange(len(order), device=device)
            starts = torch.tensor([self.lengths[r] for r in order], device=device)
            rows = torch.tensor(order, device=device)
        # a query sees its row's slots up to its own position: earlier positions and itself, never what a crop
        # left behind (padding queries, past a row's chain, and rows outside the forward are computed and dropped)
        queries = starts[:, None] + torch.arange(width, device=device)[None]
        hidden = torch.arange(span, device=device)[None, None, :] > queries[:, :, None]  # [rows, width, span]
        return {"batch": place[batch], "column": column, "width": width, "span": span, "rows": rows,
                "hidden": hidden[:, None, None]}

    def _attend(self, layer: int, q: torch.Tensor, plan: dict[str, Any]) -> torch.Tensor:
        """Attention of the forward's scaled queries [T, heads, D] over their rows' keys in `layer`: [T, heads · D].
        Each key/value head is read where it lies by its `group` query heads together (no repeated keys)."""
        group, kv, d = self.heads // self.kv_heads, self.kv_heads, self.head_dim
        keys, values = self.keys[layer], self.values[layer]
        if "batch" not in plan:
            outs = []
            for r, t0, t1, end in plan["rows"]:
                n, start = t1 - t0, end - (t1 - t0)
                grouped = q[t0:t1].view(n, kv, group, d).permute(1, 2, 0, 3).reshape(kv, group * n, d)
                scores = torch.bmm(grouped, keys[r, :, :end].transpose(1, 2)).view(kv, group, n, end)
                causal = torch.arange(end, device=q.device)[None, :] > start + torch.arange(n, device=q.device)[:, None]
                weights = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1, dtype=torch.float32)
                out = torch.bmm(weights.to(q.dtype).view(kv, group * n, end), values[r, :, :end])
                outs.append(out.view(kv, group, n, d).permute(2, 0, 1, 3).reshape(n, kv * group * d))
            return torch.cat(outs)
        width, span, rows = plan["width"], plan["span"], plan["rows"]
        if isinstance(rows, slice):
            keys, values = keys[rows, :, :span], values[rows, :, :span]
        else:
            keys, values = keys[:, :, :span].index_select(0, rows), values[:, :, :span].index_select(0, rows)
        m = keys.shape[0]
        padded = q.new_zeros(m, width, self.heads, d)
        padded[plan["batch"], plan["column"]] = q
        padded = padded.view(m, width, kv, group, d).permute(0, 2, 3, 1, 4).reshape(m * kv, group * width, d)
        scores = torch.bmm(padded, keys.reshape(m * kv, span, d).transpose(1, 2)).view(m, kv, group, width, span)
        weights = torch.softmax(scores.masked_fill(plan["hidden"], float("-inf")), dim=-1, dtype=torch.float32)
        out = torch.bmm(weights.to(q.dtype).view(m * kv, group * width, span), values.reshape(m * kv, span, d))
        out = out.view(m, kv, group, width, d).permute(0, 3, 1, 2, 4).reshape(m, width, self.heads * d)
        return out[plan["batch"], plan["column"]]

    def _run(self, chains: Mapping[int, Sequence[int]]) -> tuple[list[int], list[int], torch.Tensor,
                                                                   torch.Tensor | None]:
        """`chains[row]` appended to each row's positions: (the rows in order, their chain lengths, the final
        normed hidden states [T, H] of all T new tokens, row after row, and their aux states [T, S])."""
        order = sorted(chains)
        if not order or any(not chains[r] for r in order):
            raise ValueError("every row in a forward needs at least one token")
        device = self.head.weight.device
        lengths = [len(chains[r]) for r in order]
        n = len(order)
        starts = torch.tensor([self.lengths[r] for r in order], device=device)
        sizes = torch.tensor(lengths, device=device)
        batch = torch.repeat_interleave(torch.arange(n, device=device), sizes)  # each token's place in the batch
        column = torch.arange(int(sizes.sum()), device=device) - torch.repeat_interleave(sizes.cumsum(0) - sizes,
                                                                                            sizes)
        positions = starts[batch] + column
        span = int((starts + sizes).max())
        self._reserve(span)
        slots_rows = torch.tensor(order, device=device)[batch]
        plan = self._plan(order, lengths, batch, column, span)
        tokens = torch.tensor([t for r in order for t in chains[r]], device=device)
        x = self.decoder.embed_tokens(tokens)
        cos, sin = self.decoder.rotary_emb(x, positions[None])
        cos, sin = cos[0][:, None], sin[0][:, None]
        states: dict[int, torch.Tensor] = {}  # transformers' hidden states: index i, the input of layer i
        for i, layer in enumerate(self.decoder.layers):
            if self.aux_layers is not None and i in self.aux_layers:
                states[i] = x
            attention = layer.self_attn
            residual = x
            h = layer.input_layernorm(x)
            q = attention.q_proj(h).view(-1, self.heads, self.head_dim)
            k = attention.k_proj(h).view(-1, self.kv_heads, self.head_dim)
            v = attention.v_proj(h).view(-1, self.kv_heads, self.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys[i][slots_rows, :, positions] = k
            self.values[i][slots_rows, :, positions] = v
            out = self._attend(i, q * attention.scaling, plan)
            x = residual + attention.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.decoder.norm(x)
        aux = None
        if self.aux_layers is not None:
            states[len(self.decoder.layers)] = x  # the last: the final norm's output
            aux = torch.cat([states[i] for i in self.aux_layers], dim=-1)
        for r, size in zip(order, lengths):
            self.lengths[r] += size
        self.forwards += 1
        return order, lengths, x, aux

    @torch.no_grad()
    def forward(self, chains: Mapping[int, Sequence[int]], *, last_only: bool = False) -> dict[int, RowOutput]:
        """`chains[row]` appended to each row's positions in one forward: each row's logits at all its new
        positions (its last alone with `last_only`) and its aux states."""
        order, lengths, hidden, aux = self._run(chains)
        ends = torch.tensor(lengths).cumsum(0).tolist()
        picked = ([hidden[e - 1:e] for e in ends] if last_only
                  else [hidden[e - n:e] for e, n in zip(ends, lengths)])
        logits = self.head(torch.cat(picked)).split([p.shape[0] for p in picked])
        return {r: RowOutput(logits[i], aux[ends[i] - lengths[i]:ends[i]] if aux is not None else None)
                for i, r in enumerate(order)}

    @torch.no_grad()
    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        """Each row's prompt in one forward: its first greedy token and the prompt's aux states."""
        return {r: Verification([int(o.logits[-1].argmax())], o.states)
                for r, o in self.forward(prompts, last_only=True).items()}

    @torch.no_grad()
    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        """`chains[row]` (the row's last verified token, then its drafts) appended to each row in one forward, and
        verified greedily: the LM head runs position by position over the rows still accepting (each row's first
        position, then the next of the rows whose draft there equals the verifier's token, …), never over a
        position past a rejected draft."""
        order, lengths, hidden, aux = self._run(chains)
        offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()[:-1]]
        best: list[list[int]] = [[] for _ in order]
        alive, at = list(range(len(order))), 0
        while alive:
            tokens = self.head(hidden[[offsets[i] + at for i in alive]]).argmax(-1).tolist()
            still = []
            for i, token in zip(alive, tokens):
                best[i].append(int(token))
                if at + 1 < lengths[i] and chains[order[i]][at + 1] == token:
                    still.append(i)
            alive, at = still, at + 1
        return {r: Verification(best[i], aux[offsets[i]:offsets[i] + lengths[i]] if aux is not None else None)
                for i, r in enumerate(order)}


class RowForwards(Protocol):
    """What `GreedyVerifier` runs its one-token steps on: `BatchVerifier`, or its steps recorded or replayed
    (`greedy_trace.TraceRecorder`, `TraceReplay`)."""

    rows: int
    aux_layers: tuple[int, ...] | None

    def reset(self, row: int, keep: int = 0) -> None: ...

    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]: ...

    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]: ...


class GreedyVerifier:
    """Chains verified against the verifier's own greedy decode, decoded ahead of them: what `BatchVerifier.verify`
    answers, for one token per row per forward instead of the whole chain.

    Greedy verification accepts a chain's drafts up to the first that differs from the verifier's greedy token
    there, and that token is the bonus; every position it reads lies on the verifier's greedy sequence (the drafts
    before it equal it). So the verifier's tokens a verification needs are that sequence's, whichever drafter
    proposed the chain: this decodes each row's sequence greedily (`BatchVerifier` forwards of one token per row,
    every row that has not reached its end moving on together, so the weights are read once per token of all the
    rows), holds the tokens and aux states not yet verified, and answers `verify` from them: the chains it can answer
    now, the others waiting (the loop brings them again) while rows that have run ahead go on, finish and give their
    row to a new turn; a forward happens when no chain can be answered. A row runs ahead to its end (its first stop
    id or `max_new_tokens`), then `k` tokens on (where a last chain's drafts may still be counted, as a verifying
    forward counts them). The drafter, the chains, the counts and the loop are `speculative_decode_batch`'s; what
    differs from verifying forwards is only the float rounding of each position's logits (a forward of one token
    against one of the chain's), as batching rows differs from one row alone."""

    def __init__(self, verifier: RowForwards, *, k: int, max_new_tokens: int, stop_ids: Collection[int] = (),
                 complete_rows: bool = False):
        self.inner = verifier
        self.complete_rows = complete_rows  # decode each row through its end and k on before it is reset
        self.rows = verifier.rows
        self.aux_layers = verifier.aux_layers
        self.k, self.max_new_tokens, self.stop_ids = k, max_new_tokens, set(stop_ids)
        self.tokens: list[list[int]] = [[] for _ in range(self.rows)]  # prompt and greedy tokens decoded so far
        self.prompt = [0] * self.rows
        self.verified = [0] * self.rows  # the row's verified positions (all the loop holds but its last token)
        self.states: list[list[torch.Tensor]] = [[] for _ in range(self.rows)]  # [1, S] per decoded position …
        self.first_state = [0] * self.rows  # … from this position on
        self.end: list[int | None] = [None] * self.rows  # the output index of the row's last token, once decoded
        self.active: set[int] = set()
        self.forwards = 0

    def reset(self, row: int, keep: int = 0) -> None:
        """A new sequence in `row` that begins with its first `keep` positions' tokens (`prefill` the rest)."""
        if keep > self.verified[row]:
            raise ValueError(f"row {row} holds {self.verified[row]} verified positions, not {keep}")
        if self.complete_rows:
            self.complete([row])
        self.inner.reset(row, keep)
        del self.tokens[row][keep:]
        self.active.discard(row)

    def length(self, row: int) -> int:
        return self.verified[row]

    def crop(self, row: int, length: int) -> None:
        """The row's verified positions after a verification (the tokens decoded beyond stay: they are the
        verifier's greedy ones, the next chains' to read)."""
        if not self.prompt[row] <= length < len(self.tokens[row]):
            raise ValueError(f"cannot crop row {row} to {length}")
        self.verified[row] = length
        drop = length - self.first_state[row]  # the next chain's states start at position `length`
        if drop > 0:
            del self.states[row][:drop]
            self.first_state[row] += drop

    def _complete(self, row: int) -> bool:
        end = self.end[row]
        return end is not None and len(self.tokens[row]) - self.prompt[row] > end + self.k

    def complete(self, rows: Collection[int] | None = None) -> None:
        """Decode the active `rows` (all: None) through their end and k on: what any drafter's chains could read
        (`greedy_trace.TraceRecorder` keeps it)."""
        while todo := [r for r in (self.active if rows is None else rows)
                       if r in self.active and not self._complete(r)]:
            self._advance(todo)

    def _note_end(self, row: int) -> None:
        out = len(self.tokens[row]) - self.prompt[row]
        if self.end[row] is None and (self.tokens[row][-1] in self.stop_ids or out >= self.max_new_tokens):
            self.end[row] = out - 1

    @torch.no_grad()
    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        """Each row's prompt after the positions `reset` kept: its first greedy token and those positions' states."""
        verdicts = self.inner.prefill(prompts)
        for r, v in verdicts.items():
            self.tokens[r] += [*prompts[r], v.best[0]]
            self.prompt[r] = self.verified[r] = len(self.tokens[r]) - 1
            self.states[r], self.first_state[r], self.end[r] = [], self.prompt[r], None
            self.active.add(r)
            self._note_end(r)
        return verdicts

    def _advance(self, needed: Collection[int]) -> None:
        """One forward: the next greedy token of every active row short of its end + k, and of `needed`."""
        rows = {r for r in self.active if not self._complete(r)} | set(needed)
        verdicts = self.inner.verify({r: self.tokens[r][-1:] for r in rows})
        self.forwards += 1
        for r, v in verdicts.items():
            self.tokens[r].append(v.best[0])
            if v.states is not None:
                self.states[r].append(v.states)
            self._note_end(r)

    def _walk(self, row: int, chain: Sequence[int]) -> int | None:
        """How many drafts of `chain` the decoded tokens accept, or None where the walk reads past them."""
        tokens, at = self.tokens[row], self.verified[row] + 1
        a = 0
        while True:
            if at + a >= len(tokens):
                return None
            if a + 1 >= len(chain) or chain[a + 1] != tokens[at + a]:
                return a
            a += 1

    @torch.no_grad()
    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        """The verdicts of the chains the tokens decoded so far answer, after one forward where none could be
        answered before it (as many as it takes: a chain may read several tokens on). A chain left unanswered is
        the caller's to bring again; so rows that have run ahead are verified on without waiting for the others,
        finish, and give their rows to new turns, and every forward moves on all rows short of their end."""
        for r, chain in chains.items():
            if r not in self.active or not chain or chain[0] != self.tokens[r][self.verified[r]]:
                raise ValueError(f"row {r}: the chain does not follow the row's verified tokens")
        while not (answered := {r: a for r, chain in chains.items() if (a := self._walk(r, chain)) is not None}):
            self._advance(list(chains))
        out = {}
        for r, a in answered.items():
            at = self.verified[r]  # the chain's first position
            states = None
            if self.aux_layers is not None:
                first = at - self.first_state[r]
                states = torch.cat(self.states[r][first:first + a + 1])
            out[r] = Verification(self.tokens[r][at + 1:at + a + 2], states)
        return out


class BatchDrafter(Protocol):
    """What proposes the chains of several rows at once (`speculative_decode_batch`)."""

    @property
    def aux_layers(self) -> tuple[int, ...] | None: ...

    def start(self, row: int, keep: int = 0) -> int:
        """A new sequence in `row` whose first `keep` positions are its last sequence's (the same tokens through
        position `keep`, so the same verifier states before it): how many of them the drafter keeps what it drew from
        (≤ keep; its first states then start there: the verifier keeps as many)."""
        ...

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        """Up to k drafts per row, each row's (verified ids, new states) as `Drafter.propose` reads them."""
        ...


class PerRow:
    """Any `Drafter` as a `BatchDrafter`: one drafter per row, made by `make` (ngram, EAGLE-3, tests' drafters),
    each proposing for its own row."""

    def __init__(self, make: Callable[[int], Drafter], rows: int):
        self.drafters = [make(r) for r in range(rows)]
        layers = {d.aux_layers for d in self.drafters}
        if len(layers) != 1:
            raise ValueError(f"the rows' drafters read different verifier layers: {layers}")
        self.aux_layers = layers.pop()

    def start(self, row: int, keep: int = 0) -> int:
        """The row's drafter starts over: a drafter reading states then needs them all (keeps none)."""
        self.drafters[row].start()
        return keep if self.aux_layers is None else 0

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        return {r: [int(t) for t in self.drafters[r].propose(ids, states, k)] for r, (ids, states) in rows.items()}


class BatchModelDrafter:
    """`ModelDrafter` for several rows: a causal LM drafting greedily from the ids, its k steps batched over the
    rows (`BatchVerifier` over the drafter's model), each row's cache kept up to what it shares with the new ids."""

    aux_layers = None

    def __init__(self, model: Any, rows: int):
        self.lm = BatchVerifier(model, rows)
        self.cached: list[list[int]] = [[] for _ in range(rows)]

    def start(self, row: int, keep: int = 0) -> int:
        """Its cache kept (each proposal keeps what the row's cache shares with the ids)."""
        return keep

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        feed = {}
        for r, (ids, _) in rows.items():
            keep = 0
            for a, b in zip(self.cached[r], ids[:-1]):  # at least the last id is fed again, for its logits
                if a != b:
                    break
                keep += 1
            self.lm.crop(r, keep)
            feed[r] = list(ids[keep:])
            self.cached[r] = list(ids)
        drafts: dict[int, list[int]] = {r: [] for r in rows}
        while feed:
            out = self.lm.forward(feed, last_only=True)
            feed = {}
            for r, o in out.items():
                drafts[r].append(int(o.logits[-1].argmax()))
                if len(drafts[r]) < k:
                    feed[r] = drafts[r][-1:]
                    self.cached[r].append(drafts[r][-1])
        return drafts


class NoDrafts:
    """Proposes nothing: `speculative_decode_batch` with it is plain greedy decoding on the batched verifier, one
    token per forward (the reference the batched decode must reproduce)."""

    aux_layers = None

    def start(self, row: int, keep: int = 0) -> int:
        return keep

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        return {r: [] for r in rows}


class TurnFeed(Protocol):
    """Where `speculative_decode_batch` takes its turns from and gives them back: a turn may become ready only when
    another has finished (a question's second turn on its first answer)."""

    def next_turn(self) -> tuple[Hashable, Sequence[int]] | None:
        """A ready turn (its key and prompt ids), or None when none is ready now."""

    def finished(self, key: Hashable, decoded: Decoded) -> None:
        """The turn `key` decoded."""


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Row:
    key: Hashable
    ids: list[int]
    decoded: Decoded
    states: torch.Tensor | None = None


def speculative_decode_batch(verifier: BatchVerifier | GreedyVerifier, drafter: BatchDrafter, feed: TurnFeed, *,
                             k: int, max_new_tokens: int, stop_ids: Collection[int] = ()) -> None:
    """Greedy speculative decoding of every turn `feed` gives, up to `verifier.rows` at once: each row as
    `speculative_decode` decodes one turn (its own drafts, acceptance and crop; τ counted the same way), the rows'
    chains verified together (`BatchVerifier`: one batched verifying forward; `GreedyVerifier`: against the
    verifier's greedy decode run ahead); a finished row takes the next ready turn (its prefill a forward of its
    own). Returns when no row is busy and no turn is ready."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if max_new_tokens < 1:
        raise ValueError("needs max_new_tokens >= 1")
    if drafter.aux_layers is not None and tuple(drafter.aux_layers) != verifier.aux_layers:
        raise ValueError(f"the drafter reads the verifier's layers {drafter.aux_layers}, the verifier gives "
                         f"{verifier.aux_layers}")
    busy: dict[int, _Row] = {}
    held: dict[int, list[int]] = {}  # a free row's last ids: what its verifier and drafter hold
    drafts: dict[int, list[int]] = {}  # chains proposed and not yet verified

    def finish(r: int) -> None:
        row = busy.pop(r)
        held[r] = row.ids
        feed.finished(row.key, row.decoded)

    while True:
        fresh: dict[int, list[int]] = {}
        free = [r for r in range(verifier.rows) if r not in busy]
        while free:
            turn = feed.next_turn()
            if turn is None:
                break
            key, prompt = turn[0], [int(t) for t in turn[1]]
            if not prompt:
                raise ValueError(f"turn {key!r}: needs a prompt")
            # the free row whose last ids share the longest prefix with the prompt (a question's next turn: its
            # earlier turns): its positions before the last shared token are kept, the rest prefilled
            shared = {r: _shared(held.get(r, ()), prompt) for r in free}
            r = max(free, key=lambda r: (shared[r], -r))
            free.remove(r)
            keep = drafter.start(r, max(shared[r] - 1, 0))
            verifier.reset(r, keep)
            fresh[r] = prompt[keep:]
            busy[r] = _Row(key, list(prompt), Decoded(len(prompt), [], k=k))
        if fresh:
            for r, v in verifier.prefill(fresh).items():
                row = busy[r]
                token = v.best[0]
                row.ids.append(token)
                row.decoded.output_ids.append(token)
                row.states = v.states
                if _stops(token, row.decoded.output_ids, stop_ids, max_new_tokens):
                    finish(r)
            continue  # refill what finished at its first token before verifying
        if not busy:
            return
        waiting = {r: (row.ids, row.states) for r, row in busy.items() if r not in drafts}
        if waiting:
            for r, d in drafter.propose(waiting, k).items():
                if len(d) > k:
                    raise ValueError(f"the drafter proposed {len(d)} tokens, more than k = {k}")
                drafts[r] = d
        # a verifier may answer some chains only (`GreedyVerifier`): the others wait, drafted, for the next round
        verdicts = verifier.verify({r: [row.ids[-1], *drafts[r]] for r, row in busy.items()})
        if not verdicts:
            raise RuntimeError("the verifier answered none of the chains")
        for r, v in verdicts.items():
            row, chain = busy[r], drafts.pop(r)
            a = len(v.best) - 1  # best[:a] are the accepted drafts (chain[:a]), best[a] the bonus
            if v.best[:a] != chain[:a] or (a < len(chain) and chain[a] == v.best[a]):
                raise RuntimeError(f"row {r}: the verifier's verdict {v.best} does not fit the drafts {chain}")
            row.decoded.accepted.append(a)
            row.decoded.drafted.append(len(chain))
            verifier.crop(r, len(row.ids) + a)
            row.states = v.states[:a + 1] if v.states is not None else None
            for token in v.best:
                row.ids.append(token)
                row.decoded.output_ids.append(token)
                if _stops(token, row.decoded.output_ids, stop_ids, max_new_tokens):
                    finish(r)
                    break


@dataclass
class PromptFeed:
    """A fixed list of prompts as a `TurnFeed` (key: the prompt's index); `results()` once decoded."""

    prompts: Sequence[Sequence[int]]
    decoded: dict[int, Decoded] = field(default_factory=dict)
    given: int = 0

    def next_turn(self) -> tuple[Hashable, Sequence[int]] | None:
        if self.given == len(self.prompts):
            return None
        self.given += 1
        return self.given - 1, self.prompts[self.given - 1]

    def finished(self, key: Hashable, decoded: Decoded) -> None:
        self.decoded[int(key)] = decoded  # type: ignore[call-overload]

    def results(self) -> list[Decoded]:
        return [self.decoded[i] for i in range(len(self.prompts))]
