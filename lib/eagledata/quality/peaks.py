"""Peak memory per stage (issue 62: each learning-curve size's wall time and peak memory): the experiment's
processes together — this one and every command it runs, their children included — their resident memory summed,
at its largest while the stage ran, sampled every `interval_s` (psutil). Summed, because the commands run beside
this process (and the two trainers beside each other): what the machine must hold is their total. A stage that
runs beside another (the arms' trainers) sees both, as the machine does."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


def tree_rss(root: psutil.Process | None = None) -> int:
    """Bytes resident in `root` (this process) and all its descendants now; a process that ends while it is read
    counts for nothing."""
    root = root or psutil.Process()
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


class StagePeak:
    """The largest `tree_rss` seen so far; `mib()` in MiB."""

    def __init__(self) -> None:
        self.bytes = 0

    def sample(self) -> None:
        self.bytes = max(self.bytes, tree_rss())

    def mib(self) -> float:
        return round(self.bytes / (1 << 20), 1)


@contextmanager
def stage_peak(interval_s: float = 0.5) -> Iterator[StagePeak]:
    """`tree_rss` sampled from the block's start to its end (`Stages.run`: each stage's `peak_mib`)."""
    peak, done = StagePeak(), threading.Event()

    def sampling() -> None:
        while True:
            peak.sample()
            if done.wait(interval_s):
                return

    sampler = threading.Thread(target=sampling, name="stage-peak", daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak.sample()
