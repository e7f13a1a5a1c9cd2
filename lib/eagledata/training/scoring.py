"""The verifier's own score of every provider's tokens, taken during extraction (the input of the fidelity audit).

Extraction already runs the verifier over every output token; the log-probability it gives each sampled token is
one more projection of the final state (its LM head). Over a provider's tokens, the mean negative
log-likelihood under the verifier is E_q[-log p] = H(q) + KL(q || p): on the same prompts and sampling settings, an
endpoint serving another model shows a higher mean (`audit.py` tests that). Per sample we keep sufficient
statistics (count, sum, sum of squares, max, a histogram), not the tokens' values: 25 numbers a sample.

The LM head runs on chunks of `chunk_tokens` scored positions, its logits cast to float32 for the log-softmax
chunk by chunk, so [T, vocab] logits never exist for a batch: the extra peak is one chunk's float32 logits and
logsumexp's temporary of the same size (chunk x vocab x 8 bytes; the bf16 logits are freed once cast), about
0.67 GB for K2.5 at 512 tokens, whatever the batch.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..files import atomic_write_text, iter_jsonl
from .assembly import Sample
from .source import scored_positions

# NLL bins (nats): bin k counts tokens with edge[k] <= nll < edge[k+1]; the last bin is open-ended.
HIST_EDGES: tuple[float, ...] = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0,
                                 16.0, 20.0)
DEFAULT_CHUNK_TOKENS = 512
SCORES_FILE = "scores.jsonl"


@dataclass(frozen=True)
class SampleScore:
    """Sufficient statistics of one sample's scored tokens' NLL (-log p under the verifier, temperature 1)."""

    tokens: int
    nll_sum: float
    nll_sumsq: float
    nll_max: float
    hist: tuple[int, ...]  # len(HIST_EDGES) counts

    @property
    def mean_nll(self) -> float:
        return self.nll_sum / self.tokens if self.tokens else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "nll_sum": self.nll_sum, "nll_sumsq": self.nll_sumsq,
                "nll_max": self.nll_max, "hist": list(self.hist)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SampleScore:
        return cls(int(d["tokens"]), float(d["nll_sum"]), float(d["nll_sumsq"]), float(d["nll_max"]),
                   tuple(int(c) for c in d["hist"]))


def score_sample(logprobs: torch.Tensor) -> SampleScore:
    """The statistics of one sample from its scored tokens' log-probabilities (float32 [n])."""
    nll = -logprobs.double()
    if nll.numel() and not bool(torch.isfinite(nll).all()):
        raise ValueError("non-finite log-probabilities")
    edges = torch.tensor(HIST_EDGES, dtype=torch.float64)
    bins = (torch.bucketize(nll.clamp_min(0.0), edges, right=True) - 1).clamp_min(0)
    hist = torch.bincount(bins, minlength=len(HIST_EDGES))
    return SampleScore(int(nll.numel()), float(nll.sum()), float(nll.pow(2).sum()),
                       float(nll.max()) if nll.numel() else 0.0, tuple(int(c) for c in hist.tolist()))


def scored_tokens(samples: Sequence[Sample]) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """For a batch (row i = samples[i]): the (row, position) whose final state predicts each scored token (the
    position before it), the scored token ids, and how many each sample has (`source.scored_positions`)."""
    where: list[tuple[int, int]] = []
    tokens: list[int] = []
    counts: list[int] = []
    for row, s in enumerate(samples):
        positions = scored_positions(s)
        where.extend((row, j - 1) for j in positions)
        tokens.extend(s.input_ids[j] for j in positions)
        counts.append(len(positions))
    return where, tokens, counts


