"""eagledata's own layout: `shard-NNNNN.safetensors` files of many samples back to back, no padding.

Each shard holds `input_ids` [T] int32, `loss_mask` [T] uint8, `hidden_states` [T, 4, H] (and `scales`
[T, 4] float32 for fp8). A finished shard is claimed with `os.link` under the lowest free name, which never
overwrites, so ranks and runs of any world size never collide.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import torch

from ...files import fsync
from ..assembly import Sample
from .common import FORMAT, IndexEntry, Layout, Reader, StateWriter, WriteBatch, dequantize_fp8


def _claim_shard(directory: Path, tmp: Path) -> str:
    n = len(list(directory.glob("shard-*.safetensors")))
    while True:
        name = f"shard-{n:05d}.safetensors"
        try:
            os.link(tmp, directory / name)
        except FileExistsError:
            n += 1
            continue
        tmp.unlink()
        fsync(directory)
        return name


class ShardWriter(StateWriter):
    def _write(self, batch: WriteBatch) -> list[IndexEntry]:
        from safetensors.torch import save_file

        states, scales = batch.joined()
        tensors = {
            "input_ids": torch.tensor([i for s in batch.samples for i in s.input_ids], dtype=torch.int32),
            "loss_mask": torch.tensor([m for s in batch.samples for m in s.loss_mask], dtype=torch.uint8),
            "hidden_states": states,
        }
        if scales is not None:
            tensors["scales"] = scales
        directory = self.files.directory
        tmp = directory / f".shard-tmp-{uuid.uuid4().hex}.safetensors"
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
        os.chmod(tmp, 0o644)  # safetensors creates 0600; shards are shared data like every other output
        fsync(tmp)
        name = _claim_shard(directory, tmp)
        return [IndexEntry(s.id, name, offset, length) for s, (offset, length) in zip(batch.samples, batch.spans())]


def finish(directory: Path, manifest: dict, entries: list[IndexEntry], samples: list[Sample]) -> None:
    """Shards claimed by a killed run before their index line was written are removed."""
    kept = {e.shard for e in entries}
    for stray in [*directory.glob("shard-*.safetensors"), *directory.glob(".shard-tmp-*")]:
        if stray.name not in kept:
            stray.unlink()


class ShardReader(Reader):
    """Shards opened lazily with safetensors slices, so one sample costs its own bytes only."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._open: dict[str, object] = {}
        self._ids: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _shard(self, name: str):
        from safetensors import safe_open

        if name not in self._open:
            self._open[name] = safe_open(str(self.directory / name), framework="pt")
        return self._open[name]

    def _states(self, shard: str, span: slice) -> torch.Tensor:
        f = self._shard(shard)
        states = f.get_slice("hidden_states")[span]
        return dequantize_fp8(states, f.get_slice("scales")[span]) if self.manifest["storage"] == "fp8" else states

    def read_states(self, entry: IndexEntry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self._shard(entry.shard)
        span = slice(entry.offset, entry.offset + entry.length)
        return f.get_slice("input_ids")[span], f.get_slice("loss_mask")[span], self._states(entry.shard, span)

    def read_run(self, entries: Sequence[IndexEntry]) -> torch.Tensor:
        first, last = entries[0], entries[-1]
        if all(e.shard == first.shard for e in entries) and all(
                b.offset == a.offset + a.length for a, b in zip(entries, entries[1:])):
            return self._states(first.shard, slice(first.offset, last.offset + last.length))
        return super().read_run(entries)

    def ids(self, entry: IndexEntry) -> tuple[list[int], list[int]]:
        if entry.shard not in self._ids:  # a shard's ids are small: read them once, not once per sample
            f = self._shard(entry.shard)
            self._ids[entry.shard] = f.get_tensor("input_ids"), f.get_tensor("loss_mask")
        ids, mask = self._ids[entry.shard]
        span = slice(entry.offset, entry.offset + entry.length)
        return ids[span].tolist(), mask[span].tolist()


LAYOUT = Layout("eagledata", ShardWriter, ShardReader, finish, final=None,
                about="eagledata.training.HiddenStates(<this directory>)",
                files="shard-NNNNN.safetensors: input_ids [T], loss_mask [T], hidden_states [T, 4, H] of many samples",
                storages=("bf16", "fp8", "fp32"))
