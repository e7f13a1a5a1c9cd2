"""An EAGLE-3 drafter as speculators 0.9.0 trains and saves it, drafting chains for `speculative.py`.

speculators pins transformers<=5.19, so its classes load in its own environment (`.venv-interop`): `load_eagle3`
imports it there, and `measure.py` runs the whole τ measurement in that environment for this drafter. The drafting
itself is written here, from the trainer's forward (`speculators/models/eagle3/core.py` and `data.py`):

- row j of the drafter reads the verifier's aux states at position j (the checkpoint's
  `eagle_aux_hidden_state_layer_ids`, HF `hidden_states` indices, concatenated, through `input_norm`/`fc_norm` when
  configured, then `fc`) and the embedding of token j + 1, at position id j + 1, and predicts token j + 2 in the
  draft vocabulary (the verifier's id = index + `d2t[index]`);
- step s of the chain reads the previous step's output (pre-norm, or normed when `norm_output`) in place of
  `fc(aux)`, the embedding of the token drafted last, one position further, and attends to the rows of the verified
  positions and to the chain's earlier steps: the trainer's mask (causal over step 0, plus the diagonal of each
  later step) is exactly that, so a KV cache over verified rows plus the chain is the same computation;
- a sliding-window layer (speculators' default: every draft layer, window 2,048) sees the verified rows within the
  window of the chain's anchor, the last verified row (`attention_mask`), as the trainer's mask counts it.

Verified rows are computed once from the verifier's real states and kept; the chain's rows are cropped after each
verification. `tests/quality/test_eagle3_interop.py` holds every step's logits to speculators' own forward (the
window binding or not) on a checkpoint its trainer saved.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .batch_verifier import RowCache
from .speculative import crop_cache, new_cache


def load_eagle3(checkpoint: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """speculators' `Eagle3DraftModel` from a checkpoint folder (needs the speculators environment; the verifier
    the checkpoint's config names must be readable, for its embeddings), its attention set to SDPA before it is
    built, as speculators' trainer does for `--draft-attn-impl sdpa` (HF configs never save the attention
    implementation; speculators' default, flex attention, wants an accelerator), in `dtype` (float32: its trainer
    saves bf16 weights, which widen exactly, and the verifier runs in float32 on CPU)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(checkpoint))
    config.transformer_layer_config._attn_implementation = "sdpa"
    return Eagle3DraftModel.from_pretrained(str(checkpoint), config=config, dtype=dtype).eval()


