"""The training set as each trainer reads it: SpecForge's conversation rows (text + exact ids), speculators' token
export (JSONL + the Arrow dataset + `token_freq.pt`, the draft-vocabulary counts its trainer reads), the
provenance beside it (`<export>.assembly.json`: `Assembly.provenance()`), and the token export read back
(`read_samples`). Every file is described in docs/FORMATS.md#training-set-exports.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import atomic_write_text, iter_jsonl, make_dir, write_jsonl
from ..records import Record
from ..text import Tokenizer
from .assembly import Assembly, Sample


def specforge_row(record: Record, sample: Sample, tok: Tokenizer | None = None) -> dict[str, Any]:
    """SpecForge's conversation row (the messages sent: for a later turn its history, with the model's own earlier
    answers as `assistant` turns, tool calls and results kept, and the tools; then this turn's answer, its reasoning
    as `reasoning_content`, as are the reasoning of the tool loop's earlier turns), plus the exact ids
    and mask the states are taken over (loss on this turn's answer only) and, with `tok`, their exact text:
    SpecForge's template list has no Kimi-K2.5 entry, so its trainer should not re-render."""
    turns = [{"role": m["role"], "content": m.get("content", ""),
              **({"reasoning_content": m["reasoning"]} if m.get("reasoning") else {}),  # a tool loop's, as sent
              **{k: m[k] for k in ("tool_calls", "tool_call_id") if m.get(k)}} for m in record.messages]
    answer: dict[str, Any] = {"role": "assistant", "content": record.content}
    if record.reasoning:
        answer["reasoning_content"] = record.reasoning
    if record.tool_calls:
        answer["tool_calls"] = record.tool_calls
    row: dict[str, Any] = {"id": record.id, "conversation_id": record.conversation_id, "turn": record.turn,
                           "conversations": [*turns, answer]}
    if record.tools:
        row["tools"] = record.tools
    if tok is not None:
        row["text"] = tok.decode(sample.input_ids)
    row.update(input_ids=sample.input_ids, loss_mask=sample.loss_mask)
    return row


def export_specforge(assembly: Assembly, path: str | Path, tok: Tokenizer | None = None) -> Path:
    """Text export. `conversations` holds the full text even for a cut sample; `input_ids`/`text` are exact."""
    return write_jsonl(path, (specforge_row(r, s, tok) for r, s in zip(assembly.records, assembly.samples)))


def export_speculators(assembly: Assembly, path: str | Path) -> Path:
    """Token export: `{id, input_ids, loss_mask, seq_len}` per line (then `dataset`, `provider`, `sampling`,
    `conversation_id`, `turn`), exactly the ids the states are taken over, one line per turn; beside it (same
    name, no suffix) the same rows as the Arrow dataset speculators' trainer reads, with its `token_freq.pt`, and
    `provenance_file(path)`: `Assembly.provenance()`, which `eagledata-hidden-states --samples` records in the
    manifest as the notebook does."""
    path = Path(path)
    save_arrow(assembly.samples, path.with_suffix(""))
    write_jsonl(path, (s.to_speculators() for s in assembly.samples))
    atomic_write_text(provenance_file(path), json.dumps(assembly.provenance(), indent=1) + "\n")
    return path


def provenance_file(samples_path: str | Path) -> Path:
    """`<export>.assembly.json` beside a speculators export: what its assembly left out and why."""
    return Path(samples_path).with_suffix(".assembly.json")


def read_provenance(samples_path: str | Path) -> dict[str, Any] | None:
    """The provenance beside a speculators export; None when there is none (an export made elsewhere)."""
    path = provenance_file(samples_path)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"not JSON: {e.msg}", path, e.lineno) from None
    if not isinstance(doc, dict):
        raise InputError("expected a JSON object", path)
    return doc


ARROW_CHUNK_TOKENS = 1 << 30
TOKEN_FREQ_FILE = "token_freq.pt"  # speculators' trainer looks for <data-path>/token_freq.pt (--token-freq-path)


def token_frequencies(input_ids: Any, loss_mask: Any) -> dict[int, int]:
    """{token id: count} over the supervised tokens (loss mask non-zero) of flat id and mask arrays (pure): what
    `speculators.train.vocab_mapping.save_token_frequency_distribution` counts, by one bincount."""
    import numpy as np

    ids = np.asarray(input_ids, dtype=np.int64)[np.asarray(loss_mask) != 0]
    counts = np.bincount(ids) if ids.size else np.zeros(0, dtype=np.int64)
    nonzero = np.flatnonzero(counts)
    return dict(zip(nonzero.tolist(), counts[nonzero].tolist()))


