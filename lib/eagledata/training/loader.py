"""Read a finished hidden-states set back per sample, whatever its layout, and check it against the records."""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..paths import HiddenStateFiles
from ..records import Record
from .storage import SampleStates, get_layout, read_index


class HiddenStates:
    """A finished hidden-states directory (any layout): `len`, ids, `[id]` or `[i]` access and iteration."""

    def __init__(self, directory: str | Path, dtype: torch.dtype | None = None):
        """`dtype`: what states come back as; None keeps bf16/fp32 storage as is and dequantizes fp8 to fp32."""
        self.files = HiddenStateFiles(Path(directory))
        manifest = self.files.manifest
        if not manifest.is_file():
            raise InputError("no manifest.json: extraction has not finished (or wrong directory)", manifest)
        self.manifest: dict[str, Any] = json.loads(manifest.read_text())
        self.layout = get_layout(self.manifest.get("layout", "eagledata"))
        self.entries = read_index(self.files)
        self.by_id = {e.id: e for e in self.entries}
        self.dtype = dtype
        self.reader = self.layout.reader(self.files.directory, self.manifest, self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.entries]

    def __getitem__(self, key: str | int) -> SampleStates:
        got = self.reader.read(self.entries[key] if isinstance(key, int) else self.by_id[key])
        if self.dtype is not None:
            got = got._replace(aux_hidden_states=got.aux_hidden_states.to(self.dtype),
                               final_hidden_state=got.final_hidden_state.to(self.dtype))
        return got

    def __iter__(self) -> Iterator[SampleStates]:
        for i in range(len(self.entries)):
            yield self[i]

    def items(self) -> Iterator[tuple[str, SampleStates]]:
        for i, e in enumerate(self.entries):
            yield e.id, self[i]

    def verify(self, records: Iterable[Record], *, shortened: bool = True) -> int:
        """Stored ids and masks equal each record's `prompt_ids + output_ids` (a prefix when the assembly shortened
        it, with `shortened`: the max-length policy's truncation); every record present. Returns the number checked."""
        n = 0
        for r in records:
            if r.id not in self.by_id:
                raise InputError(f"record {r.id!r} has no stored hidden states", self.files.index)
            got = self[r.id]
            ids, mask = r.input_ids, r.loss_mask
            length = len(got.input_ids)
            if length != len(ids) and not (shortened and length < len(ids)):
                raise InputError(f"record {r.id!r}: {length} stored tokens, the record has {len(ids)}",
                                 self.files.index)
            if got.input_ids.tolist() != ids[:length] or got.loss_mask.tolist() != mask[:length]:
                raise InputError(f"record {r.id!r}: stored ids or loss mask differ from the record's",
                                 self.files.index)
            n += 1
        return n


def layer_labels(manifest: dict[str, Any]) -> list[str]:
    return [f"aux h[{i}]" for i in manifest["layers"]] + [f"final ({manifest['final'].replace('_', '-')})"]


def state_norms(hs: HiddenStates, max_samples: int = 64) -> Any:
    """Per-token L2 norms of each stored state (first `max_samples` samples): a frame with
    columns sample, position, layer, norm, loss — the data behind the sanity plot."""
    import pandas as pd

    labels = layer_labels(hs.manifest)
    frames = []
    for i in range(min(max_samples, len(hs))):
        s = hs[i]
        states = torch.cat([s.aux_hidden_states, s.final_hidden_state[:, None]], 1).float()
        norms = states.norm(dim=-1)  # [T, 4]
        t = norms.shape[0]
        for k, label in enumerate(labels):
            frames.append(pd.DataFrame({"sample": hs.entries[i].id, "position": range(t), "layer": label,
                                        "norm": norms[:, k].numpy(), "loss": s.loss_mask.numpy()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["sample", "position", "layer", "norm", "loss"])


def plot_state_norms(hs: HiddenStates, max_samples: int = 64) -> Any:
    """Mean norm by position per layer, and the norm distribution per layer.

    What to look for: smooth curves growing with depth; a spike at position 0 is the usual
    attention-sink token; flat zeros or NaNs would mean a capture or storage fault.
    """
    import matplotlib.pyplot as plt

    df = state_norms(hs, max_samples)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    for label, group in df.groupby("layer", sort=False):
        by_pos = group.groupby("position")["norm"].mean()
        left.plot(by_pos.index, by_pos.values, label=label)
    left.set_xlabel("position")
    left.set_ylabel("mean L2 norm")
    left.set_yscale("log")
    left.set_title(f"Hidden-state norms by position ({df['sample'].nunique()} samples)")
    left.legend()
    labels = list(dict.fromkeys(df["layer"]))
    right.boxplot([df.loc[df["layer"] == lb, "norm"].values for lb in labels], showfliers=False)
    right.set_xticks(range(1, len(labels) + 1), labels)
    right.set_ylabel("L2 norm per token")
    right.set_yscale("log")
    right.set_title("Norm distribution by layer")
    fig.tight_layout()
    return fig


def summary(hs: HiddenStates) -> dict[str, Any]:
    """The manifest's headline figures, with the bytes a token costs against the 8·H bf16 reference."""
    m = hs.manifest
    return {"model": m["model"], "layout": hs.layout.name, "layers (HF hidden_states)": m["layers"],
            "final": m["final"], "storage": m["dtype"], "hidden size": m["hidden_size"],
            "samples": m["num_samples"], "tokens": m["num_tokens"], "loss tokens": m["num_loss_tokens"],
            "files": m.get("num_files", len(m["shards"])), "bytes": m["bytes"],
            "bytes per token": round(m["bytes_per_token"], 1), "bf16 reference 8·H": 8 * m["hidden_size"],
            "reconstruction rel. RMSE": f"{m['reconstruction_rel_rmse']:.2e}"}
