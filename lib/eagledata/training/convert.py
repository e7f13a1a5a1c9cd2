"""A finished hidden-states set rewritten in another layout without recompute (`python -m eagledata.hidden_states
convert --layout speculators SRC DST`). It resumes like an extraction: what is indexed in DST is skipped.

One Python process writes per-sample files at ~150 MB/s here (torch.save and safetensors hold the GIL while
they serialize), far below a disk's bandwidth. So the work is cut into parts, consecutive in the source's
storage, and written by `workers` processes, each with its own index part: a kill loses at most the parts in
progress, and a resume skips every sample any part has indexed.
"""
from __future__ import annotations

import gc
import importlib
import json
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..paths import HiddenStateFiles
from .assembly import Sample
from .loader import HiddenStates
from .scoring import SCORES_FILE, ExcludeSamples, read_scores, write_scores
from .storage import (
    PLAN_KEYS,
    STORAGE_DTYPES,
    IndexEntry,
    Storage,
    check_plan,
    check_stored,
    finalize,
    get_layout,
    read_parts,
)

READ_BYTES = 64 << 20  # samples read from the source together: one slice of a shard instead of one per sample
PART_BYTES = 256 << 20  # a worker's task: big enough to amortize its setup, small enough to balance and resume
MIN_PART_BYTES = 32 << 20  # the last tasks shrink to this, so that the workers finish together
PARALLEL_BYTES = 512 << 20  # below this a conversion runs in this process (starting a worker costs ~3 s)
MAX_WORKERS = 16


@dataclass(kw_only=True)
class ConvertResult:
    directory: Path
    converted: int
    skipped: int
    bytes_written: int
    seconds: float
    workers: int
    manifest: dict[str, Any]


Item = tuple[IndexEntry, int]  # a sample's place in the source, its row in the set


def runs(items: Sequence[Item], max_tokens: int) -> Iterator[Sequence[Item]]:
    """Consecutive samples of the source in groups of about `max_tokens`, never across shards: a shard's
    neighbours come in one read (a group across two shards was read sample by sample and joined)."""
    start, tokens = 0, 0
    for i, (entry, _) in enumerate(items):
        if i > start and entry.shard != items[i - 1][0].shard:
            yield items[start:i]
            start, tokens = i, 0
        tokens += entry.length
        if tokens >= max_tokens:
            yield items[start:i + 1]
            start, tokens = i + 1, 0
    if start < len(items):
        yield items[start:]