def save_token_freq(counts: dict[int, int], directory: str | Path) -> Path:
    """`<directory>/token_freq.pt` as speculators writes it: `torch.save` of a plain dict of int -> int (read back
    with `torch.load(weights_only=True)`), keys in id order; replaced atomically (written under its own name in a
    temp folder, so the archive inside is named as speculators' own)."""
    import torch

    path = Path(directory) / TOKEN_FREQ_FILE
    tmp = path.parent / f".token-freq-tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        torch.save({int(t): int(counts[t]) for t in sorted(counts)}, tmp / TOKEN_FREQ_FILE)
        os.replace(tmp / TOKEN_FREQ_FILE, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def save_arrow(samples: Sequence[Sample], directory: str | Path, *, chunk_tokens: int = ARROW_CHUNK_TOKENS,
               token_freq: bool = True) -> Path:
    """`samples` as a torch-format Arrow dataset (`id`, `input_ids`, `loss_mask`, `seq_len`, int64), the form
    speculators' preprocessing writes and `datasets.load_from_disk` reads; replaced atomically file by file. With
    `token_freq`, `token_freq.pt` beside it (`save_token_freq`), counted from the same flat arrays: without it
    speculators' trainer cannot build a draft vocabulary (`--draft-vocab-size`) and trains over the whole
    verifier vocabulary. `chunk_tokens`: tokens per Arrow chunk (its list offsets are int32)."""
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset, DatasetInfo, Features, Value, disable_progress_bars, enable_progress_bars
    from datasets import Sequence as Seq

    directory = make_dir(directory, "output_dir")
    features = Features({"id": Value("string"), "input_ids": Seq(Value("int64")), "loss_mask": Seq(Value("int64")),
                         "seq_len": Value("int64")})
    lengths = np.fromiter((len(s) for s in samples), dtype=np.int64, count=len(samples))
    groups, start, tokens = [], 0, 0  # Arrow lists count offsets in int32: a group of rows per chunk_tokens
    for i, n in enumerate(lengths.tolist()):
        if tokens + n > chunk_tokens and i > start:
            groups.append((start, i))
            start, tokens = i, 0
        tokens += n
    groups.append((start, len(samples)))

    columns: dict[str, list[pa.Array]] = {"input_ids": [], "loss_mask": []}
    counts: Counter = Counter()
    for a, b in groups:  # from flat arrays: twice as fast as Dataset.from_dict
        offsets = np.zeros(b - a + 1, dtype=np.int32)
        np.cumsum(lengths[a:b], out=offsets[1:])
        flat = {name: np.fromiter(itertools.chain.from_iterable(getattr(s, name) for s in samples[a:b]),
                                  dtype=np.int64, count=int(offsets[-1])) for name in columns}
        for name, chunks in columns.items():
            chunks.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat[name])))
        if token_freq:
            counts.update(token_frequencies(flat["input_ids"], flat["loss_mask"]))
    table = pa.table({"id": pa.array([s.id for s in samples], pa.string()),
                      **{name: pa.chunked_array(chunks, pa.list_(pa.int64())) for name, chunks in columns.items()},
                      "seq_len": pa.array(lengths)})
    ds = Dataset(table, info=DatasetInfo(features=features))
    ds.set_format("torch")  # speculators compares stored token ids with the row's input_ids as tensors
    tmp = directory / f".arrow-tmp-{uuid.uuid4().hex[:8]}"
    disable_progress_bars()  # a bar per save is noise in a run report
    try:
        ds.save_to_disk(str(tmp))
    finally:
        enable_progress_bars()
    for f in tmp.iterdir():
        os.replace(f, directory / f.name)
    shutil.rmtree(tmp)
    if token_freq:
        save_token_freq(counts, directory)
    return directory


def read_samples(path: str | Path) -> list[Sample]:
    """Samples back from a speculators export (e.g. to extract states in another process)."""
    out = []
    for line, obj in iter_jsonl(path):
        try:
            ids, mask = obj["input_ids"], obj["loss_mask"]
            if len(ids) != len(mask) or not all(type(i) is int for i in ids):
                raise ValueError
            out.append(Sample(str(obj["id"]), obj.get("dataset", ""), ids, mask, False,
                              provider=obj.get("provider", ""), sampling=obj.get("sampling", ""),
                              conversation_id=str(obj.get("conversation_id", "")), turn=int(obj.get("turn", 1))))
        except (KeyError, TypeError, ValueError):
            raise InputError("expected {id, input_ids, loss_mask} of equal lengths", path, line) from None
    return out
