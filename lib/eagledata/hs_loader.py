"""Read stored hidden states back per sample, and check them against the records they came from.

Shards are opened lazily with safetensors slices, so one sample costs its own bytes only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

import torch

from .errors import InputError
from .hidden_states import INDEX, MANIFEST, IndexEntry, dequantize_fp8
from .records import Record


class SampleStates(NamedTuple):
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] int64
    aux_hidden_states: torch.Tensor  # [T, 3, H]: the three aux layers, in manifest `layers` order
    final_hidden_state: torch.Tensor  # [T, H]: post- or pre-norm, as manifest `final` says


class HiddenStates:
    """A finished hidden-states directory: `len`, ids, `[id]` or `[i]` access and iteration."""

    def __init__(self, directory: str | Path, dtype: torch.dtype | None = None):
        """`dtype`: what states come back as; None keeps bf16/fp32 storage as is and dequantizes fp8 to fp32."""
        self.directory = Path(directory)
        manifest = self.directory / MANIFEST
        if not manifest.is_file():
            raise InputError("no manifest.json: extraction has not finished (or wrong directory)", manifest)
        self.manifest: dict[str, Any] = json.loads(manifest.read_text())
        self.entries = [IndexEntry(**json.loads(line)) for line in (self.directory / INDEX).read_text().splitlines()
                        if line.strip()]
        self.by_id = {e.id: e for e in self.entries}
        self.dtype = dtype
        self._open: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.entries]

    def _shard(self, name: str) -> Any:
        from safetensors import safe_open

        if name not in self._open:
            self._open[name] = safe_open(str(self.directory / name), framework="pt")
        return self._open[name]

    def __getitem__(self, key: str | int) -> SampleStates:
        e = self.entries[key] if isinstance(key, int) else self.by_id[key]
        f = self._shard(e.shard)
        span = slice(e.offset, e.offset + e.length)
        states = f.get_slice("hidden_states")[span]
        if self.manifest["storage"] == "fp8":
            states = dequantize_fp8(states, f.get_slice("scales")[span])
        if self.dtype is not None:
            states = states.to(self.dtype)
        return SampleStates(f.get_slice("input_ids")[span].long(), f.get_slice("loss_mask")[span].long(),
                            states[:, :3], states[:, 3])

    def __iter__(self) -> Iterator[SampleStates]:
        for i in range(len(self.entries)):
            yield self[i]

    def items(self) -> Iterator[tuple[str, SampleStates]]:
        for i, e in enumerate(self.entries):
            yield e.id, self[i]

    def verify(self, records: Iterable[Record], *, cut: bool = True) -> int:
        """Stored ids and masks equal each record's `prompt_ids + output_ids` (a prefix when the
        assembly cut it, with `cut`); every record present. Returns the number checked."""
        n = 0
        for r in records:
            if r.id not in self.by_id:
                raise InputError(f"record {r.id!r} has no stored hidden states", self.directory / INDEX)
            got = self[r.id]
            ids, mask = r.input_ids, r.loss_mask
            length = len(got.input_ids)
            if length != len(ids) and not (cut and length < len(ids)):
                raise InputError(f"record {r.id!r}: {length} stored tokens, the record has {len(ids)}",
                                 self.directory / INDEX)
            if got.input_ids.tolist() != ids[:length] or got.loss_mask.tolist() != mask[:length]:
                raise InputError(f"record {r.id!r}: stored ids or loss mask differ from the record's",
                                 self.directory / INDEX)
            n += 1
        return n
