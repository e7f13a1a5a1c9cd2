"""Killing a generate command the way a crash does: SIGKILL to its process group at random moments, each once the
run is writing (shared by the one-dataset and the several-datasets kill tests)."""
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def kill_while_writing(cmd: list[str], records: list[Path], rng: random.Random, times: int,
                       after_s: tuple[float, float] = (0.0, 0.5), **popen: Any) -> tuple[int, list[int]]:
    """Start `cmd` `times` times; SIGKILL each at a random moment `after_s` (seconds) after its first new record.
    Returns how many were killed (a run may finish first) and the records' total size after each. `popen`: more of
    Popen's arguments (`env`, `cwd`)."""
    kills, sizes = 0, []

    def size() -> int:
        return sum(f.stat().st_size for f in records if f.exists())

    for _ in range(times):
        before = size()
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None and size() <= before:
            time.sleep(0.05)
        time.sleep(rng.uniform(*after_s))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        sizes.append(size())
    return kills, sizes