def split_parts(items: Sequence[Item], per_token: int, workers: int) -> list[Sequence[Item]]:
    """`items` in consecutive parts of PART_BYTES, shrinking toward the end to a 1/(2 workers) share of what is
    left (not below MIN_PART_BYTES): equal parts left two of three workers idle for up to a part's time (~1 s)
    while the last one finished."""
    out, start, tokens, left = [], 0, 0, sum(e.length for e, _ in items) * per_token
    for i, (entry, _) in enumerate(items):
        tokens += entry.length
        if tokens * per_token >= min(PART_BYTES, max(MIN_PART_BYTES, left // (2 * workers))):
            out.append(items[start:i + 1])
            start, left, tokens = i + 1, left - tokens * per_token, 0
    if start < len(items):
        out.append(items[start:])
    return out


@dataclass(frozen=True)
class Part:
    """One task of a conversion: samples consecutive in the source's storage, with their rows in the set."""

    source: str
    destination: str
    layout: str
    storage: Storage
    flush_bytes: int
    items: Sequence[Item]


def bytes_per_token(manifest: dict[str, Any], storage: str | None = None) -> int:
    """Bytes of one token's four states in a set's storage (or in `storage`)."""
    return 4 * manifest["hidden_size"] * STORAGE_DTYPES[storage or manifest["storage"]].itemsize


def source_sample(src: HiddenStates, entry: IndexEntry) -> Sample:
    return Sample(entry.id, "", *src.reader.ids(entry), truncated=False)


def write_part(src: HiddenStates, part: Part) -> int:
    """Write one part through the layout's own writer (its own index part); returns its tokens. The part names
    its samples only: their ids are read here, from the source (not pickled over from the parent)."""
    files = HiddenStateFiles(Path(part.destination))
    m = src.manifest
    writer = get_layout(part.layout).writer(files, files.parts / f"convert-{uuid.uuid4().hex[:8]}.jsonl",
                                            part.storage, part.flush_bytes, m["hidden_size"],
                                            {e.id: row for e, row in part.items})
    try:
        for run in runs(part.items, max(1, READ_BYTES // bytes_per_token(m))):
            entries = [e for e, _ in run]
            writer.add([source_sample(src, e) for e in entries], src.reader.read_run(entries))
        writer.flush()
    finally:
        writer.close()
    return sum(e.length for e, _ in part.items)


@lru_cache(maxsize=2)
def _source(path: str) -> HiddenStates:
    return HiddenStates(path)


def _init_worker() -> None:
    """A worker's own threads copy and write its files: torch's intra-op threads on top of them only fight
    over the cores."""
    import torch

    torch.set_num_threads(1)


def _write_part_in_worker(part: Part) -> int:
    return write_part(_source(part.source), part)


def check_convention(final: str, layout_name: str) -> None:
    """States cannot change norm side without recompute: refuse a conversion the trainer would misread."""
    layout = get_layout(layout_name)
    if layout.final is not None and layout.final != final:
        raise InputError(f"the source states are {final}, but {layout.name} expects {layout.final} as its last "
                         f"state; extract again with layout={layout.name} (or final={layout.final})",
                         field="final")


def check_exclusion(files: HiddenStateFiles, rule: dict[str, Any] | None) -> None:
    """A resumed export must leave out what it left out before: another rule is another set (its rows differ)."""
    if files.plan.is_file():
        old = json.loads(files.plan.read_text()).get("exclude")
        if old != rule:
            raise InputError(f"{files.directory} was exported with exclude={old}, not {rule}; use another "
                             "destination", files.plan, field="exclude")


def default_workers(todo_bytes: int) -> int:
    """One more than the cores (a worker also waits on its source and its syncs; 2 cores, 10k small files, with
    an fsync per file: 2 workers 169 MB/s, 3 workers 183, 4 workers 170; with one syncfs per batch 2, 3 and 4
    workers were within noise), one for a small set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if todo_bytes < PARALLEL_BYTES else min(MAX_WORKERS, cores + 1)


def convert(source: str | Path, destination: str | Path, layout: str, *, workers: int | None = None,
            flush_bytes: int = 64 << 20, progress: bool = True, exclude: ExcludeSamples | None = None
            ) -> ConvertResult:
    """`source` (a finished set, any layout) into `destination` in `layout`; fp8 sources become bf16.

    `workers`: processes writing in parallel; None -> `default_workers`. `exclude`: samples left out (a suspect
    provider's, outliers: see `scoring.ExcludeSamples`), recorded in the manifest's `excluded`; the source's
    scores of the kept samples come along (`scores.jsonl`)."""
    if workers is not None and workers < 1:
        raise InputError(f"must be a positive integer, got {workers!r}", field="workers")
    src = HiddenStates(source)
    out_layout = get_layout(layout)
    m = src.manifest
    storage: Storage = "bf16" if m["storage"] == "fp8" and "fp8" not in out_layout.storages else m["storage"]
    out_layout.check_storage(storage)
    check_convention(m["final"], out_layout.name)
    files = HiddenStateFiles(Path(destination))
    if files.directory.resolve() == src.files.directory.resolve():
        raise InputError("source and destination are the same directory", files.directory)
    scores = read_scores(src.files.directory) if (src.files.directory / SCORES_FILE).is_file() else []
    left_out = exclude.decide([e.id for e in src.entries], scores) if exclude else {}
    entries = [e for e in src.entries if e.id not in left_out]
    if not entries:
        raise InputError(f"the exclusion leaves none of the {len(src.entries)} samples", field="exclude")
    files.parts.mkdir(parents=True, exist_ok=True)
    plan: dict[str, Any] = {**{k: m.get(k) for k in ("model", "decoder", "compute_dtype")},
                            **{k: m.get(k) for k in PLAN_KEYS},
                            "layout": out_layout.name, "storage": storage,
                            "dtype": str(STORAGE_DTYPES[storage]).replace("torch.", "")}
    if exclude:
        plan["exclude"] = exclude.rule()
    check_exclusion(files, plan.get("exclude"))
    check_plan(files, plan)

    done = read_parts(files)
    samples = [source_sample(src, e) for e in entries] if done else None
    if samples:
        check_stored(files, out_layout.writer, samples, done)
    # In the order the source stores them: shards hold samples longest first, so sample order would read
    # them at random (slow from a cold disk); file names follow rows whatever the order of writing.
    todo = sorted(((e, row) for row, e in enumerate(entries) if e.id not in done),
                  key=lambda item: (item[0].shard, item[0].offset))
    tokens = sum(e.length for e, _ in todo)
    per_token = bytes_per_token(m)
    workers = workers or default_workers(tokens * per_token)
    parts = [Part(str(src.files.directory), str(files.directory), out_layout.name, storage, flush_bytes, items)
             for items in split_parts(todo, per_token, workers)]
    start = time.perf_counter()
    pool, futures = _start_workers(parts, workers) if workers > 1 else (None, set())
    if samples is None:  # the set's samples are needed only at the end: read while the workers write
        samples = [source_sample(src, e) for e in entries]
    for module in out_layout.finish_imports:  # this process only waits for the workers: it imports these meanwhile
        threading.Thread(target=importlib.import_module, args=(module,), daemon=True).start()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=tokens, unit="tok", desc=f"convert to {out_layout.name}" + (f", {workers} workers"
                                                                                  if workers > 1 else ""))
    try:
        if pool is None:
            for part in parts:
                n = write_part(src, part)
                if bar is not None:
                    bar.update(n)
        while futures:
            finished, futures = wait(futures, return_when=FIRST_COMPLETED)
            for future in finished:
                n = future.result()  # a worker's error stops the run here; finished parts stay indexed
                if bar is not None:
                    bar.update(n)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
    extra: dict[str, Any] = {"converted_from": str(src.files.directory), "source_format": m.get("format")}
    if "assembly" in m:  # what the source's assembly left out (generation's suspects) stays said
        extra["assembly"] = m["assembly"]
    kept = {e.id for e in entries}
    extra["scoring"] = write_scores(files.directory, [r for r in scores if r.id in kept], len(entries))
    if exclude:
        extra["excluded"] = exclude.record(left_out)
    manifest = finalize(files, samples, tokenizer_fingerprint=m.get("tokenizer_fingerprint", ""),
                        records_hashes=m.get("records_hashes"), prior_rel_rmse=m.get("reconstruction_rel_rmse", 0.0),
                        extra=extra)
    assert manifest is not None  # every sample was written above
    return ConvertResult(directory=files.directory, converted=len(todo), skipped=len(samples) - len(todo),
                         bytes_written=tokens * bytes_per_token(m, storage),
                         seconds=time.perf_counter() - start, workers=workers, manifest=manifest)


def _start_workers(parts: Sequence[Part], workers: int) -> tuple[ProcessPoolExecutor, set[Future]]:
    """All parts submitted to `workers` processes. Forked when this process runs no other thread (the command
    line: workers start at once, torch already loaded, ~3 s sooner); spawned otherwise, since a notebook kernel's
    threads and OpenMP pool must not be forked. Called before the progress bar starts its thread."""
    fork = threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()
    if fork:
        # Each forked worker's garbage collector would walk every object inherited from here (torch's alone are
        # ~170k), copying every page they sit on; frozen while the workers fork (at the first submit), it leaves
        # them alone.
        gc.freeze()
    try:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork" if fork else "spawn"),
                                   initializer=_init_worker)
        return pool, {pool.submit(_write_part_in_worker, part) for part in parts}
    finally:
        if fork:
            gc.unfreeze()
