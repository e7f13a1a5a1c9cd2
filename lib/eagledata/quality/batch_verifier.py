"""Several sequences in one forward of a transformers Llama (issue 59 item 3): `RowCache` (each row its own length,
preallocated keys and values read in place by the grouped heads), `BatchVerifier` (the rows' tokens packed through
the projections and MLPs; `forward`, `prefill`, `verify` with the LM head only where a logit is read) and what a
verification answers (`Verification`). The loop that drives it is `batched.py`'s.

Torch only (plus transformers' Llama modules), as `speculative.py`: it runs in both environments.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


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
