"""The trainer's progress as plain lines, and a child command's output relayed without control codes.

speculators' loop draws its progress with `tqdm.rich` and logs through rich's `RichHandler`; under a Jupyter kernel
(papermill, quality.ipynb) the environment says `FORCE_COLOR=1` (ipykernel sets it), so rich takes the pipe for a
terminal and `make quality`'s log and notebook got `\\x1b[2KEpoch 1\\x1b[35m  47%…` every 30 s. Three layers, so that
no escape code reaches either:

- in the trainer's process (`train.py`), `TrainProgress` replaces the bar: the loop's steps are counted, the loss
  taken from the metric records the trainer logs, and one plain line said every `interval_s` (`status.StatusLog`,
  injected clock), `epoch 1/2 step 47/100 loss 4.512 3.90 it/s ETA 1m05s`, and one at the end of each epoch;
- the child command's environment says it is no terminal (`plain_env`: `TTY_COMPATIBLE=0`, `NO_COLOR`, `TERM=dumb`,
  no `FORCE_COLOR`);
- whatever still comes (another library's bar, a warning) is cleaned by `Relay`: every escape sequence and control
  character removed, a `\\r` ends a line, before the line is written to the command's log or said.

Stdlib only (with `eagledata.status`): it also runs in the speculators environment.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..status import StatusLog, duration, eta_s

# ESC followed by a CSI sequence (colours, erase line, cursor), an OSC string (rich's hyperlinks, ended by BEL or
# ESC \) or a single-character escape; then every other C0 control but tab and newline, and DEL.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])?")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BREAK = re.compile(r"\r\n|\r|\n")

# the child's progress line, as `TrainProgress.line` writes it (found anywhere in a log line: the handler's time
# and level come first)
PROGRESS = re.compile(r"epoch \d+/\d+ (?:step|validation) \d+/\d+\b.*$")

# a child command told that its output is no terminal, in every way rich, tqdm and the rest look
NOT_A_TERMINAL = {"TTY_COMPATIBLE": "0", "TTY_INTERACTIVE": "0", "NO_COLOR": "1", "TERM": "dumb"}
FORCING = ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS")


def plain_lines(text: str) -> list[str]:
    """`text` as a log should hold it: a line per `\\r` or newline (a bar redrawn in place gives each state it
    drew), escape sequences and other control characters removed, trailing blanks stripped, blank lines left out."""
    lines = (_CONTROL.sub("", _ESCAPE.sub("", part)).rstrip() for part in _BREAK.split(text))
    return [line for line in lines if line.strip()]


def plain_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a child whose output goes to a pipe and a log: the variables that force colour or a terminal
    removed (a Jupyter kernel sets `FORCE_COLOR=1`), `NOT_A_TERMINAL` added."""
    return {**{k: v for k, v in environ.items() if k not in FORCING}, **NOT_A_TERMINAL}


def _rate(steps: int, seconds: float) -> str:
    if steps <= 0 or seconds <= 0:
        return "? it/s"
    rate = steps / seconds
    return f"{rate:.2f} it/s" if rate >= 1 else f"{1 / rate:.2f} s/it"


