"""speculators' trainer as the experiment calls it: its flags for one arm (`train_args`), the split it is told to make
(`split_ratio`), the epoch folder it saved last (`last_checkpoint`) and the losses it logged per epoch
(`epoch_losses`). The trainer itself runs in the speculators environment (`train.py`).

speculators 0.9.0 has no separate validation file: it splits its one data set by position, the first
`int(len(data) * train_data_ratio)` rows for training and the rest for validation (`speculators.train.data`,
`ArrowDataset`), 0.9 by default. The experiment writes each arm's samples as its training samples followed by its
held-out validation samples and sets `--train-data-ratio` so that the split falls exactly between them: every
training sample is trained on, no validation sample is."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import InputError
from .config import QualityConfig

# speculators' own flags for a CPU run as `make test-interop` runs it; the sizes come from QualityConfig
TRAIN_FLAGS = ["--speculator-type", "eagle3", "--hidden-states-backend", "file", "--draft-attn-impl", "sdpa",
               "--loss-implementation", "eager", "--num-workers", "0", "--on-missing", "raise", "--mask-token-id",
               "0"]


def split_ratio(train: int, total: int) -> float:
    """The `train_data_ratio` that makes speculators' split (`int(total * ratio)`) fall exactly after the first
    `train` rows: half a row past the line, so float rounding cannot move it. Checked with the trainer's own
    expression; at least one row on each side."""
    if not 0 < train < total:
        raise InputError(f"{train} training rows of {total}: speculators needs rows on both sides of its split",
                         field="validation_conversations")
    ratio = (train + 0.5) / total
    if int(total * ratio) != train:
        raise AssertionError(f"ratio {ratio!r} splits {total} rows at {int(total * ratio)}, not {train}")
    return ratio


def train_args(config: QualityConfig, verifier: Path, data: Path, out: Path, *, train_samples: int,
               total_samples: int, token_freq: Path) -> list[str]:
    """`speculators train`'s flags for one arm: the same for both but for the data, its split (its own training
    samples, then the held-out validation samples: `split_ratio`), the shared draft vocabulary's counts and where
    it saves."""
    return [*TRAIN_FLAGS, "--draft-vocab-size", str(config.draft_vocab_size), "--total-seq-len",
            str(config.total_seq_len), "--seed", str(config.seed), "--lr", str(config.lr), "--epochs",
            str(config.epochs), "--verifier-name-or-path", str(verifier), "--data-path", str(data), "--save-path",
            str(out / "checkpoints"), "--log-dir", str(out / "logs"), "--train-data-ratio",
            repr(split_ratio(train_samples, total_samples)), "--token-freq-path", str(token_freq)]


def last_checkpoint(save_path: Path) -> Path:
    """The last epoch's folder speculators saved (`<save-path>/<epoch>/`)."""
    epochs = [p for p in save_path.iterdir() if p.is_dir() and p.name.isdigit()] if save_path.is_dir() else []
    if not epochs:
        raise InputError("speculators saved no epoch folder", save_path)
    return max(epochs, key=lambda p: int(p.name))



def epoch_losses(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per epoch, from the trainer's metric records (`train.py`'s metrics.jsonl): the mean training loss over its
    logged steps and the validation loss (`val.loss_epoch`, the mean over the held-out batches), `None` where the
    epoch logged none."""
    train: dict[int, list[float]] = {}
    val: dict[int, float] = {}
    for r in records:
        if "train" in r and "loss" in r["train"]:
            train.setdefault(int(r["epoch"]), []).append(float(r["train"]["loss"]))
        elif "val" in r and "loss_epoch" in r["val"]:
            val[int(r["epoch"])] = float(r["val"]["loss_epoch"])
    return [{"epoch": e, "train_loss": sum(train[e]) / len(train[e]) if e in train else None,
             "validation_loss": val.get(e)} for e in sorted(set(train) | set(val))]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
