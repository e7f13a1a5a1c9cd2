"""A finished hidden-states set rewritten in another layout without recompute (`python -m eagledata.hidden_states
convert --layout speculators SRC DST`). It resumes like an extraction: what is indexed in DST is skipped."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import InputError
from ..layout import HiddenStateFiles
from .assembly import Sample
from .loader import HiddenStates
from .storage import PLAN_KEYS, IndexEntry, STORAGE_DTYPES, check_plan, check_stored, finalize, get_layout, read_parts


READ_BYTES = 64 << 20  # samples read from the source together: one slice of a shard instead of one per sample


@dataclass(kw_only=True)
class ConvertResult:
    directory: Path
    converted: int
    skipped: int
    bytes_written: int
    seconds: float
    manifest: dict[str, Any]


def runs(todo: list[tuple[IndexEntry, Sample]], max_tokens: int) -> Iterator[list[tuple[IndexEntry, Sample]]]:
    """Consecutive samples of the source in groups of about `max_tokens`: a shard's neighbours come in one read."""
    run: list[tuple[IndexEntry, Sample]] = []
    tokens = 0
    for item in todo:
        run.append(item)
        tokens += item[0].length
        if tokens >= max_tokens:
            yield run
            run, tokens = [], 0
    if run:
        yield run


def check_convention(final: str, layout_name: str) -> None:
    """States cannot change norm side without recompute: refuse a conversion the trainer would misread."""
    layout = get_layout(layout_name)
    if layout.final is not None and layout.final != final:
        raise InputError(f"the source states are {final}, but {layout.name} expects {layout.final} as its last "
                         f"state; extract again with layout={layout.name} (or final={layout.final})",
                         field="final")


def convert(source: str | Path, destination: str | Path, layout: str, *, flush_bytes: int = 256 << 20,
            progress: bool = True) -> ConvertResult:
    """`source` (a finished set, any layout) into `destination` in `layout`; fp8 sources become bf16."""
    src = HiddenStates(source)
    target = get_layout(layout)
    m = src.manifest
    storage = "bf16" if m["storage"] == "fp8" and "fp8" not in target.storages else m["storage"]
    target.check_storage(storage)
    check_convention(m["final"], target.name)
    files = HiddenStateFiles(Path(destination))
    if files.directory.resolve() == src.files.directory.resolve():
        raise InputError("source and destination are the same directory", files.directory)
    files.parts.mkdir(parents=True, exist_ok=True)
    plan = {**{k: m.get(k) for k in ("model", "decoder", "compute_dtype")}, **{k: m.get(k) for k in PLAN_KEYS},
            "layout": target.name, "storage": storage,
            "dtype": str(STORAGE_DTYPES[storage]).replace("torch.", "")}
    check_plan(files, plan)

    samples = [Sample(e.id, "", *src.reader.ids(e), truncated=False) for e in src.entries]
    part = files.parts / f"convert-{uuid.uuid4().hex[:8]}.jsonl"
    writer = target.writer(files, part, storage, flush_bytes, m["hidden_size"], {s.id: i for i, s in enumerate(samples)})
    done = read_parts(files)
    check_stored(files, writer, samples, done)
    # In the order the source stores them: shards hold samples longest first, so sample order would read
    # them at random (slow from a cold disk); file names follow rows whatever the order of writing.
    todo = sorted(((e, s) for e, s in zip(src.entries, samples) if s.id not in done),
                  key=lambda pair: (pair[0].shard, pair[0].offset))
    per_token = 4 * m["hidden_size"] * STORAGE_DTYPES[m["storage"]].itemsize
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(e.length for e, _ in todo), unit="tok", desc=f"convert to {target.name}")
    start = time.perf_counter()
    try:
        for run in runs(todo, max(1, READ_BYTES // per_token)):
            writer.add([s for _, s in run], src.reader.read_run([e for e, _ in run]))
            if bar is not None:
                bar.update(sum(e.length for e, _ in run))
        writer.flush()
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    manifest = finalize(files, samples, tokenizer_fingerprint=m.get("tokenizer_fingerprint", ""),
                        records_hashes=m.get("records_hashes"), prior_rel_rmse=m.get("reconstruction_rel_rmse", 0.0),
                        extra={"converted_from": str(src.files.directory), "source_format": m.get("format")})
    assert manifest is not None  # every sample was written above
    return ConvertResult(directory=files.directory, converted=len(todo), skipped=len(samples) - len(todo),
                         bytes_written=sum(e.length for e, _ in todo) * 4 * m["hidden_size"]
                         * (2 if storage == "bf16" else 4), seconds=time.perf_counter() - start, manifest=manifest)
