"""SpecForge's offline layout (sgl-project/SpecForge, `specforge/data/preprocessing.py` at 01d0b926:
`build_offline_eagle3_dataset` → `list_local_files` + `OfflineEagle3Dataset.process_data`).

The trainer's `--train-hidden-states-path` is the set's directory; it walks it for `*.ckpt` files (any depth,
sorted by path) and `torch.load`s each with `mmap=True`. One file per sample: `input_ids` [T] and `loss_mask`
[T] (int64, no batch dimension: the reader adds it), `hidden_state` [1, T, H] (the target, post-norm: it goes
straight to the LM head) and `aux_hidden_state` [1, T, 3H] (the three aux layers concatenated, low layer
first). Files sit in `rows_<start>-<end>/data_<i>.ckpt` folders of 2,000, as `scripts/prepare_hidden_states.py`
writes them (`--file-group-size`). SpecForge numbers aux layers by the layer whose OUTPUT is taken: its
`eagle_aux_hidden_state_layer_ids` are our HF `hidden_states` indices minus one.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import torch

from ..assembly import Sample
from .common import Batch, IndexEntry, Layout, Reader, SampleStates, StateWriter, fsync

ROWS_PER_DIR = 2000


def sample_file(position: int) -> str:
    start = position // ROWS_PER_DIR * ROWS_PER_DIR
    return f"rows_{start}-{start + ROWS_PER_DIR}/data_{position}.ckpt"


def sample_dict(input_ids: list[int], loss_mask: list[int], states: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sample as SpecForge stores it; the states are copied so that no view drags its batch along."""
    t, _, h = states.shape
    return {"input_ids": torch.tensor(input_ids, dtype=torch.long),
            "loss_mask": torch.tensor(loss_mask, dtype=torch.long),
            "hidden_state": states[:, 3].clone().unsqueeze(0),
            "aux_hidden_state": states[:, :3].reshape(t, 3 * h).unsqueeze(0)}


class SampleFileWriter(StateWriter):
    def _write(self, batch: Batch) -> list[IndexEntry]:
        entries, folders = [], set()
        for s, position, (offset, length) in zip(batch.samples, batch.positions, batch.spans()):
            name = sample_file(position)
            path = self.files.directory / name
            path.parent.mkdir(exist_ok=True)
            folders.add(path.parent)
            tmp = path.parent / f".tmp-{uuid.uuid4().hex}"  # no .ckpt suffix: the trainer never lists it
            with tmp.open("wb") as f:
                torch.save(sample_dict(s.input_ids, s.loss_mask, batch.states[offset:offset + length]), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            entries.append(IndexEntry(s.id, name, 0, length))
        for folder in folders:
            fsync(folder)
        return entries

    def expected_file(self, position: int) -> str | None:
        return sample_file(position)


def finish(directory: Path, manifest: dict, entries: list[IndexEntry], samples: list[Sample]) -> None:
    """Files the trainer would also pick up must be ours: temp files and files of no listed sample go."""
    kept = {e.shard for e in entries}
    for path in directory.glob("rows_*/*"):
        if f"{path.parent.name}/{path.name}" not in kept:
            path.unlink()
    manifest["trainer"] = {
        "reads_with": "specforge.data.preprocessing.build_offline_eagle3_dataset(<this directory>)",
        "train_hidden_states_path": str(directory),
        "eagle_aux_hidden_state_layer_ids": [i - 1 for i in manifest["layers"]],
        "target_model_path": manifest["model"]}


class SampleFileReader(Reader):
    def read(self, entry: IndexEntry) -> SampleStates:
        data = torch.load(self.directory / entry.shard, weights_only=True, mmap=True)
        t = data["input_ids"].shape[0]
        aux = data["aux_hidden_state"].squeeze(0).reshape(t, 3, -1)
        return SampleStates(data["input_ids"].long(), data["loss_mask"].long(), aux, data["hidden_state"].squeeze(0))


LAYOUT = Layout("specforge", SampleFileWriter, SampleFileReader, finish, final="post_norm",
                about="SpecForge: build_offline_eagle3_dataset(<this directory>) (OfflineEagle3Dataset); "
                      "the last state goes straight to the LM head",
                files="rows_<start>-<end>/data_{row}.ckpt (torch.save): input_ids [T], loss_mask [T], "
                      "hidden_state [1, T, H], aux_hidden_state [1, T, 3H]", layer_offset=-1)
