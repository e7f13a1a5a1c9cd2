"""Run speculators' own trainer (what `speculators train` runs), on CPU too, and keep the metrics it logs: the
experiment's training stage (`experiment.train_command`).

Runs in the speculators environment (`.venv-interop`: speculators 0.9.0), never in the project's own, with only
this package's lib/ on its path (`measure.measure_command`'s PYTHONPATH): stdlib and torch here, nothing else of
the project. `python -m eagledata.quality.train METRICS.jsonl ARGS...`, with ARGS exactly the flags of
`speculators train`. It resolves them with `speculators.train.config.TrainConfig.resolve(ARGS)` and calls
`speculators.train.cli.main`, as the `speculators train` command does (`speculators/cli/train.py`): the data
loader, the model, the loss, the optimizer and the loop are the trainer's own.

Where no accelerator is present it puts two stand-ins in place, in this process only:
- `speculators.train.trainer.get_local_rank` returns "cpu": the trainer moves the model and every batch to
  `get_local_rank()` (0, i.e. cuda:0, outside torchrun);
- `torch.accelerator.synchronize` does nothing: the trainer's step timer calls it on every logged step, and it
  raises without an accelerator.
With an accelerator it changes nothing (and on a GPU one runs `speculators train` itself).

Every record the trainer logs to its metric logger (`speculators.metrics`: `{"train": {...}, "global_step": n,
...}` per logged step, `{"val": {...}, "epoch": e}` per epoch) is appended to METRICS.jsonl as one JSON line.
"""
from __future__ import annotations

import json
import logging
import sys


class MetricsFile(logging.Handler):
    """The trainer's metric records (dicts logged to `speculators.metrics`), one JSON line each."""

    def __init__(self, path: str):
        super().__init__()
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at exit)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "speculators.metrics" and isinstance(record.msg, dict):
            self.file.write(json.dumps(record.msg, default=float) + "\n")
            self.file.flush()


def cpu_stand_ins() -> list[str]:
    """The two stand-ins the trainer needs without an accelerator (none with one); the names of those applied."""
    import torch

    if torch.accelerator.is_available():
        return []
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    return ["speculators.train.trainer.get_local_rank -> 'cpu'", "torch.accelerator.synchronize -> no-op"]


def main(metrics: str, argv: list[str]) -> None:
    from speculators.train.cli import main as train
    from speculators.train.config import TrainConfig
    from speculators.train.logger import setup_root_logger

    applied = cpu_stand_ins()
    # The trainer's own console logging set up here (its own basicConfig is then a no-op), our file ahead of it
    # on the root logger, where the metric logger propagates (the trainer's dictConfig leaves the root alone):
    # the console handler's filter rewrites a record's dict into a line of text, rounded to 3 decimals.
    setup_root_logger()
    root = logging.getLogger()
    root.handlers.insert(0, MetricsFile(metrics))
    print(json.dumps({"stand_ins": applied}), flush=True)
    train(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
