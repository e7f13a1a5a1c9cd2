"""Test helper: `eagledata.hidden_states` under torchrun (gloo on CPU), as a user launches it.

`torchrun --standalone` picks its workers' store port by binding port 0 and closing it; the rank-0 worker binds it
again moments later. Under `pytest -n`, the other worker's emulators and servers open ports in that gap, and once
in a CI run one took it ("EADDRINUSE"). That race is torch's launcher against the test machine, not the code under
test, so a launch that failed on it alone is retried; every other failure fails the test at once.
"""
from __future__ import annotations

import json
import subprocess
import sys

PORT_RACE = ("EADDRINUSE", "address already in use")


def torchrun(nproc: int, args: list[str], *, timeout: float, attempts: int = 3) -> subprocess.CompletedProcess:
    """Run `python -m torch.distributed.run --standalone --nproc-per-node nproc -m eagledata.hidden_states args`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), "-m",
           "eagledata.hidden_states", *args]
    for _ in range(attempts):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0 or not any(s in done.stderr for s in PORT_RACE):
            break
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def json_objects(text: str) -> list[dict]:
    """Every JSON object printed, even when two processes' lines ran together on a shared pipe (seen once, under
    load)."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        try:
            obj, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            end = at + 1
        else:
            found.append(obj)
        at = text.find("{", end)
    return found
