"""The extraction job: settings, result, and the one skeleton both backends run through.

`run_extraction` (and `run_extraction_async`, for a source that awaits a server) does the same steps for every
backend: validate the settings and samples → let the source check and open the verifier → resolve the layers
and write or check `plan.json` → open the layout's writer → resume (skip what the index parts list) → store
each batch the source yields, with progress → finalize (index + manifest) once the set is complete. A backend
is a `source.StateSource`: the transformers one computes here (`transformers_backend`), the vLLM one asks a
server (`vllm_backend`). `extract` and `extract_with_vllm` are the two ready-made calls; `config.ExtractionJob`
(hidden_states.ipynb's and the command's settings) picks one.

Work is split by a hash of the sample id (`owner`), so a resume with another batch size or world size skips
exactly what is stored.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import aclosing, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..aio import run_sync
from ..errors import InputError
from ..files import make_dir
from ..paths import HiddenStateFiles, hidden_state_files
from ..settings import Settings, setting
from ..status import StatusLog, duration, ensure_log_handler, eta_s, widget_frontend
from .assembly import Sample
from .layers import resolve_layers
from .memory import Devices, memory_in_use
from .models import load_model
from .scoring import DEFAULT_CHUNK_TOKENS, batch_scores, score_rows, write_scores
from .source import ComputingSource, ServedSource, StatesBatch, StateSource, VerifierInfo
from .storage import (
    STORAGE_DTYPES,
    FinalState,
    Layout,
    LayoutName,
    StateWriter,
    Storage,
    check_plan,
    check_stored,
    finalize,
    get_layout,
    read_parts,
)
from .transformers_backend import ModelLoader, TransformersSource
from .vllm_backend import VllmOptions, VllmSource, public_url

if TYPE_CHECKING:
    import httpx


# -- settings ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExtractOptions(Settings):
    """What to capture and how to store it (the notebook's and the command's settings)."""

    layers: list[int] | None = setting(None, "three HF hidden_states indices; None -> EAGLE-3 rule {2, L//2, L-3}")
    layout: LayoutName = setting("eagledata", "eagledata (shards), speculators (Arrow dataset + hs_{i} files) "
                                              "or specforge (a torch file per sample)")
    final: FinalState | None = setting(None, "post_norm or pre_norm; None -> the layout's trainer convention "
                                             "(post_norm for eagledata)")
    storage: Storage = setting("bf16", "bf16 (8*H bytes/token), fp8 (e4m3 + per-token scale, 4*H + 16; "
                                       "eagledata layout only) or fp32")
    max_tokens_per_batch: int = setting(16_384, "padded tokens (rows x longest) per forward")
    max_batch_size: int | None = setting(None, "rows per forward; None -> as many as the token budget allows")
    shard_bytes: int = setting(1 << 30, "states are written (a shard, or a batch of per-sample files) once "
                                        "they reach this size")
    score: bool = setting(True, "score every output token under the verifier while extracting (scores.jsonl, "
                                "the provider-fidelity audit's input; ~4 % of a K2.5 forward)")
    score_chunk_tokens: int = setting(DEFAULT_CHUNK_TOKENS, "transformers backend: scored tokens per LM-head chunk "
                                                            "(extra peak: chunk x vocab x 8 bytes)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score_chunk_tokens < 1:
            raise InputError(f"must be a positive integer, got {self.score_chunk_tokens!r}",
                             field="score_chunk_tokens")

    def resolved_final(self, layout: Layout | None = None) -> FinalState:
        """`final`, else the layout's trainer convention (`layout`: the already looked-up `self.layout`)."""
        return self.final or (layout or get_layout(self.layout)).final or "post_norm"

    def convention_mismatch(self) -> str | None:
        """Why an explicit `final` will mislead the layout's trainer (None when it agrees)."""
        layout = get_layout(self.layout)
        if self.final is None or layout.final is None or self.final == layout.final:
            return None
        return (f"final={self.final}, but {self.layout}'s trainer expects {layout.final} as the last state "
                f"({layout.about})")


@dataclass(kw_only=True)
class ExtractResult:
    directory: Path
    rank: int
    world_size: int
    tp: int = 1
    weight_bytes: int = 0  # this process's share of the weights (tensor parallel: about 1/tp of the sharded ones)
    extracted: int  # samples this call computed (and wrote: 0 on a tensor-parallel group's other ranks)
    skipped: int  # samples already stored (resume)
    tokens: int
    seconds: float
    complete: bool  # every sample of the set is stored and the manifest is written
    manifest: dict[str, Any] | None = None


