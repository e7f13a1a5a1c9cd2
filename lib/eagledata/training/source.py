"""What a backend gives the extraction job (`job.run_extraction`): a description of the verifier, then batches of
(samples, states). Both backends (transformers here, a vLLM server) are such sources; the job owns everything
else (plan, resume, writer, progress, manifest), so a new backend is one class with these five methods."""
from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

from .assembly import Sample
from .storage import FinalState


class StatesBatch(NamedTuple):
    """What a source yields: samples, their states back to back and, when scoring, the verifier's log-probabilities
    of each sample's scored tokens (`scored_positions`: the output tokens after the first position)."""

    samples: list[Sample]
    states: torch.Tensor  # [sum of lengths, 4, H]
    logprobs: list[torch.Tensor] | None = None  # per sample, float32 [len(scored_positions(sample))]
    scoring_s: float | None = None  # time this batch spent scoring, where the source can tell it apart (not vLLM's)


def scored_positions(sample: Sample) -> list[int]:
    """The positions whose token the audit scores: every output token (loss mask 1) that has a context, i.e.
    position >= 1. Its log-probability under the verifier is log p(token[j] | tokens[:j]) at temperature 1."""
    return [j for j, m in enumerate(sample.loss_mask) if m and j]


@dataclass(frozen=True)
class VerifierInfo:
    """The model the states come from, as `plan.json` records it (every run adding to a set must agree)."""

    model: str
    decoder: str  # module path of the text decoder, or `vllm:<architecture>`
    num_layers: int
    hidden_size: int
    vocab_size: int
    compute_dtype: torch.dtype
    plan_extra: dict[str, Any] = field(default_factory=dict)  # more plan keys (the vllm backend: `backend`)


class StateSource(Protocol):
    @property
    def backend(self) -> str:
        """"transformers" | "vllm": a set is continued only by the backend that began it."""

    @property
    def weight_bytes(self) -> int:
        """This process's share of the weights (0 when a server holds them)."""

    def vocab_size(self) -> int:
        """Cheaply, before `open`: the vocabulary every sample's ids must fit."""

    def open(self) -> VerifierInfo:
        """Check what can be checked before the expensive part, then load or connect."""

    def prepare(self, layers: tuple[int, int, int], final: FinalState, score: bool) -> None:
        """Take the resolved aux layers and final state, refusing what this backend cannot deliver (before the
        job writes anything). `score`: every batch must then carry `logprobs` (the provider-fidelity audit)."""

    def batches(self, todo: Sequence[Sample]) -> Iterator[StatesBatch] | AsyncIterator[StatesBatch]:
        """The states of every sample in `todo`, in any order and grouping, each sample exactly once."""

    def manifest_extra(self) -> dict[str, Any]:
        """Keys the manifest adds once the set is complete (the vllm backend's `engine` record)."""


class ComputingSource(StateSource, Protocol):
    """A source that computes in this thread (`job.run_extraction`): `batches` is a generator."""

    def batches(self, todo: Sequence[Sample]) -> Generator[StatesBatch, None, None]:
        """As `StateSource.batches`; closed when the job stops early."""


class ServedSource(StateSource, Protocol):
    """A source that awaits a server (`job.run_extraction_async`): `batches` is an async generator."""

    def batches(self, todo: Sequence[Sample]) -> AsyncGenerator[StatesBatch, None]:
        """As `StateSource.batches`; closed when the job stops early."""
