"""On-disk layouts of a hidden-states set: eagledata's shards, speculators' Arrow dataset + `hs_{i}` files,
SpecForge's per-sample torch files. All share the resume index, the plan check and the manifest (here)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from ...errors import InputError
from ...files import atomic_write_text
from ...paths import HiddenStateFiles
from ..assembly import Sample, per_loss_token, samples_hash
from ..layers import eagle3_layers
from . import native, specforge, speculators
from .common import (
    ERROR_STRIDE,
    FORMAT,
    STORAGE_DTYPES,
    FinalState,
    IndexEntry,
    Layout,
    Reader,
    SampleStates,
    StateWriter,
    Storage,
    dequantize_fp8,
    quantize_fp8,
    read_index,
    read_parts,
)

LayoutName = Literal["eagledata", "speculators", "specforge"]
LAYOUTS: dict[str, Layout] = {m.LAYOUT.name: m.LAYOUT for m in (native, speculators, specforge)}

__all__ = ["ERROR_STRIDE", "FORMAT", "FinalState", "IndexEntry", "LAYOUTS", "Layout", "LayoutName", "PLAN_KEYS",
           "Reader", "SampleStates", "STORAGE_DTYPES", "StateWriter", "Storage", "check_plan", "check_stored",
           "conventions", "dequantize_fp8", "finalize", "get_layout", "quantize_fp8", "read_index", "read_parts"]


def conventions(num_layers: int | None = None) -> list[dict[str, Any]]:
    """Each layout's reader, files, last state and default aux layers (in HF `hidden_states` numbering and in
    the trainer's own), read from the trainers' code; the notebook shows it beside the chosen settings."""
    rows = []
    for layout in LAYOUTS.values():
        off = layout.layer_offset
        if num_layers:
            hf: list = list(eagle3_layers(num_layers))
            own: list = [i + off for i in hf]
        else:
            hf, own = ["2", "L//2", "L-3"], [f"{2 + off}", f"L//2{off:+d}" if off else "L//2", f"L{off - 3:+d}"]
        rows.append({"layout": layout.name, "read by": layout.about, "files": layout.files,
                     "last state": layout.final or "post_norm (default; pre_norm selectable)",
                     "aux layers (HF hidden_states)": hf, "aux layer ids (trainer's numbering)": own,
                     "storage": "/".join(layout.storages)})
    return rows


def get_layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise InputError(f"unknown layout {name!r}; one of {', '.join(LAYOUTS)}", field="layout")
    return LAYOUTS[name]


# Settings a resume must share with what is stored: anything else is another data set.
PLAN_KEYS = ("layout", "layers", "final", "storage", "hidden_size", "num_layers", "vocab_size")


def check_plan(files: HiddenStateFiles, plan: dict[str, Any]) -> None:
    """Write the plan of a new set, or refuse to resume a set made with other settings."""
    path = files.plan
    if path.is_file():
        old = json.loads(path.read_text())
        old.setdefault("layout", "eagledata")
        diff = [k for k in PLAN_KEYS if old.get(k) != plan[k]]
        if diff:
            raise InputError(f"{files.directory} holds states made with other settings ({', '.join(diff)}: "
                             f"{[old.get(k) for k in diff]} vs {[plan[k] for k in diff]}); use another name",
                             path)
    else:
        atomic_write_text(path, json.dumps(plan, indent=1))


def check_stored(files: HiddenStateFiles, writer: StateWriter | type[StateWriter], samples: Sequence[Sample],
                 done: dict[str, IndexEntry]) -> None:
    """A resume must find each stored sample over the same ids, and (for a trainer's per-row files) at the
    same row; otherwise the set belongs to other input."""
    for position, s in enumerate(samples):
        e = done.get(s.id)
        if e is None:
            continue
        if e.digest != s.digest():
            raise InputError(f"{files.directory} holds states of sample {s.id!r} over other ids; use another name",
                             files.parts, field="id")
        expected = writer.expected_file(position)
        if expected is not None and e.shard != expected:
            raise InputError(f"{files.directory} holds sample {s.id!r} as {e.shard}, but it is row {position} of "
                             f"this set ({expected}): the set's order changed; use another name", files.parts,
                             field="id")


def finalize(files: HiddenStateFiles, samples: Sequence[Sample], *, tokenizer_fingerprint: str = "",
             records_hashes: dict[str, str] | None = None, extra: dict[str, Any] | None = None,
             prior_rel_rmse: float = 0.0, done: dict[str, IndexEntry] | None = None) -> dict[str, Any] | None:
    """Once every sample is stored: the layout's own files, `index.jsonl` in sample order, `manifest.json`.

    Returns None (and writes nothing) while samples are missing. Deterministic, so ranks that race here
    write the same bytes. `prior_rel_rmse`: the error of the states this set was converted from. `done`: the
    index parts when the caller has just read them.
    """
    directory = files.directory
    done = read_parts(files) if done is None else done
    if any(s.id not in done for s in samples):
        return None
    plan = json.loads(files.plan.read_text())
    layout = get_layout(plan.get("layout", "eagledata"))
    entries = [done[s.id] for s in samples]
    shards = list(dict.fromkeys(e.shard for e in entries))
    sq_err, sq_ref = sum(e.sq_err for e in entries), sum(e.sq_ref for e in entries)
    tokens = sum(e.length for e in entries)
    loss_tokens = sum(sum(s.loss_mask) for s in samples)
    state_bytes = sum((directory / s).stat().st_size for s in shards)
    manifest = {**plan, "format": FORMAT, **(extra or {}),
                "shards": shards if layout.name == "eagledata" else [], "num_files": len(shards),
                "num_samples": len(entries), "num_tokens": tokens,
                "num_loss_tokens": loss_tokens,  # a later turn re-reads its history: more tokens than trained on
                "tokens_per_loss_token": per_loss_token(tokens, loss_tokens),
                "bytes": state_bytes, "bytes_per_token": state_bytes / tokens if tokens else 0.0,
                "reconstruction_rel_rmse": ((sq_err / sq_ref if sq_ref else 0.0) + prior_rel_rmse ** 2) ** 0.5,
                "tokenizer_fingerprint": tokenizer_fingerprint, "records_hashes": records_hashes or {},
                "samples_hash": samples_hash(samples, [e.digest for e in entries] if all(e.digest for e in entries)
                                             else None)}  # each digest was checked against its sample when stored
    layout.finish(directory, manifest, entries, list(samples))
    atomic_write_text(files.index, "".join(e.line(private=False) for e in entries))
    atomic_write_text(files.manifest, json.dumps(manifest, indent=1))
    return manifest
