"""Run speculators' own trainer (what `speculators train` runs), on CPU too, and keep the metrics it logs: the
experiment's training stage (`DrafterStages.train_arm`, its flags from `trainer.train_args`).

Runs in the speculators environment (`.venv-interop`: speculators 0.9.0), never in the project's own, with only
this package's lib/ on its path (`measure.measure_command`'s PYTHONPATH): stdlib and torch here, and of the project
only `progress` (stdlib and `eagledata.status`). `python -m eagledata.quality.train METRICS.jsonl ARGS...`, with
ARGS exactly the flags of `speculators train`. It resolves them with
`speculators.train.config.TrainConfig.resolve(ARGS)` and calls `speculators.train.cli.main`, as the
`speculators train` command does (`speculators/cli/train.py`): the data loader, the model, the loss, the optimizer
and the loop are the trainer's own.

Where no accelerator is present it puts three stand-ins in place, in this process only:
- `speculators.train.trainer.get_local_rank` returns "cpu": the trainer moves the model and every batch to
  `get_local_rank()` (0, i.e. cuda:0, outside torchrun);
- `torch.accelerator.synchronize` does nothing: the trainer's step timer calls it on every logged step, and it
  raises without an accelerator;
- `speculators.train.checkpointer.get_current_device` returns "cpu": resuming from a saved epoch loads the
  weights and the optimizer's state onto it ("cuda:0" without an accelerator, where loading fails).
With an accelerator it changes nothing (and on a GPU one runs `speculators train` itself).

Every record the trainer logs to its metric logger (`speculators.metrics`: `{"train": {...}, "global_step": n,
...}` per logged step, `{"val": {...}, "epoch": e}` per epoch) is appended to METRICS.jsonl as one JSON line.

Its console is plain text (`plain_console`), never a terminal's: the trainer's `tqdm.rich` bar is replaced by
`progress.Steps`, which counts the steps for `progress.TrainProgress` (one line every `$EAGLEDATA_PROGRESS_S`
seconds, 10 by default, and one at each epoch's end: `epoch 1/2 step 47/100 loss 4.512 3.90 it/s ETA 1m05s`), and
its rich log handler by a plain one with the same filters (a metric record still printed as `train/loss=…`).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from eagledata.quality.progress import Steps, TrainProgress


class MetricsFile(logging.Handler):
    """The trainer's metric records (dicts logged to `speculators.metrics`), one JSON line each."""

    def __init__(self, path: str, on_record: Callable[[dict[str, Any]], None] | None = None):
        super().__init__()
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at exit)
        self.on_record = on_record

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "speculators.metrics" and isinstance(record.msg, dict):
            self.file.write(json.dumps(record.msg, default=float) + "\n")
            self.file.flush()
            if self.on_record is not None:
                self.on_record(record.msg)


def plain_console(progress: TrainProgress) -> None:
    """The trainer's console as plain lines on stdout: the root logger's handler (what the trainer's
    `setup_root_logger` would make, with its `FormatDictFilter` and `IsRank0Filter`, without rich; the trainer's own
    call then finds the root set up and adds nothing), and its progress bars replaced by `Steps` counting for
    `progress` (which loop asks, which epoch and how many epochs from `Trainer.train_epoch` / `val_epoch`)."""
    import speculators.train.trainer as trainer
    from speculators.train.logger import FormatDictFilter, IsRank0Filter

    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(FormatDictFilter())
    handler.addFilter(IsRank0Filter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("httpx").propagate = False

    asking: dict[str, Any] = {}

    def telling(method: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def run(self: Any, epoch: int, *args: Any, **kwargs: Any) -> Any:
            # resumed mid-epoch, `train_epoch` skips the steps its checkpoint holds (`_prepare_resume_skip` reads
            # them here, then clears them) and its loader holds only the rest: the line counts them as done
            skipped = (getattr(self, "_resume_local_step", 0) or 0
                       if phase == "train" and epoch == getattr(self, "current_epoch", epoch) else 0)
            asking.update(phase=phase, epoch=epoch, epochs=self.config.num_epochs, max_steps=self.config.max_steps,
                          skipped=skipped)
            return method(self, epoch, *args, **kwargs)
        return run

    trainer.Trainer.train_epoch = telling(trainer.Trainer.train_epoch, "train")
    trainer.Trainer.val_epoch = telling(trainer.Trainer.val_epoch, "validation")
    trainer.tqdm = lambda iterable, *args, **kwargs: Steps(iterable, progress, lambda: dict(asking))


def cpu_stand_ins() -> list[str]:
    """The two stand-ins the trainer needs without an accelerator (none with one); the names of those applied."""
    import torch

    if torch.accelerator.is_available():
        return []
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    checkpointer.get_current_device = lambda: "cpu"
    return ["speculators.train.trainer.get_local_rank -> 'cpu'", "torch.accelerator.synchronize -> no-op",
            "speculators.train.checkpointer.get_current_device -> 'cpu'"]


def main(metrics: str, argv: list[str]) -> None:
    from speculators.train.cli import main as train
    from speculators.train.config import TrainConfig

    applied = cpu_stand_ins()
    progress = TrainProgress(float(os.environ.get("EAGLEDATA_PROGRESS_S", "10")))
    # The trainer's console set up here, plain (its own basicConfig is then a no-op), our file ahead of it on the
    # root logger, where the metric logger propagates (the trainer's dictConfig leaves the root alone): the
    # console handler's filter rewrites a record's dict into a line of text, rounded to 3 decimals.
    plain_console(progress)
    root = logging.getLogger()
    root.handlers.insert(0, MetricsFile(metrics, on_record=progress.record))
    print(json.dumps({"stand_ins": applied}), flush=True)
    train(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
