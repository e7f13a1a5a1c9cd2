"""The trainer's progress in plain text (quality/progress.py, issue 60): no control code reaches a command's log or
what is said of it, and the trainer's line carries epoch, step, loss, rate and ETA on a fixed schedule."""
from __future__ import annotations

import logging
import re
import sys

from eagledata.quality.commands import run_logged
from eagledata.quality.progress import PROGRESS, Relay, Steps, TrainProgress, plain_env, plain_lines
from tests.helpers import DATA

# speculators' console under a Jupyter kernel (FORCE_COLOR=1), captured from the trainer's own `tqdm.rich` bar and
# `RichHandler` in .venv-interop (three frames of the bar, its last one, and a log line with rich's hyperlinks)
RICH = (DATA / "rich_console.txt").read_bytes().decode("utf-8")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # what a plain log never holds: ESC, \r, and the rest


class FakeClock:
    def __init__(self, t: float = 500.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_rich_output_reaches_the_log_and_the_notebook_as_plain_text():
    assert "\x1b" in RICH and "\r" in RICH  # the capture is what the issue saw
    clock, logged, said = FakeClock(), [], []
    relay = Relay("train on_policy", logged.append, said.append, interval_s=30.0, clock=clock)
    for chunk in re.split(r"(?<=\n)", RICH):  # as Popen's text mode gives it, "\r" read as a line's end
        for line in chunk.replace("\r", "\n").splitlines(keepends=True):
            clock.t += 20
            relay.feed(line)
    text = "".join(logged)
    assert not CONTROL.search(text.replace("\n", "")) and not any(CONTROL.search(s) for s in said)
    lines = text.splitlines()
    assert lines[0].startswith("<string>:4: TqdmExperimentalWarning")
    assert lines[1].startswith("Epoch 1   0% ━━━") and lines[1].endswith("0/6  [ 0:00:00 < -:--:-- , ? it/s ]")
    assert lines[-2].startswith("Epoch 1 100% ━━━") and lines[-2].endswith("6/6  [ 0:00:02 < 0:00:00 , 3 it/s ]")
    assert lines[-1].startswith("[01:05:45] INFO     Training epoch 1/2 started ")
    assert lines[-1].endswith("<string>:5")  # the hyperlink's text kept, its escape dropped
    assert said and all(s.startswith("  train on_policy ") for s in said)


def test_plain_lines_end_a_line_at_a_carriage_return_and_drop_what_is_blank():
    assert plain_lines("a\rb\r\n\x1b[2K\r\x1b[1mc\x1b[0m\x07\n \n") == ["a", "b", "c"]
    assert plain_lines("\x1b]8;id=1;file://x\x1b\\link\x1b]8;;\x1b\\ ok\x1b7\x1b(B") == ["link ok"]


def test_a_child_is_told_it_writes_to_no_terminal():
    env = plain_env({"FORCE_COLOR": "1", "CLICOLOR_FORCE": "1", "TERM": "xterm-color", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "TTY_COMPATIBLE": "0", "TTY_INTERACTIVE": "0", "NO_COLOR": "1", "TERM": "dumb"}


def run_loop(progress: TrainProgress, clock: FakeClock, epochs: int, steps: int, step_s: float,
             val_steps: int = 0) -> None:
    """The trainer's loop as speculators runs it: per epoch its training steps (a metric record each), then
    validation (a record at the end); the records shaped as its metrics.jsonl holds them."""
    for epoch in range(epochs):
        train = {"phase": "train", "epoch": epoch, "epochs": epochs, "max_steps": None}
        for i, _ in enumerate(Steps(range(steps), progress, lambda asks=train: asks)):
            clock.t += step_s
            progress.record({"train": {"loss_0": 1.0, "loss": 10.0 - epoch * steps - i}, "epoch": epoch,
                             "global_step": epoch * steps + i})
        for _ in Steps(range(val_steps), progress, lambda e=epoch: {"phase": "validation", "epoch": e}):
            clock.t += step_s / 4
        if val_steps:
            progress.record({"val": {"loss_0_epoch": 2.5, "loss_epoch": 7.5 - epoch}, "epoch": epoch})


def test_the_trainers_line_says_epoch_step_loss_rate_and_eta_every_interval(caplog):
    clock = FakeClock()
    progress = TrainProgress(30.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="eagledata.quality.train"):
        run_loop(progress, clock, epochs=2, steps=25, step_s=2.0, val_steps=4)
    lines = [r.getMessage() for r in caplog.records]
    # 2 s a step (said as s/it, as tqdm says a rate under 1 it/s): a line at 30 s (step 15 finished), at 50 s
    # (step 25 finished: the epoch's end), …
    assert lines[0] == "epoch 1/2 step 15/25 loss -4 2.00 s/it ETA 1m10s"
    assert lines[1] == "epoch 1/2 step 25/25 loss -14 2.00 s/it ETA 50s | epoch 1 done, 50s of training"
    assert lines[-1] == "epoch 2/2 step 25/25 loss -39 2.00 s/it ETA 0s val loss 7.5 | epoch 2 done, 1m40s of training"
    # validation time is not training time: the rate stays 2 s a step
    assert all(PROGRESS.search(line) for line in lines) and all("2.00 s/it" in line for line in lines)
    assert len(lines) == 5  # at 30, 50 (the epoch's end), 60, 90 and 104 (the end)
    assert not any(CONTROL.search(line) for line in lines)


def test_an_epoch_ending_on_the_schedule_says_its_line_once(caplog):
    clock = FakeClock()
    progress = TrainProgress(10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="eagledata.quality.train"):
        run_loop(progress, clock, epochs=1, steps=5, step_s=2.0)  # the last step ends at 10 s
    assert [r.getMessage() for r in caplog.records] == [
        "epoch 1/1 step 5/5 loss 6 2.00 s/it ETA 0s | epoch 1 done, 10s of training"]


def test_a_line_during_validation_says_so_and_a_fast_loop_says_its_rate_in_it_per_s():
    """The rate is the training loop's (validation's 5 s left out: 100 steps in 25 s), the ETA the run's pace with
    validation in (100 steps in 30 s, 200 left)."""
    clock = FakeClock()
    progress = TrainProgress(30.0, clock=clock)
    progress.begin("train", 0, 100, epochs=3)
    for _ in range(100):
        clock.t += 0.25
        progress.advance()
    progress.end()
    progress.begin("validation", 0, 8)
    clock.t += 5
    progress.step = 3
    assert progress.line() == "epoch 1/3 validation 3/8 loss ? 4.00 it/s ETA 1m00s"
    assert PROGRESS.search(progress.line())


def test_a_run_resumed_mid_epoch_says_the_epochs_steps_and_an_eta_over_all_that_is_left(caplog):
    """speculators resumed at step 60 of 100 hands the loop a loader of the 40 left (`_resume_local_step`, read by
    `train.plain_console` as `skipped`): the line says step 70/100, not 10/40, and the ETA is every epoch's steps
    left at this run's pace (230 at 2 s: 7m40s; counting 3 epochs of 40, as the learning curve's run said after
    its resume, gives 3m40s)."""
    clock = FakeClock()
    progress = TrainProgress(20.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="eagledata.quality.train"):
        first = {"phase": "train", "epoch": 0, "epochs": 3, "max_steps": None, "skipped": 60}
        for _ in Steps(range(40), progress, lambda: first):
            clock.t += 2.0
        for _ in Steps(range(100), progress, lambda: {**first, "epoch": 1, "skipped": 0}):
            clock.t += 2.0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "epoch 1/3 step 70/100 loss ? 2.00 s/it ETA 7m40s"
    assert lines[3] == "epoch 1/3 step 100/100 loss ? 2.00 s/it ETA 6m40s | epoch 1 done, 1m20s of training"
    assert lines[-1] == "epoch 2/3 step 100/100 loss ? 2.00 s/it ETA 3m20s | epoch 2 done, 4m40s of training"


def test_the_relay_says_the_latest_progress_line_not_the_latest_log_line():
    clock, logged, said = FakeClock(), [], []
    relay = Relay("train off_policy", logged.append, said.append, interval_s=30.0, clock=clock)
    relay.feed("12:00:00 INFO Training epoch 1/2 started\n")
    clock.t += 31
    relay.feed("12:00:31 INFO epoch 1/2 step 15/25 loss 4.512 2.00 s/it ETA 1m10s\n")
    assert said == ["  train off_policy 31s: epoch 1/2 step 15/25 loss 4.512 2.00 s/it ETA 1m10s"]
    clock.t += 30
    relay.feed("12:01:01 INFO train/loss=4.301, train/full_acc_0=0.123, global_step=22\n")
    assert said[-1] == "  train off_policy 1m01s: epoch 1/2 step 15/25 loss 4.512 2.00 s/it ETA 1m10s"
    assert len(logged) == 3


def test_a_command_under_a_kernels_colour_settings_gives_a_plain_log(tmp_path, monkeypatch):
    """run_logged end to end: a child that writes rich's bytes (and says what its environment tells a terminal
    library) under `FORCE_COLOR=1`, as a Jupyter kernel sets it."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    script = tmp_path / "child.py"
    script.write_text("import os, sys\n"
                      f"sys.stdout.buffer.write(open({str(DATA / 'rich_console.txt')!r}, 'rb').read())\n"
                      "sys.stdout.flush()\n"
                      "print('env', os.environ.get('FORCE_COLOR'), os.environ.get('TTY_COMPATIBLE'))\n"
                      "print('12:00:31 INFO epoch 1/2 step 15/25 loss 4.512 2.00 s/it ETA 1m10s')\n")
    said: list[str] = []
    log = tmp_path / "train.log"
    run_logged([sys.executable, str(script)], {}, log, "train on_policy", interval_s=1e-9, say=said.append)
    text = log.read_text(encoding="utf-8")
    assert not CONTROL.search(text.replace("\n", "")) and not any(CONTROL.search(s) for s in said)
    assert "\nenv None 0\n" in text and "Epoch 1 100% ━━━" in text
    assert said[-1].endswith(": epoch 1/2 step 15/25 loss 4.512 2.00 s/it ETA 1m10s")