# -- the world (who does what) -----------------------------------------------------------------------
def owner(sample_id: str, world_size: int) -> int:
    """The rank that extracts a sample: by id, so any world size agrees on who did what."""
    return int.from_bytes(hashlib.sha1(sample_id.encode()).digest()[:8], "big") % world_size


def torchrun_world() -> tuple[int, int]:
    """(rank, world size) as torchrun sets them; (0, 1) in a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@dataclass(frozen=True)
class World:
    """This process in the world: `size // tp` data-parallel copies of `tp` tensor-parallel ranks (consecutive
    ranks form a copy). Each copy takes the samples whose id hashes to it; only its first rank writes."""

    rank: int = 0
    size: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise InputError(f"rank {self.rank} outside world size {self.size}", field="rank")
        if self.tp < 1 or self.size % self.tp:
            raise InputError(f"tp={self.tp} does not divide the world size {self.size} (the world is dp × tp)",
                             field="tp")

    @property
    def dp(self) -> int:
        return self.size // self.tp

    @property
    def writes(self) -> bool:
        """The other ranks of a tensor-parallel copy compute the same states: only the first one stores them."""
        return self.rank % self.tp == 0

    def owns(self, sample: Sample) -> bool:
        return owner(sample.id, self.dp) == self.rank // self.tp

    def finalizes_after_barrier(self) -> bool:
        """After every rank's batches: wait for the others, then say whether this rank writes the manifest.

        One process group over the world: its rank 0, after a barrier. One group per tensor-parallel copy
        (dp > 1 and tp > 1): each copy's writer tries, and the last to finish finds the set complete (finalize
        is deterministic, so two that race write the same bytes)."""
        distributed = self.size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed:
            torch.distributed.barrier()
        whole_world = distributed and torch.distributed.get_world_size() == self.size
        return self.rank == 0 if whole_world else self.writes


# -- checks and the plan (pure but for the files they read) ---------------------------------------------
def check_samples(samples: Sequence[Sample], vocab_size: int) -> None:
    """Refuse bad input before any compute: duplicate ids, ids the model cannot embed, bad masks."""
    seen: set[str] = set()
    for s in samples:
        if s.id in seen:
            raise InputError(f"sample id {s.id!r} appears twice", field="id")
        seen.add(s.id)
        if not s.input_ids or len(s.input_ids) != len(s.loss_mask):
            raise InputError(f"sample {s.id!r}: input_ids and loss_mask must be non-empty and of equal length")
        bad = [i for i in s.input_ids if not 0 <= i < vocab_size]
        if bad:
            raise InputError(f"sample {s.id!r} ({s.dataset or 'no dataset'}): token ids {bad[:5]} outside the "
                             f"model's vocabulary (0..{vocab_size - 1})", field="input_ids")


def check_backend(files: HiddenStateFiles, backend: str) -> None:
    """A set is made by one backend: resuming it with the other would mix their roundings and conventions."""
    if files.plan.is_file():
        old = json.loads(files.plan.read_text()).get("backend", "transformers")
        if old != backend:
            raise InputError(f"{files.directory} was made by the {old} backend, not {backend}; use another name",
                             files.plan, field="backend")


def plan_doc(verifier: VerifierInfo, layers: Sequence[int], options: ExtractOptions, layout: Layout) -> dict[str, Any]:
    """`plan.json`: what every run adding to a set must share (either backend)."""
    return {"model": verifier.model, "layout": layout.name, "decoder": verifier.decoder,
            "num_layers": verifier.num_layers, "layers": list(layers), "final": options.resolved_final(layout),
            "dtype": str(STORAGE_DTYPES[options.storage]).replace("torch.", ""), "storage": options.storage,
            "hidden_size": verifier.hidden_size, "vocab_size": verifier.vocab_size,
            "compute_dtype": str(verifier.compute_dtype).replace("torch.", ""), **verifier.plan_extra}


# -- progress --------------------------------------------------------------------------------------------
class Progress:
    """A widget bar in JupyterLab, else a status line through logging every `interval_s` (at batch ends): tokens/s,
    samples done, ETA, memory in use per device, and the share of the time spent scoring (the audit's
    log-probabilities, where the source can tell it apart)."""

    def __init__(self, name: str, where: str, desc: str, total_tokens: int, total_samples: int, *, show: bool,
                 interval_s: float, memory: Callable[[], list[tuple[str, int, int]]] = memory_in_use):
        self.name, self.where = name, where
        self.total, self.samples_total = total_tokens, total_samples
        self.tokens = self.samples = 0
        self.scored = False                   # a batch came with log-probabilities
        self.scoring_s: float | None = None   # time spent scoring them, where the source timed it
        self.memory = memory
        self.start = time.perf_counter()
        self._postfix_at = -math.inf
        self.bar = self.status = None
        if show and widget_frontend():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_tokens, unit="tok", desc=desc)
        elif show:
            ensure_log_handler()
            self.status = StatusLog(interval_s, "eagledata.hidden_states")

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def health(self) -> str:
        """`memory cuda:0 61.2/80.0 GB, … | scoring 14% of the time` (or `scoring in the server's forward`)."""
        memory = ", ".join(f"{d} {used / 1e9:,.1f}/{total / 1e9:,.1f} GB" for d, used, total in self.memory())
        if self.scoring_s is None:
            scoring = "no scoring" if not self.scored else "scoring in the server's forward (not timed apart)"
        else:
            scoring = f"scoring {100 * self.scoring_s / max(self.seconds, 1e-9):.0f}% of the time"
        return f"memory {memory} | {scoring}"

    def line(self) -> str:
        elapsed = self.seconds
        share = 100 * self.tokens / self.total if self.total else 100.0
        return (f"hidden states {self.name} {self.where}: {self.tokens:,}/{self.total:,} tokens ({share:.1f}%), "
                f"{self.samples:,}/{self.samples_total:,} samples | {self.tokens / max(elapsed, 1e-9):,.0f} tok/s | "
                f"ETA {duration(eta_s(self.tokens, self.total, elapsed))} | {self.health()}")

    def advance(self, tokens: int, samples: int, *, scored: bool = False, scoring_s: float | None = None) -> None:
        self.tokens += tokens
        self.samples += samples
        self.scored = self.scored or scored
        if scoring_s is not None:
            self.scoring_s = (self.scoring_s or 0.0) + scoring_s
        if self.bar is not None:
            self.bar.update(tokens)
            if self.seconds - self._postfix_at >= 1.0:  # the memory reading is not free: once a second
                self._postfix_at = self.seconds
                self.bar.set_postfix_str(f"{self.samples:,}/{self.samples_total:,} samples | {self.health()}")
        if self.status is not None:
            self.status.maybe(self.line)

    def close(self, finished: bool) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.samples:,}/{self.samples_total:,} samples | {self.health()}")
            self.bar.close()
        if finished and self.status is not None:
            self.status.emit(self.line() + f" | ended after {duration(self.seconds)}")


# -- the skeleton ------------------------------------------------------------------------------------------
@dataclass
class _Run:
    """One extraction between the skeleton's steps (`run_extraction` drives it)."""

    source: StateSource
    samples: Sequence[Sample]
    files: HiddenStateFiles
    world: World
    tokenizer_fingerprint: str
    records_hashes: dict[str, str] | None
    on_batch: Callable[[int], None] | None
    score: bool
    writer: StateWriter
    assembly: dict[str, Any] | None = None  # the assembly's provenance (e.g. providers left out), for the manifest
    todo: list[Sample] = field(default_factory=list)
    skipped: int = 0
    progress: Progress | None = None  # None only when `finished` (nothing to do)
    batches: int = 0

    @classmethod
    def start(cls, source: StateSource, samples: Sequence[Sample], files: HiddenStateFiles, options: ExtractOptions,
              world: World, *, where: str, desc: str, progress: bool, status_interval_s: float,
              tokenizer_fingerprint: str, records_hashes: dict[str, str] | None,
              on_batch: Callable[[int], None] | None, assembly: dict[str, Any] | None = None) -> _Run:
        """Validate → open the verifier → plan → check → writer → resume; everything refusable is refused here,
        before the first state is computed."""
        layout = get_layout(options.layout)
        layout.check_storage(options.storage)
        check_samples(samples, source.vocab_size())
        verifier = source.open()
        layers = resolve_layers(options.layers, verifier.num_layers)
        source.prepare(layers, options.resolved_final(layout), score=options.score)
        make_dir(files.parts, "output_dir")  # inside files.directory
        check_backend(files, source.backend)
        check_plan(files, plan_doc(verifier, layers, options, layout))
        part = files.parts / f"r{world.rank}-of-{world.size}-{uuid.uuid4().hex[:8]}.jsonl"
        writer = layout.writer(files, part, options.storage, options.shard_bytes, verifier.hidden_size,
                               {s.id: i for i, s in enumerate(samples)})
        done = read_parts(files)
        check_stored(files, writer, samples, done)
        # A copy's ranks agree on `done` for the copy's own samples: only its first rank writes them, and only
        # after a forward every rank of the copy takes part in.
        mine = [s for s in samples if world.owns(s)]
        todo = [s for s in mine if s.id not in done]
        run = cls(source, samples, files, world, tokenizer_fingerprint, records_hashes, on_batch, options.score,
                  writer, assembly, todo, len(mine) - len(todo))
        if not run.finished:
            run.progress = Progress(files.directory.name, where, desc, sum(len(s) for s in todo), len(todo),
                                    show=progress, interval_s=status_interval_s)
        return run

    @property
    def finished(self) -> bool:
        """Nothing to do and the manifest written earlier: the source is not asked for anything (one process;
        under torchrun every rank must reach the barrier)."""
        return not self.todo and self.world.size == 1 and self.files.manifest.is_file()

    def earlier_result(self) -> ExtractResult:
        self.writer.close()
        return ExtractResult(directory=self.files.directory, rank=0, world_size=1, tp=self.world.tp,
                             weight_bytes=self.source.weight_bytes, extracted=0, skipped=self.skipped, tokens=0,
                             seconds=0.0, complete=True, manifest=json.loads(self.files.manifest.read_text()))

    def add(self, batch: StatesBatch) -> None:
        assert self.progress is not None, "a run with work to do has its progress (start)"
        samples, states = batch.samples, batch.states
        if self.world.writes:
            self.writer.add(samples, states, batch_scores(samples, batch.logprobs) if self.score else None)
        self.batches += 1
        self.progress.advance(states.shape[0], len(samples), scored=batch.logprobs is not None,
                              scoring_s=batch.scoring_s)
        if self.on_batch is not None:
            self.on_batch(self.batches)

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        """However the batches end, what was added is written (a rerun resumes after it)."""
        assert self.progress is not None, "a run with work to do has its progress (start)"
        try:
            self.writer.flush()
        finally:
            self.writer.close()
            self.progress.close(finished=exc_type is None)

    def finish(self) -> ExtractResult:
        """Finalize once the set is complete (whichever rank or call finds it so)."""
        assert self.progress is not None, "a run with work to do has its progress (start)"
        seconds = self.progress.seconds
        manifest = None
        if self.world.finalizes_after_barrier():
            done = read_parts(self.files)
            extra = self.source.manifest_extra()
            if self.assembly is not None:
                extra["assembly"] = self.assembly
            if all(s.id in done for s in self.samples):  # complete: the scores file goes before the manifest
                rows = score_rows(self.samples, {i: e.score for i, e in done.items()})
                extra["scoring"] = write_scores(self.files.directory, rows, len(self.samples))
            manifest = finalize(self.files, self.samples, tokenizer_fingerprint=self.tokenizer_fingerprint,
                                records_hashes=self.records_hashes, extra=extra, done=done)
        writes = self.world.writes
        return ExtractResult(directory=self.files.directory, rank=self.world.rank, world_size=self.world.size,
                             tp=self.world.tp, weight_bytes=self.source.weight_bytes,
                             extracted=len(self.todo) if writes else 0, skipped=self.skipped if writes else 0,
                             tokens=self.progress.total, seconds=seconds, complete=manifest is not None,
                             manifest=manifest)


