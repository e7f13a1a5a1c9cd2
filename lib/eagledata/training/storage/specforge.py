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

from pathlib import Path

import torch
from torch.utils.serialization import config as serialization_config

from ..assembly import Sample
from .common import IndexEntry, Layout, PerSampleWriter, Reader, SampleStates

ROWS_PER_DIR = 2000


def sample_file(position: int) -> str:
    start = position // ROWS_PER_DIR * ROWS_PER_DIR
    return f"rows_{start}-{start + ROWS_PER_DIR}/data_{position}.ckpt"


def sample_dict(input_ids: list[int], loss_mask: list[int], states: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sample as SpecForge stores it. torch.save writes a view's whole storage, so both states are copied
    into storage of their own (a view of the batch would put the whole batch in every file), once: a reshape
    of the aux layers then a clone copied them twice."""
    t, _, h = states.shape
    hidden = torch.empty(1, t, h, dtype=states.dtype)
    aux = torch.empty(1, t, 3 * h, dtype=states.dtype)
    hidden[0].copy_(states[:, 3])
    aux.view(t, 3, h).copy_(states[:, :3])
    return {"input_ids": torch.tensor(input_ids, dtype=torch.long),
            "loss_mask": torch.tensor(loss_mask, dtype=torch.long),
            "hidden_state": hidden, "aux_hidden_state": aux}


class SampleFileWriter(PerSampleWriter):
    """torch.save files without the zip's CRC32 (torch.load never checks it; it costs ~0.2 ms per 0.5 MB file)."""

    @staticmethod
    def expected_file(position: int) -> str | None:
        return sample_file(position)

    def save(self, sample: Sample, states: torch.Tensor, path: Path) -> None:
        # The CRC switch is a context variable: set here, in the thread that saves (a writer's), it holds;
        # set when the writer opens, it did not reach those threads. A file object: torch.save would derive
        # the archive's name from a path's dotted stem.
        with serialization_config.patch({"save.compute_crc32": False}), path.open("wb") as f:
            torch.save(sample_dict(sample.input_ids, sample.loss_mask, states), f)


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

    def read_states(self, entry: IndexEntry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        got = self.read(entry)
        return got.input_ids, got.loss_mask, torch.cat([got.aux_hidden_states, got.final_hidden_state[:, None]], 1)


LAYOUT = Layout("specforge", SampleFileWriter, SampleFileReader, finish, final="post_norm",
                about="SpecForge: build_offline_eagle3_dataset(<this directory>) (OfflineEagle3Dataset); "
                      "the last state goes straight to the LM head",
                files="rows_<start>-<end>/data_{row}.ckpt (torch.save): input_ids [T], loss_mask [T], "
                      "hidden_state [1, T, H], aux_hidden_state [1, T, 3H]", layer_offset=-1)