def token_logprobs(final: torch.Tensor, where: Sequence[tuple[int, int]], tokens: Sequence[int],
                   head: torch.nn.Module, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """log p(token | context) for each of `tokens`, float32 [len(tokens)], from `final` [B, T, H] (the post-norm
    final states of a padded batch) at the (row, position) pairs `where`, through the LM head `head`, `chunk_tokens`
    at a time."""
    out = torch.empty(len(tokens), dtype=torch.float32, device=final.device)
    if not len(tokens):
        return out
    rows = torch.tensor([w[0] for w in where], device=final.device)
    cols = torch.tensor([w[1] for w in where], device=final.device)
    ids = torch.tensor(list(tokens), device=final.device)
    for a in range(0, len(tokens), chunk_tokens):
        b = min(a + chunk_tokens, len(tokens))
        logits = head(final[rows[a:b], cols[a:b]]).float()  # [chunk, vocab]
        out[a:b] = logits.gather(1, ids[a:b, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
        del logits
    return out


def batch_scores(samples: Sequence[Sample], logprobs: Sequence[torch.Tensor] | None) -> list[dict[str, Any]]:
    """Each sample's statistics (as its index entry stores them) from a source's `StatesBatch.logprobs`, after
    checking the source scored exactly the scored positions."""
    if logprobs is None or len(logprobs) != len(samples):
        raise RuntimeError(f"the source returned {'no' if logprobs is None else len(logprobs)} log-probability "
                           f"lists for {len(samples)} samples while scoring (a backend bug)")
    out = []
    for s, lp in zip(samples, logprobs):
        n = len(scored_positions(s))
        if lp.numel() != n:
            raise RuntimeError(f"sample {s.id!r}: {lp.numel()} log-probabilities for {n} scored tokens")
        try:
            out.append(score_sample(lp).to_dict())
        except ValueError as e:
            raise RuntimeError(f"sample {s.id!r}: {e} from the verifier") from None
    return out


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The LM head of a loaded causal LM (or of kimi_k25's language model)."""
    get_head = getattr(model, "get_output_embeddings", None)  # a transformers model's
    head = get_head() if get_head is not None else None
    if head is None:
        raise InputError(f"{type(model).__name__} has no LM head (get_output_embeddings): the audit needs it; "
                         "set score=false to extract without scoring", field="score")
    return head


def peak_bytes(chunk_tokens: int, vocab_size: int, compute_bytes: int = 2) -> int:
    """The audit's extra memory at its peak: one chunk's logits in the compute dtype while they are cast to
    float32, or the float32 ones and logsumexp's temporary (x - max, exponentiated in place), whichever is more."""
    return chunk_tokens * vocab_size * max(compute_bytes + 4, 8)


# -- the scores file: one line per scored sample, in set order, written when a set is finalized -------------
@dataclass(frozen=True)
class ScoreRow:
    """One sample of `scores.jsonl`: who produced it and how it was sampled, beside its score."""

    id: str
    dataset: str
    provider: str
    sampling: str  # the generation's sampling settings, canonical JSON ("" when the records do not say)
    score: SampleScore

    def line(self) -> str:
        return json.dumps({"id": self.id, "dataset": self.dataset, "provider": self.provider,
                           "sampling": self.sampling, **self.score.to_dict()}, separators=(",", ":")) + "\n"


def score_rows(samples: Sequence[Sample], scores: Mapping[str, dict[str, Any] | None]) -> list[ScoreRow]:
    """The scored samples' rows in set order (`scores`: id -> the statistics its index entry carries)."""
    return [ScoreRow(s.id, s.dataset, s.provider, s.sampling, SampleScore.from_dict(d))
            for s in samples if (d := scores.get(s.id)) is not None]


def write_scores(directory: Path, rows: Sequence[ScoreRow], total_samples: int) -> dict[str, Any] | None:
    """`scores.jsonl` (atomically) and the manifest's `scoring` record; None (and no file) without rows."""
    if not rows:
        return None
    atomic_write_text(directory / SCORES_FILE, "".join(r.line() for r in rows))
    return {"file": SCORES_FILE, "scored_samples": len(rows), "unscored_samples": total_samples - len(rows),
            "scored_tokens": sum(r.score.tokens for r in rows),
            "mean_nll": sum(r.score.nll_sum for r in rows) / max(1, sum(r.score.tokens for r in rows)),
            "statistic": "-log p(token | context) under the verifier at temperature 1, over each sample's output "
                         "tokens after the first position", "hist_edges": list(HIST_EDGES)}


def read_scores(path: str | Path) -> list[ScoreRow]:
    """`scores.jsonl` of a finished set (its directory, or the file)."""
    path = Path(path)
    if path.is_dir():
        path = path / SCORES_FILE
    if not path.is_file():
        raise InputError("no scores: the set was extracted with score=false, or is not finished", path)
    return list(_rows(path))


def _rows(path: Path) -> Iterator[ScoreRow]:
    for line_no, d in iter_jsonl(path):  # a line that is not JSON: the shared reader's error, naming file:line
        try:
            yield ScoreRow(str(d["id"]), d.get("dataset", ""), d.get("provider", ""), d.get("sampling", ""),
                           SampleScore.from_dict(d))
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"not a score line ({type(e).__name__}: {e})", path, line_no) from None


# -- acting on the audit: samples an export leaves out ---------------------------------------------------
@dataclass(frozen=True)
class ExcludeSamples:
    """What an export (`convert`) leaves out of a set, and why; the export's manifest records it under `excluded`.

    `providers`: every sample they served (a suspect provider); `max_sample_nll`: samples whose mean NLL per
    scored token is above it (garbage, a wrong model); `ids`: named samples (the audit's outliers)."""

    providers: tuple[str, ...] = ()
    max_sample_nll: float | None = None
    ids: tuple[str, ...] = ()
    reason: str = ""  # the evidence, in words (the audit's verdict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", tuple(sorted(set(self.providers))))
        object.__setattr__(self, "ids", tuple(sorted(set(self.ids))))
        if self.max_sample_nll is not None and not self.max_sample_nll > 0:
            raise InputError(f"must be > 0, got {self.max_sample_nll!r}", field="max_sample_nll")

    @property
    def needs_scores(self) -> bool:
        return bool(self.providers) or self.max_sample_nll is not None

    def rule(self) -> dict[str, Any]:
        """The rule as the export's plan holds it: a resume must apply the same one."""
        return {"providers": list(self.providers), "max_sample_nll": self.max_sample_nll, "ids": list(self.ids)}

    def decide(self, sample_ids: Sequence[str], rows: Sequence[ScoreRow]) -> dict[str, str]:
        """id -> why, for each sample of `sample_ids` left out (pure). A provider or an NLL bound needs every
        sample's score: an unscored one cannot be judged and is refused, not kept silently."""
        by_id = {r.id: r for r in rows}
        unknown = sorted(set(self.ids) - set(sample_ids))
        if unknown:
            raise InputError(f"{len(unknown)} excluded ids are not in the set (first: {unknown[0]!r})", field="ids")
        out: dict[str, str] = {}
        for i in sample_ids:
            row = by_id.get(i)
            if self.needs_scores and row is None:
                raise InputError(f"sample {i!r} has no score, so exclude_providers/max_sample_nll cannot judge it "
                                 "(extract with score=true)", field="exclude")
            if i in self.ids:
                out[i] = "listed"
            elif row is not None and row.provider in self.providers:
                out[i] = f"provider {row.provider}"
            elif self.max_sample_nll is not None and row is not None and row.score.mean_nll > self.max_sample_nll:
                out[i] = "max_sample_nll"
        return out

    def record(self, left_out: Mapping[str, str]) -> dict[str, Any]:
        """The manifest's `excluded`: the rule, the reason, and which samples went for which part of it."""
        counts: dict[str, int] = {}
        for why in left_out.values():
            counts[why] = counts.get(why, 0) + 1
        return {**self.rule(), "reason": self.reason, "samples": len(left_out), "by": dict(sorted(counts.items())),
                "excluded_ids": sorted(left_out)}


# -- what it costs at K2.5's scale (by the FLOP count) ----------------------------------------------------
def decoder_parameters(config: dict[str, Any]) -> int:
    """Parameters one token passes through in the decoder layers (routed experts: only those it is sent to), from
    a Llama or DeepseekV3/kimi_k25 config; the embedding (a lookup) and the LM head are not counted."""
    c = config.get("text_config") or config
    h, layers, heads = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    if c.get("kv_lora_rank"):  # MLA
        qk = int(c["qk_nope_head_dim"]) + int(c["qk_rope_head_dim"])
        q_lora = c.get("q_lora_rank")
        q = h * int(q_lora) + int(q_lora) * heads * qk if q_lora else h * heads * qk
        kv = h * (int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) + \
            int(c["kv_lora_rank"]) * heads * (int(c["qk_nope_head_dim"]) + int(c["v_head_dim"]))
        attention = q + kv + heads * int(c["v_head_dim"]) * h
    else:
        head_dim = int(c.get("head_dim") or h // heads)
        kv_heads = int(c.get("num_key_value_heads") or heads)
        attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    dense_mlp = 3 * h * int(c["intermediate_size"])
    routed = c.get("n_routed_experts")
    if not routed:
        return layers * (attention + dense_mlp)
    dense = int(c.get("first_k_dense_replace", 0))
    active = int(c["num_experts_per_tok"]) + int(c.get("n_shared_experts") or 0)
    moe = active * 3 * h * int(c["moe_intermediate_size"]) + h * int(routed)  # experts + router
    return dense * (attention + dense_mlp) + (layers - dense) * (attention + moe)


def audit_cost(config: dict[str, Any], chunk_tokens: int = DEFAULT_CHUNK_TOKENS, compute_bytes: int = 2
               ) -> dict[str, Any]:
    """The audit's added work per scored token ÷ the forward's per token, and its extra peak memory.

    Added: the LM head (2·H·V multiply-adds) and the float32 log-softmax (~5·V). Forward: 2 FLOPs per decoder
    parameter a token passes (attention over the context is left out, so the ratio is an upper bound)."""
    c = config.get("text_config") or config
    h, v = int(c["hidden_size"]), int(c["vocab_size"])
    added = 2 * h * v + 5 * v
    forward = 2 * decoder_parameters(config)
    return {"added_flops_per_token": added, "forward_flops_per_token": forward, "ratio": added / forward,
            "decoder_parameters": forward // 2, "peak_bytes": peak_bytes(chunk_tokens, v, compute_bytes),
            "chunk_tokens": chunk_tokens}
