"""speculators' trainer as the experiment calls it: its flags for one arm (`train_args`), the split it is told to make
(`split_ratio`), the epoch folder it saved last (`last_checkpoint`), the losses it logged per epoch
(`epoch_losses`) and where a stopped try goes on (`resume_point`). The trainer itself runs in the speculators
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
from dataclasses import dataclass
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
    it saves, a checkpoint every `checkpoint_every` of an epoch (`resume_point` goes on from the last)."""
    return [*TRAIN_FLAGS, "--draft-vocab-size", str(config.draft_vocab_size), "--total-seq-len",
            str(config.total_seq_len), "--seed", str(config.seed), "--lr", str(config.lr), "--epochs",
            str(config.epochs), "--checkpoint-freq", repr(config.checkpoint_every), "--verifier-name-or-path",
            str(verifier), "--data-path", str(data), "--save-path", str(out / "checkpoints"), "--log-dir",
            str(out / "logs"), "--train-data-ratio", repr(split_ratio(train_samples, total_samples)),
            "--token-freq-path", str(token_freq)]


def last_checkpoint(save_path: Path) -> Path:
    """The last epoch's folder speculators saved (`<save-path>/<epoch>/`)."""
    epochs = [p for p in save_path.iterdir() if p.is_dir() and p.name.isdigit()] if save_path.is_dir() else []
    if not epochs:
        raise InputError("speculators saved no epoch folder", save_path)
    return max(epochs, key=lambda p: int(p.name))


# what speculators writes into <save-path>/<epoch>/ at an epoch's end, its validation logged after them
EPOCH_FILES = ("model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt", "training_state.json")


@dataclass(frozen=True)
class Resume:
    """Where a try of a training goes on from what an earlier try left (`resume_point`): after `epochs` whole
    epochs and, where a mid-epoch checkpoint of the next one was saved whole, after `steps` of its steps. False where
    nothing is kept."""

    epochs: int = 0
    steps: int = 0

    def __bool__(self) -> bool:
        return self.epochs > 0 or self.steps > 0

    def describe(self, of_epochs: int) -> str:
        if self.steps:
            return f"in epoch {self.epochs + 1} of {of_epochs} after its step {self.steps}"
        return f"after epoch {self.epochs} of {of_epochs}"


def mid_epoch(folder: Path, epoch: int) -> tuple[int, int] | None:
    """(steps into `epoch`, optimizer steps in all) of a mid-epoch checkpoint of `epoch` (`--checkpoint-freq` below
    1) saved whole in `folder`; None where there is none. speculators writes an epoch folder's files in
    `EPOCH_FILES` order, training_state.json last: one older than any file before it belongs to an earlier save that
    a stop cut while overwriting the folder, and is not resumed from."""
    files = [folder / name for name in EPOCH_FILES]
    if not all(f.is_file() for f in files):
        return None
    try:
        state = json.loads(files[-1].read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("epoch") != epoch or int(state.get("local_step", 0)) <= 0:
        return None
    written = files[-1].stat().st_mtime_ns
    if any(f.stat().st_mtime_ns > written for f in files[:-1]):
        return None
    return int(state["local_step"]), int(state["global_step"])


def resume_point(out: Path, command: list[str]) -> Resume:
    """What an earlier try of `command` left in `out` (`train_arm`'s folder: `command.json`, the trainer's
    metrics.jsonl and checkpoints/) that the next try goes on from; nothing where there was none or it ran another
    command. speculators resumes by itself from its highest epoch folder (model, optimizer, scheduler, the step
    count; each epoch's batches drawn from the seed and the epoch alone, a mid-epoch resume skipping the batches
    done; the weights and the optimizer's state saved in bfloat16, its `save_checkpoint` default, so a resumed
    training goes on from them rounded: the grid's d0-s1 came out within τ's third decimal of an uninterrupted run,
    not bit for bit), but it saves an epoch before validating it and marks a new best after that: epoch e is whole
    when its four files are there, its validation loss is logged, and, where that loss is the lowest yet
    (speculators' test: below every earlier one), its `val_metrics.json` is written too. Every whole epoch before it
    must be whole as well (the curve has no gap). After the whole epochs, the next one's mid-epoch checkpoint is
    kept where it was saved whole (`mid_epoch`).

    Removes what the next try makes again: epoch folders after what is kept, an `interrupted` folder (a save on a
    signal, with no step count: never resumed from here), links into removed folders, and the metric records of
    the steps and epochs after what is kept; the config record of each try stays."""
    saved = out / "command.json"
    if not saved.is_file() or json.loads(saved.read_text()) != command:
        return Resume()
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
    steps, global_steps = mid_epoch(checkpoints / str(kept), kept) or (0, None)
    if checkpoints.is_dir():
        for path in sorted(checkpoints.iterdir()):
            stale = path.name == "interrupted" or (path.name.isdigit() and int(path.name) >= kept + bool(steps))
            if path.is_dir() and not path.is_symlink() and stale:
                shutil.rmtree(path)
        for path in checkpoints.iterdir():
            if path.is_symlink() and not path.exists():
                path.unlink()
    if metrics.is_file():
        def done(r: dict[str, Any]) -> bool:
            epoch = int(r.get("epoch", -1))
            return epoch < kept or (epoch == kept and global_steps is not None and "train" in r
                                    and int(r.get("global_step", global_steps)) < global_steps)

        metrics.write_text("".join(json.dumps(r) + "\n" for r in records if done(r)))
    return Resume(kept, steps)


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