def run_extraction(source: ComputingSource, samples: Sequence[Sample], files: HiddenStateFiles, options: ExtractOptions,
                   world: World = World(), **kwargs: Any) -> ExtractResult:
    """The skeleton for a source whose `batches` is a plain iterator (it computes in this thread).

    `kwargs`: `where`/`desc` (the status line's and the bar's label), `progress`, `status_interval_s`,
    `tokenizer_fingerprint`, `records_hashes`, `assembly` (`Assembly.provenance()`, recorded in the manifest),
    `on_batch(n)` (after each batch; tests inject a kill here)."""
    run = _Run.start(source, samples, files, options, world, **kwargs)
    if run.finished:
        return run.earlier_result()
    with run, closing(source.batches(run.todo)) as batches:
        for batch in batches:
            run.add(batch)
    return run.finish()


async def run_extraction_async(source: ServedSource, samples: Sequence[Sample], files: HiddenStateFiles,
                               options: ExtractOptions, world: World = World(), **kwargs: Any) -> ExtractResult:
    """`run_extraction` for a source whose `batches` is an async iterator (it awaits a server)."""
    run = _Run.start(source, samples, files, options, world, **kwargs)
    if run.finished:
        return run.earlier_result()
    with run:
        async with aclosing(source.batches(run.todo)) as batches:
            async for batch in batches:
                run.add(batch)
    return run.finish()


