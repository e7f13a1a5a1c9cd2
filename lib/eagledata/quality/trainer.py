"""speculators' trainer as the experiment calls it: its flags for one arm (`train_args`), the epoch folder it saved
last (`last_checkpoint`) and the losses it logged (`epoch_losses`). The trainer itself runs in the speculators
environment (`train.py`)."""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .config import QualityConfig

# speculators' own flags for a CPU run as `make test-interop` runs it; the sizes come from QualityConfig
TRAIN_FLAGS = ["--speculator-type", "eagle3", "--hidden-states-backend", "file", "--draft-attn-impl", "sdpa",
               "--loss-implementation", "eager", "--num-workers", "0", "--on-missing", "raise", "--mask-token-id",
               "0"]


def train_args(config: QualityConfig, verifier: Path, data: Path, out: Path) -> list[str]:
    """`speculators train`'s flags for one arm: the same for both but for the data and where it saves."""
    return [*TRAIN_FLAGS, "--draft-vocab-size", str(config.draft_vocab_size), "--total-seq-len",
            str(config.total_seq_len), "--seed", str(config.seed), "--lr", str(config.lr), "--epochs",
            str(config.epochs), "--verifier-name-or-path", str(verifier), "--data-path", str(data), "--save-path",
            str(out / "checkpoints"), "--log-dir", str(out / "logs")]


def last_checkpoint(save_path: Path) -> Path:
    """The last epoch's folder speculators saved (`<save-path>/<epoch>/`)."""
    epochs = [p for p in save_path.iterdir() if p.is_dir() and p.name.isdigit()] if save_path.is_dir() else []
    if not epochs:
        raise InputError("speculators saved no epoch folder", save_path)
    return max(epochs, key=lambda p: int(p.name))