def _loss(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


@dataclass
class TrainProgress:
    """The training loop's position, rate and loss, said as a plain line every `interval_s` (and at each epoch's
    end) to the logger `name`. `begin` a phase (`train` or `validation`) of an epoch with its steps, `advance` after
    each step, `end` it; `record` each metric record the trainer logs (`{"train": {"loss": …}, …}` per step,
    `{"val": {"loss_epoch": …}, "epoch": e}` per epoch). The rate is the training loop's (steps over the seconds
    spent in training phases); the ETA is the training steps left (every epoch's, `max_steps` when it binds) at this
    run's mean pace since its first step, wall time (validation and checkpoints included)."""

    interval_s: float = 30.0
    name: str = "eagledata.quality.train"
    clock: Callable[[], float] = time.monotonic
    epochs: int = 1
    max_steps: int | None = None
    phase: str = "train"
    epoch: int = 0          # the trainer's, from 0; said from 1
    step: int = 0           # steps finished in this phase of this epoch
    steps: int = 0          # this phase's steps in this epoch
    loss: float | None = None
    val_loss: float | None = None
    train_steps: int = 0    # training steps finished by this process
    done_before: int = 0    # training steps of earlier epochs when this process began later (a resumed run)
    epoch_steps: int = 0    # training steps per epoch
    train_s: float = 0.0    # seconds of training phases finished in this process
    _started: float = field(default=0.0, init=False)
    _first: float | None = field(default=None, init=False)
    status: StatusLog = field(init=False)

    def __post_init__(self) -> None:
        self.status = StatusLog(self.interval_s, self.name, clock=self.clock)

    # -- the loop ------------------------------------------------------------------------------------------------
    def begin(self, phase: str, epoch: int, steps: int, *, epochs: int | None = None,
              max_steps: int | None = None, skipped: int = 0) -> None:
        """A phase of `steps` to run; `skipped` steps of this epoch were trained before this process (a run resumed
        mid-epoch: the trainer's loader then holds only the rest), counted as done, not as this run's pace."""
        self.phase, self.epoch, self.steps, self.step = phase, epoch, steps + skipped, skipped
        if epochs is not None:
            self.epochs = epochs
        if max_steps is not None:
            self.max_steps = max_steps
        self._started = self.clock()
        if phase == "train" and self._first is None:
            self._first, self.epoch_steps = self._started, self.steps
            self.done_before = epoch * self.steps + skipped

    def advance(self) -> None:
        self.step += 1
        if self.phase == "train":
            self.train_steps += 1
            if self.step == self.steps:
                return  # `end` says this one
        self.status.maybe(self.line)

    def end(self) -> None:
        if self.phase == "train":
            self.train_s += self.clock() - self._started
            self._started = self.clock()
            self.status.emit(f"{self.line()} | epoch {self.epoch + 1} done, {duration(self.train_s)} of training")

    def record(self, record: Mapping[str, Any]) -> None:
        train, val = record.get("train"), record.get("val")
        if isinstance(train, Mapping) and isinstance(train.get("loss"), (int, float)):
            self.loss = float(train["loss"])
        if isinstance(val, Mapping) and isinstance(val.get("loss_epoch"), (int, float)):
            self.val_loss = float(val["loss_epoch"])

    # -- the line ------------------------------------------------------------------------------------------------
    def training_seconds(self) -> float:
        return self.train_s + (self.clock() - self._started if self.phase == "train" else 0.0)

    def total_steps(self) -> int:
        total = self.epochs * self.epoch_steps
        return min(total, self.max_steps) if self.max_steps is not None else total

    def eta_seconds(self) -> float | None:
        done = self.done_before + self.train_steps
        elapsed = 0.0 if self._first is None else self.clock() - self._first
        return eta_s(done, self.total_steps() or None, elapsed, self.done_before)

    def line(self) -> str:
        where = "step" if self.phase == "train" else "validation"
        text = (f"epoch {self.epoch + 1}/{self.epochs} {where} {self.step}/{self.steps} loss {_loss(self.loss)} "
                f"{_rate(self.train_steps, self.training_seconds())} ETA {duration(self.eta_seconds())}")
        return text + (f" val loss {_loss(self.val_loss)}" if self.val_loss is not None else "")


T = TypeVar("T")


class Steps(Generic[T]):
    """The trainer's `tqdm(loader, desc=…)` without a bar: the loader's batches, each step counted by `progress`
    (the step runs in the loop's body, between one batch and the next). `phase()` says which loop asks."""

    def __init__(self, iterable: Iterable[T], progress: TrainProgress, phase: Callable[[], dict[str, Any]]):
        self.iterable, self.progress, self.phase = iterable, progress, phase

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        self.progress.begin(steps=len(self), **self.phase())
        try:
            for item in self.iterable:
                yield item
                self.progress.advance()
        finally:
            self.progress.end()


@dataclass
class Relay:
    """A child command's output made plain (`plain_lines`), each line passed to `write` (its log), and a line said
    every `interval_s` (`say`, on the `StatusLog` schedule, injected clock): the latest progress line
    (`PROGRESS`) when the child wrote one, else its latest line."""

    label: str
    write: Callable[[str], object]
    say: Callable[[str], None]
    interval_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    latest: str = ""
    progress: str = ""
    status: StatusLog = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.status = _SayLog(self.interval_s, clock=self.clock, say=self.say)

    def feed(self, text: str) -> None:
        for line in plain_lines(text):
            self.write(line + "\n")
            self.latest = line
            found = PROGRESS.search(line)
            if found:
                self.progress = found.group(0)
        self.status.maybe(self.line)

    def line(self) -> str:
        return f"  {self.label} {duration(self.clock() - self.started)}: {(self.progress or self.latest)[:160]}"


@dataclass
class _SayLog(StatusLog):
    say: Callable[[str], None] = print

    def emit(self, text: str) -> None:
        self.lines += 1
        self.say(text)
