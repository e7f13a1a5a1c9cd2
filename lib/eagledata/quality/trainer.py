"""speculators' trainer as the experiment calls it: its flags for one arm (`train_args`), the split it is told to make
(`split_ratio`), the epoch folder it saved last (`last_checkpoint`), the losses it logged per epoch
(`epoch_losses`) and where a stopped try goes on (`whole_epochs`). The trainer itself runs in the speculators
environment (`train.py`).

speculators 0.9.0 has no separate validation file: it splits its one data set by position, the first
`int(len(data) * train_data_ratio)` rows for training and the rest for validation (`speculators.train.data`,
`ArrowDataset`), 0.9 by default. The experiment writes each arm's samples as its training samples followed by its
held-out validation samples and sets `--train-data-ratio` so that the split falls exactly between them: every
training sample is trained on, no validation sample is."""
from __future__ import annotations

import json
import shutil
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


# what speculators writes into <save-path>/<epoch>/ at an epoch's end, its validation logged after them
EPOCH_FILES = ("model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt", "training_state.json")


def whole_epochs(out: Path, command: list[str]) -> int:
    """How many epochs an earlier try of `command` left whole in `out` (`train_arm`'s folder: `command.json`, the
    trainer's metrics.jsonl and checkpoints/), so that the next try goes on after them; 0 where there was none or it
    ran another command. speculators resumes by itself from its highest epoch folder (model, optimizer, scheduler,
    the step count; each epoch's batches drawn from the seed and the epoch alone; the weights and the optimizer's
    state saved in bfloat16, its `save_checkpoint` default, so a resumed training goes on from them rounded: the grid's
    d0-s1 came out within τ's third decimal of an uninterrupted run, not bit for bit), but it saves an epoch before
    validating it and marks a new best after that: epoch e is whole when its four files are there, its validation
    loss is logged, and, where that loss is the lowest yet (speculators' test: below every earlier one), its
    `val_metrics.json` is written too. Every whole epoch before it must be whole as well (the curve has no gap).

    Removes what the next try makes again: epoch folders after the last whole one, an `interrupted` folder (a
    mid-epoch save, never resumed from here), links into removed folders, and the metric records of the epochs
    after it; the config record of each try stays."""
    saved = out / "command.json"
    if not saved.is_file() or json.loads(saved.read_text()) != command:
        return 0
    metrics, checkpoints = out / "metrics.jsonl", out / "checkpoints"
    records = read_metrics(metrics) if metrics.is_file() else []
    val = {int(r["epoch"]): float(r["val"]["loss_epoch"]) for r in records if "val" in r and "loss_epoch" in r["val"]}
    kept, best = 0, float("inf")
    while kept in val and all((checkpoints / str(kept) / name).is_file() for name in EPOCH_FILES):
        if val[kept] < best:
            if not (checkpoints / str(kept) / "val_metrics.json").is_file():
                break
            best = val[kept]
        kept += 1
    if checkpoints.is_dir():
        for path in sorted(checkpoints.iterdir()):
            stale = path.name == "interrupted" or (path.name.isdigit() and int(path.name) >= kept)
            if path.is_dir() and not path.is_symlink() and stale:
                shutil.rmtree(path)
        for path in checkpoints.iterdir():
            if path.is_symlink() and not path.exists():
                path.unlink()
    if metrics.is_file():
        metrics.write_text("".join(json.dumps(r) + "\n" for r in records if int(r.get("epoch", -1)) < kept))
    return kept


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