# -- the two ready-made calls ---------------------------------------------------------------------------------
def extract(samples: Sequence[Sample], output_dir: str | Path, name: str, model: str | Path | torch.nn.Module, *,
            options: ExtractOptions | None = None, device: str = "cpu", dtype: torch.dtype | None = None,
            device_map: Any = None, max_memory: dict | None = None, tp: int = 1, rank: int | None = None,
            world_size: int | None = None, tokenizer_fingerprint: str = "",
            records_hashes: dict[str, str] | None = None, assembly: dict[str, Any] | None = None,
            devices: Devices | None = None,
            progress: bool = True, status_interval_s: float = 10.0,
            on_batch: Callable[[int], None] | None = None, load_fn: ModelLoader = load_model) -> ExtractResult:
    """Hidden states of `samples` into `<output_dir>/hidden_states/<name>/` by the transformers backend, resuming
    what is stored.

    `rank`/`world_size` default to torchrun's RANK/WORLD_SIZE (see `World`). Before any weight loads, the
    checkpoint's config is checked (quantization format, tp against the heads) and its memory plan for
    `devices` (default: the visible ones) must fit. `load_fn` loads the model (`load_model`; a test injects
    one that must not be reached). `on_batch(n)` runs after each batch.
    """
    options = options or ExtractOptions()
    env_rank, env_world = torchrun_world()
    world = World(env_rank if rank is None else rank, env_world if world_size is None else world_size, tp)
    source = TransformersSource(model, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory,
                                tp=tp, dp=world.dp, devices=devices, max_tokens_per_batch=options.max_tokens_per_batch,
                                max_batch_size=options.max_batch_size, score_chunk_tokens=options.score_chunk_tokens,
                                load_fn=load_fn)
    dp_rank, tp_rank = divmod(world.rank, tp)
    return run_extraction(source, samples, hidden_state_files(name, output_dir), options, world,
                          where=f"rank {world.rank}/{world.size}",
                          desc=f"dp {dp_rank}/{world.dp}" + (f" tp {tp_rank}/{tp}" if tp > 1 else ""),
                          progress=progress, status_interval_s=status_interval_s,
                          tokenizer_fingerprint=tokenizer_fingerprint, records_hashes=records_hashes,
                          assembly=assembly, on_batch=on_batch)


