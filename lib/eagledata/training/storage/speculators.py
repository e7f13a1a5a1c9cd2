"""speculators' layout (0.9.0, `speculators/train/data.py` `ArrowDataset` + `hs_connectors.FileTransfer`).

The set's directory is the Arrow dataset the trainer's `--data-path` names (`datasets.load_from_disk`, torch
format; columns `id`, `input_ids`, `loss_mask`, `seq_len`), with `hidden_states/hs_{i}.safetensors` beside it,
`i` being the row: `token_ids` [T] int64 (compared with the row's `input_ids`) and `hidden_states` [T, 4, H],
the three aux layers then the verifier's last state. The trainer flattens the first three into [T, 3H] and
takes the last as `verifier_last_hidden_states`. `token_freq.pt` beside them (`exports.save_token_freq`) is what
its `--draft-vocab-size` builds the draft vocabulary from.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import torch

from ...errors import InputError
from ...files import DirectFile
from ..assembly import Sample
from ..exports import TOKEN_FREQ_FILE, save_arrow
from .common import IndexEntry, Layout, PerSampleWriter, Reader, write_tensor

STATES_DIR = "hidden_states"


def state_file(position: int) -> str:
    return f"{STATES_DIR}/hs_{position}.safetensors"


SAFETENSORS_DTYPES = {torch.int64: "I64", torch.bfloat16: "BF16", torch.float32: "F32"}


def safetensors_header(tensors: dict[str, torch.Tensor]) -> bytes:
    """The length-prefixed JSON header `safetensors` writes for `tensors`, already in its file order (it sorts by
    dtype, widest first, then name: int64 ids come before bf16 or fp32 states) and with no metadata."""
    entries, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset,
                                                                                                      offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text


class RowFileWriter(PerSampleWriter):
    """One safetensors file per sample, named by its row: byte for byte what `safetensors.torch.save_file`
    writes, straight from the batch's states into a `DirectFile` (no copy of its own, no page cache)."""

    @staticmethod
    def expected_file(position: int) -> str:
        return state_file(position)

    def save(self, sample: Sample, states: torch.Tensor, path: Path) -> None:
        write_row_file(sample, states, path)


def write_row_file(sample: Sample, states: torch.Tensor, path: Path) -> None:
    tensors = {"token_ids": torch.tensor(sample.input_ids, dtype=torch.long), "hidden_states": states}
    with DirectFile(path) as f:
        f.write(safetensors_header(tensors))
        for t in tensors.values():
            write_tensor(f, t)


def finish(directory: Path, manifest: dict, entries: list[IndexEntry], samples: list[Sample]) -> None:
    """The Arrow dataset, in sample order (row i ↔ hs_i), and its `token_freq.pt`, written beside the states; stray
    temp files removed."""
    for stray in (directory / STATES_DIR).glob(".tmp-*"):
        stray.unlink()
    save_arrow(samples, directory)
    manifest["trainer"] = {
        "reads_with": "speculators.train.data.ArrowDataset(max_len, <this directory>)",
        "data_path": str(directory), "hidden_states_backend": "file",
        "target_layer_ids": manifest["layers"], "verifier_name_or_path": manifest["model"],
        "token_freq_path": str(directory / TOKEN_FREQ_FILE)}


def rows_view(source: Path, destination: Path, rows: list[tuple[int, Sample]]) -> Path:
    """A speculators set made of some of `source`'s rows, without a forward: row j of `destination` is
    `rows[j] = (source row, sample)`, whose sample is that row's or a prefix of it (a sample trimmed after its
    last kept token). A whole row's states file is hard-linked (copied across file systems); a prefix's is
    written with the first T positions, which a causal verifier computes from them alone. Refused when a sample's
    tokens are not its source row's. Then the Arrow dataset of the samples, as `finish` writes it."""
    from safetensors import safe_open

    states = destination / STATES_DIR
    if destination.exists():
        shutil.rmtree(destination)
    states.mkdir(parents=True)
    for j, (row, sample) in enumerate(rows):
        src, dst = source / state_file(row), destination / state_file(j)
        with safe_open(str(src), framework="pt") as f:  # the ids alone; the states only where cut
            ids = f.get_tensor("token_ids").tolist()
            if ids[:len(sample)] != list(sample.input_ids):
                raise InputError(f"sample {sample.id} is not row {row}'s tokens (or a prefix of them)", src)
            prefix = f.get_slice("hidden_states")[:len(sample)] if len(ids) != len(sample) else None
        if prefix is None:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
        else:
            write_row_file(sample, prefix.contiguous(), dst)
    save_arrow([sample for _, sample in rows], destination)
    return destination


class RowFileReader(Reader):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from datasets import load_from_disk

        self.data = load_from_disk(str(self.directory))

    def read_states(self, entry: IndexEntry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from safetensors.torch import load_file

        got = load_file(str(self.directory / entry.shard))
        row = int(entry.shard.rsplit("_", 1)[1].split(".")[0])
        return got["token_ids"], torch.as_tensor(self.data[row]["loss_mask"]), got["hidden_states"]


LAYOUT = Layout("speculators", RowFileWriter, RowFileReader, finish, final="pre_norm",
                about="speculators 0.9.0: speculators.train.data.ArrowDataset(max_len, <this directory>); "
                      "it applies the verifier's norm to the last state itself",
                files="Arrow dataset (id, input_ids, loss_mask, seq_len) + token_freq.pt + "
                      "hidden_states/hs_{row}.safetensors: token_ids [T], hidden_states [T, 4, H]",
                finish_imports=("datasets",))
