"""Read SpecForge offline EAGLE-3 feature files exactly as upstream does.

Re-implemented in our own words (no upstream code copied) from
sgl-project/SpecForge @ a6b6b0230009d15ec2a97a57384e6f53f0f96946 (2026-08-08, version.txt 0.2.0):
  - specforge/data/preprocessing.py: list_local_files, OfflineEagle3Dataset._open_file,
    OfflineEagle3Dataset.process_data, process_offline_eagle3_sample
  - specforge/runtime/data_plane/offline_reader.py: list_feature_files (current trainer path)
  - specforge/runtime/data_plane/feature_store.py: load_feature_file
  - specforge/algorithms/eagle3/data.py: normalize_offline_sample (same transform as process_data)
  - scripts/prepare_hidden_states.py: HiddenStatesGenerator._get_file_path / _save_tensor_sync (writer side)

File contract (one sample per file, torch.save of a plain dict):
  input_ids         [T]        int64
  loss_mask         [T]        int64 (0/1)
  aux_hidden_state  [1, T, 3H] target dtype (bf16 for a bf16 target); 3 aux layers concatenated on the last dim
  hidden_state      [1, T, H]  target dtype; final hidden state AFTER the model's final norm
Path: <root>/rows_<g>-<g+2000>/data_<idx>.ckpt  (or .ckpt.gz when gzip-compressed); g = idx // 2000 * 2000.
Discovery: recursive os.walk under <root>, keep names ending ".ckpt" or ".ckpt.gz", sort the full path
strings lexicographically (so data_10 sorts before data_2: order is by string, not by idx).

Usage as a script: python tests/helpers/specforge_reader.py <root> [max_len]  -> prints what each file yields.
The tests read our `specforge` layout through it.
"""

from __future__ import annotations

import gzip
import io
import os
import sys

import torch

FEATURE_SUFFIXES = (".ckpt", ".ckpt.gz")
REQUIRED_KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")
FILE_GROUP_SIZE = 2000  # prepare_hidden_states.py --file-group-size default


def feature_path(root: str, idx: int, compressed: bool = False, group: int = FILE_GROUP_SIZE) -> str:
    """Where upstream's generator writes sample ``idx`` (global row index)."""
    start = (idx // group) * group
    ext = ".ckpt.gz" if compressed else ".ckpt"
    return os.path.join(root, f"rows_{start}-{start + group}", f"data_{idx}{ext}")


def list_feature_files(root: str) -> list[str]:
    """All feature files below ``root`` (any depth), sorted by full path string.

    The legacy list_local_files returns root-joined paths; the current
    OfflineManifestReader returns absolute paths and also accepts ``root`` being
    a single file. Both keep only the two suffixes and sort.
    """
    if os.path.isfile(root):
        return [os.path.abspath(root)]
    found = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(FEATURE_SUFFIXES):
                found.append(os.path.abspath(os.path.join(dirpath, name)))
    return sorted(found)


def load_feature_file(path: str) -> dict[str, torch.Tensor]:
    """torch.load with pickle allowed; gzip files are read fully into memory first."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return torch.load(io.BytesIO(fh.read()), weights_only=False)
    return torch.load(path, weights_only=False, mmap=True)


def normalize(raw: dict[str, torch.Tensor], max_len: int) -> dict[str, torch.Tensor]:
    """What OfflineEagle3Dataset.process_data / normalize_offline_sample return for one file.

    - drops the stored batch dim of the two state tensors, truncates every tensor to the
      first ``max_len`` positions, and adds a batch dim of 1 back;
    - renames: aux_hidden_state -> "hidden_state" (draft input), hidden_state -> "target";
    - zeroes the LAST position of the (truncated) loss mask;
    - attention_mask = ones like loss_mask (int64);
    - no shift here: the shift happens in training (TargetHead.preprocess: target and
      input_ids move left by one with a zero appended, loss_mask gets a trailing dim).
    Note: upstream's legacy process_data writes the zero into the loaded tensor without
    cloning; the newer normalize_offline_sample clones first. We clone.
    """
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise KeyError(f"missing offline feature keys {missing}")
    aux = raw["aux_hidden_state"].squeeze(0)[:max_len].unsqueeze(0)
    target = raw["hidden_state"].squeeze(0)[:max_len].unsqueeze(0)
    input_ids = raw["input_ids"][:max_len].unsqueeze(0)
    loss_mask = raw["loss_mask"][:max_len].clone().unsqueeze(0)
    if loss_mask.numel() > 0:
        loss_mask[0, -1] = 0
    return {
        "attention_mask": torch.ones_like(loss_mask, dtype=torch.long),
        "loss_mask": loss_mask,
        "target": target,
        "hidden_state": aux,
        "input_ids": input_ids,
    }


def training_shift(input_ids: torch.Tensor, target: torch.Tensor, loss_mask: torch.Tensor):
    """TargetHead.preprocess (specforge/modeling/target/target_head.py) + specforge.utils.padding(left=False)."""

    def left(t: torch.Tensor) -> torch.Tensor:
        return torch.cat((t[:, 1:], torch.zeros_like(t[:, -1:])), dim=1)

    return left(input_ids), left(target), loss_mask[..., None]


def read_dataset(root: str, max_len: int = 2048) -> list[dict[str, torch.Tensor]]:
    """Every sample under ``root`` in upstream order, normalized."""
    return [normalize(load_feature_file(p), max_len) for p in list_feature_files(root)]


if __name__ == "__main__":
    ml = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    for path in list_feature_files(sys.argv[1]):
        item = normalize(load_feature_file(path), ml)
        print(path, {k: (tuple(v.shape), str(v.dtype)) for k, v in item.items()})
