"""SpecForge's offline layout (sgl-project/SpecForge, `specforge/data/preprocessing.py` at 01d0b926:
`build_offline_eagle3_dataset` → `list_local_files` + `OfflineEagle3Dataset.process_data`).

The trainer's `--train-hidden-states-path` is the set's directory; it walks it for `*.ckpt` files (any depth,
sorted by path) and `torch.load`s each with `mmap=True`. One file per sample: `input_ids` [T] and `loss_mask`
[T] (int64, no batch dimension: the reader adds it), `hidden_state` [1, T, H] (the verifier, post-norm: it goes
straight to the LM head) and `aux_hidden_state` [1, T, 3H] (the three aux layers concatenated, low layer
first). Files sit in `rows_<start>-<end>/data_<i>.ckpt` folders of 2,000, as `scripts/prepare_hidden_states.py`
writes them (`--file-group-size`). SpecForge numbers aux layers by the layer whose OUTPUT is taken: its
`eagle_aux_hidden_state_layer_ids` are our HF `hidden_states` indices minus one.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.serialization import config as serialization_config

from ...files import DirectFile
from ..assembly import Sample
from . import torchzip
from .common import IndexEntry, Layout, PerSampleWriter, Reader, SampleStates

ROWS_PER_DIR = 2000


def sample_file(position: int) -> str:
    start = position // ROWS_PER_DIR * ROWS_PER_DIR
    return f"rows_{start}-{start + ROWS_PER_DIR}/data_{position}.ckpt"


def sample_tensors(input_ids: list[int], loss_mask: list[int], states: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sample as SpecForge stores it; both states are views of `states` [T, 4, H] (written as if contiguous)."""
    t, _, h = states.shape
    return {"input_ids": torch.tensor(input_ids, dtype=torch.long),
            "loss_mask": torch.tensor(loss_mask, dtype=torch.long),
            "hidden_state": states[:, 3].unsqueeze(0), "aux_hidden_state": states[:, :3].reshape(1, t, 3 * h)}


class SampleFileWriter(PerSampleWriter):
    """Files byte for byte what `torch.save` writes with its zip's CRC32 off (torch.load never checks it; it cost
    ~0.2 ms per 0.5 MB file), written straight from the batch's states (`torchzip`)."""

    @staticmethod
    def expected_file(position: int) -> str:
        return sample_file(position)

    def save(self, sample: Sample, states: torch.Tensor, path: Path) -> None:
        tensors = sample_tensors(sample.input_ids, sample.loss_mask, states)
        if torchzip.fits(tensors):
            with DirectFile(path) as f:
                torchzip.save(tensors, f)
            return
        # 4 GiB or more (~75k tokens of K2.5): torch.save writes the zip64 fields. It saves a view's whole
        # storage, so each state gets its own; the CRC switch is a context variable, set in the saving thread.
        own = {k: v.clone(memory_format=torch.contiguous_format) for k, v in tensors.items()}
        # (`patch` is added when torch installs its config modules: no stub has it)
        with serialization_config.patch({"save.compute_crc32": False}), path.open("wb") as f:  # type: ignore[attr-defined]
            torch.save(own, f)  # a file object: torch.save would name the archive after a path's dotted stem


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