def random_layers(model: Any, seed: int = 0) -> Any:
    """The EAGLE-3 drafter with no training: the checkpoint's `fc` and decoder layers drawn at random (every matrix
    N(0, 0.02), speculators' initializer range; biases and norms kept), its embeddings, LM head, norms and draft
    vocabulary kept, so it runs through the same EAGLE-3 path (`Eagle3Drafter`) as the trained one. In place;
    returns `model`. The baseline a trained drafter must beat for its training to count."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in [model.fc, *model.layers]:
            for p in module.parameters():
                if p.dim() >= 2:
                    torch.nn.init.normal_(p, std=0.02)
    return model


def attention_mask(queries: Sequence[int] | torch.Tensor, anchors: Sequence[int] | torch.Tensor, keys: int,
                   window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """The trainer's mask for rows at cache indices `queries` over `keys` cached rows, additive [1, 1, n, keys]
    (or [B, 1, n, keys] for [B, n] tensors of queries and anchors, each of B rows over its own cache).

    A row sees the verified rows up to its anchor (itself for a verified row, the last verified row for a chain
    step: the trainer's q_idx), within `window` of the anchor for a sliding-window layer, and the chain's rows after
    the anchor up to itself (the trainer's diagonal blocks)."""
    q = torch.as_tensor(queries)
    anchor = torch.as_tensor(anchors)
    if q.dim() == 1:
        q, anchor = q[None], anchor[None]
    q, anchor = q[..., None], anchor[..., None]
    kv = torch.arange(keys)[None, None, :]
    seen = kv <= anchor
    if window is not None:
        seen &= kv > anchor - window
    allowed = seen | ((kv > anchor) & (kv <= q))
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


class Eagle3Drafter:
    """speculators' EAGLE-3 drafter (a loaded `Eagle3DraftModel`, or any module with its parts) behind the
    `Drafter` seam. Its attention runs as SDPA with an explicit mask (the trainer's flex attention computes the same
    scores; the model's config is set to "sdpa" for that)."""

    def __init__(self, model: Any):
        self.model = model.eval()
        config = model.config
        self.aux_layers: tuple[int, ...] = tuple(int(i) for i in config.eagle_aux_hidden_state_layer_ids)
        layer_config = config.transformer_layer_config
        layer_config._attn_implementation = "sdpa"
        types = getattr(layer_config, "layer_types", None) or ["full_attention"] * len(model.layers)
        # speculators' default: every draft layer a sliding-window one (2,048), the window applied by the mask
        self.windows = [layer_config.sliding_window if t == "sliding_attention" else None for t in types]
        self.norm_output = bool(getattr(config, "norm_output", False))
        self.dtype = next(model.parameters()).dtype
        d2t = getattr(model, "d2t", None)
        self.d2t = d2t if d2t is not None and getattr(model, "use_draft_vocab", True) else None
        self.cache: Any = None
        self.rows = 0  # verified rows in the cache

    def start(self) -> None:
        self.cache, self.rows = new_cache(), 0

    def features(self, states: torch.Tensor) -> torch.Tensor:
        """The verifier's aux states → the drafter's step-0 hidden input (`fc` after the configured norms)."""
        m = self.model
        x = states.to(self.dtype)
        if getattr(m, "input_norm", None) is not None:
            x = m.input_norm(x)
        if getattr(m, "fc_norm", None) is not None:
            x = torch.cat([norm(c) for norm, c in zip(m.fc_norm, x.chunk(len(m.fc_norm), dim=-1))], dim=-1)
        return m.fc(x)

    def rows_forward(self, tokens: Sequence[int], hidden: torch.Tensor, first_row: int, anchor: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows first_row … first_row + n − 1 appended to the cache: (their hidden outputs [n, H], logits [n, D]).
        `anchor`: the last verified row, for chain steps (verified rows are their own anchors)."""
        m, n = self.model, len(tokens)
        embeds = m.embed_tokens(torch.tensor([list(tokens)]))
        x = torch.cat([embeds.to(self.dtype), hidden[None].to(self.dtype)], dim=-1)
        positions = torch.arange(first_row + 1, first_row + 1 + n)[None]
        position_embeddings = m.rotary_emb(x, positions)
        rows = range(first_row, first_row + n)
        anchors = list(rows) if anchor is None else [anchor] * n
        masks = {w: attention_mask(rows, anchors, first_row + n, w, self.dtype) for w in set(self.windows)}
        cache_position = torch.arange(first_row, first_row + n)
        for layer, window in zip(m.layers, self.windows):
            x = layer(x, attention_mask=masks[window], position_ids=positions, past_key_values=self.cache,
                      cache_position=cache_position, position_embeddings=position_embeddings)
        if self.norm_output:
            x = m.norm(x)
            logits = m.lm_head(x)
        else:
            logits = m.lm_head(m.norm(x))
        return x[0], logits[0]

    def verifier_id(self, draft_index: int) -> int:
        return draft_index + int(self.d2t[draft_index]) if self.d2t is not None else draft_index

    @torch.no_grad()
    def chain(self, ids: Sequence[int], states: torch.Tensor, k: int,
              forced: Sequence[int] | None = None) -> list[int]:
        """Verified rows for the new `states`, then k draft tokens (the verifier's ids). `forced` (tests): the tokens
        each later step reads instead of the one just drafted, as the trainer's teacher forcing does."""
        n = states.shape[0]
        first = len(ids) - 1 - n  # the position of the first new state
        if first != self.rows:
            raise ValueError(f"states for positions {first}…: the drafter holds rows up to {self.rows}")
        crop_cache(self.cache, self.rows)
        # row j reads the state at position j and the token at j + 1
        hidden, logits = self.rows_forward(ids[first + 1:], self.features(states), first) if n else (None, None)
        if hidden is None or logits is None:
            raise ValueError("no new verified position to draft from")
        self.rows += n
        drafts = [self.verifier_id(int(logits[-1].argmax()))]
        last = hidden[-1:]
        for s in range(1, k):
            token = drafts[-1] if forced is None else forced[s - 1]
            last, logits = self.rows_forward([token], last, self.rows - 1 + s, anchor=self.rows - 1)
            drafts.append(self.verifier_id(int(logits[-1].argmax())))
        return drafts

    def propose(self, ids: Sequence[int], states: torch.Tensor | None, k: int) -> list[int]:
        if states is None:
            raise ValueError("an EAGLE-3 drafter needs the verifier's aux states")
        return self.chain(ids, states, k)


GROUPED = "eagledata_grouped"


def grouped_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface (query [B, heads, n, D], key and value [B, kv heads, S, D], an additive
    mask [B, 1, n, S]) computed as SDPA's math computes it, but each key/value head read in place by its group of
    query heads together, where SDPA on CPU first copies it once per query head (`repeat_kv`). Registered as
    `GROUPED`; `BatchEagle3Drafter` runs its layers with it."""
    b, heads, n, d = query.shape
    kv, span = key.shape[1], key.shape[2]
    group = heads // kv
    scale = d ** -0.5 if scaling is None else scaling
    scores = torch.bmm(query.reshape(b * kv, group * n, d), key.reshape(b * kv, span, d).transpose(1, 2))
    scores = scores.view(b, kv, group, n, span) * scale
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, :span]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.bmm(weights.view(b * kv, group * n, span), value.reshape(b * kv, span, d))
    return out.view(b, heads, n, d).transpose(1, 2).contiguous(), None


class BatchEagle3Drafter:
    """`Eagle3Drafter` for several rows at once (a `BatchDrafter`): one drafter model, each row's drafter rows
    (verified and chain) at its own cache slots (`RowCache`), and every step of the chain one forward of the
    drafter's layers for all the rows (their new verified rows first, padded to the longest; then one token per row
    a step; attention by `grouped_attention`), where `PerRow` of `Eagle3Drafter` runs one forward per row and step.
    Each row drafts what its own `Eagle3Drafter` drafts: the same rows, positions, masks (`attention_mask`, per
    row) and steps, batched."""

    def __init__(self, model: Any, rows: int):
        from transformers import AttentionInterface

        AttentionInterface.register(GROUPED, grouped_attention)
        self.one = Eagle3Drafter(model)  # the configuration, `features` and the draft vocabulary
        self.model = self.one.model
        self.aux_layers = self.one.aux_layers
        self.cache = RowCache(rows)
        self.verified = [0] * rows  # verified rows each row holds; its chain's rows follow them

    def start(self, row: int, keep: int = 0) -> int:
        """A new sequence in `row`: its drafter rows before `keep` kept (each row j read the state at position j and
        token j + 1, all before the new sequence's first difference), as many as it holds."""
        self.verified[row] = min(self.verified[row], keep)
        return self.verified[row]

    def _forward(self, feed: Mapping[int, tuple[Sequence[int], torch.Tensor, int, int | None]]
                 ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """`feed[row]` = (tokens, their hidden inputs [n, H], the first row's cache index, the chain's anchor or
        None for verified rows) in one forward of the drafter's layers: per row, (the hidden outputs [n, H] as the
        chain carries them, the last row's logits [D])."""
        m, one = self.model, self.one
        order = sorted(feed)
        sizes = [len(feed[r][0]) for r in order]
        n, width = len(order), max(sizes)
        tokens = torch.zeros(n, width, dtype=torch.long)
        hidden = torch.zeros(n, width, feed[order[0]][1].shape[-1], dtype=one.dtype)
        for i, r in enumerate(order):
            tokens[i, :sizes[i]] = torch.tensor(list(feed[r][0]))
            hidden[i, :sizes[i]] = feed[r][1].to(one.dtype)
        firsts = torch.tensor([feed[r][2] for r in order])
        slots = firsts[:, None] + torch.arange(width)[None]  # padding: past the row's rows, masked, overwritten
        chain_anchors = [feed[r][3] for r in order]
        anchors = torch.stack([slots[i] if a is None else torch.full((width,), a) for i, a in enumerate(chain_anchors)])
        span = int(slots.max()) + 1
        x = torch.cat([m.embed_tokens(tokens).to(one.dtype), hidden], dim=-1)
        positions = slots + 1
        position_embeddings = m.rotary_emb(x, positions)
        masks = {w: attention_mask(slots, anchors, span, w, one.dtype) for w in set(one.windows)}
        self.cache.write = (torch.tensor(order)[:, None], slots)
        self.cache.span = span
        configs = [layer.self_attn.config for layer in m.layers]
        kept = [c._attn_implementation for c in configs]
        try:
            for c in configs:
                c._attn_implementation = GROUPED
            for layer, window in zip(m.layers, one.windows):
                x = layer(x, attention_mask=masks[window], position_ids=positions, past_key_values=self.cache,
                          position_embeddings=position_embeddings)
        finally:
            self.cache.write = None
            for c, implementation in zip(configs, kept):
                c._attn_implementation = implementation
        if one.norm_output:
            x = m.norm(x)
        last = torch.stack([x[i, size - 1] for i, size in enumerate(sizes)])
        logits = m.lm_head(last if one.norm_output else m.norm(last))
        return {r: (x[i, :sizes[i]], logits[i]) for i, r in enumerate(order)}

    @torch.no_grad()
    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        """Each row's verified rows for its new states, then k draft tokens (the verifier's ids), as
        `Eagle3Drafter.propose` drafts them row by row."""
        feed = {}
        for r, (ids, states) in rows.items():
            if states is None:
                raise ValueError("an EAGLE-3 drafter needs the verifier's aux states")
            n = states.shape[0]
            first = len(ids) - 1 - n
            if first != self.verified[r]:
                raise ValueError(f"row {r}: states for positions {first}…: the drafter holds rows up to "
                                 f"{self.verified[r]}")
            if not n:
                raise ValueError(f"row {r}: no new verified position to draft from")
            feed[r] = (list(ids[first + 1:]), states, first)
        order = sorted(feed)
        features = self.one.features(torch.cat([feed[r][1] for r in order])).split(
            [feed[r][1].shape[0] for r in order])
        out = self._forward({r: (feed[r][0], features[i], feed[r][2], None) for i, r in enumerate(order)})
        drafts: dict[int, list[int]] = {}
        last: dict[int, torch.Tensor] = {}
        for r in order:
            self.verified[r] += len(feed[r][0])
            drafts[r] = [self.one.verifier_id(int(out[r][1].argmax()))]
            last[r] = out[r][0][-1:]
        for s in range(1, k):
            out = self._forward({r: ([drafts[r][-1]], last[r], self.verified[r] - 1 + s, self.verified[r] - 1)
                                 for r in order})
            for r in order:
                drafts[r].append(self.one.verifier_id(int(out[r][1].argmax())))
                last[r] = out[r][0]
        return drafts