async def extract_with_vllm_async(samples: Sequence[Sample], output_dir: str | Path, name: str, model: str | Path,
                                  *, vllm: VllmOptions, options: ExtractOptions | None = None,
                                  tokenizer_fingerprint: str = "", records_hashes: dict[str, str] | None = None,
                                  assembly: dict[str, Any] | None = None,
                                  progress: bool = True, status_interval_s: float = 10.0,
                                  on_batch: Callable[[int], None] | None = None,
                                  transport: httpx.AsyncBaseTransport | None = None) -> ExtractResult:
    """Hidden states of `samples` from the server at `vllm.server` into `<output_dir>/hidden_states/<name>/`,
    resuming what is stored: the same skeleton, with `backend: vllm` in the plan and an `engine` record in the
    manifest. `transport`: the httpx transport to send through (None: the network)."""
    source = VllmSource(model, vllm, transport)
    return await run_extraction_async(source, samples, hidden_state_files(name, output_dir),
                                      options or ExtractOptions(), where=f"via {public_url(vllm.server or '')}",
                                      desc=f"vllm {name}", progress=progress, status_interval_s=status_interval_s,
                                      tokenizer_fingerprint=tokenizer_fingerprint, records_hashes=records_hashes,
                                      assembly=assembly, on_batch=on_batch)


def extract_with_vllm(*args: Any, **kwargs: Any) -> ExtractResult:
    """`extract_with_vllm_async` from plain code (in Jupyter: `await extract_with_vllm_async(...)`)."""
    return run_sync(extract_with_vllm_async(*args, **kwargs), "extract_with_vllm_async")
