"""The experiment's commands in other processes (the trainer, τ in the speculators environment): `run_logged` runs
one with its output in a log file and a progress line said every so often; `Runner` is its seam's type."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from .progress import Relay, plain_env


def print_line(text: str) -> None:
    print(text, flush=True)


Runner = Callable[[list[str], dict[str, str], Path, str], None]


def run_logged(cmd: list[str], env: dict[str, str], log_file: Path, label: str, *, interval_s: float = 30.0,
               say: Callable[[str], None] = print_line) -> None:
    """A command with its output in `log_file` and a line said every `interval_s` (`progress.Relay`: the trainer's
    latest progress line, else the latest line), both plain text: the command is told it writes to no terminal
    (`progress.plain_env`) and what still carries control codes is cleaned. A failure raises naming the log and
    its last lines."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        relay = Relay(label, out.write, say, interval_s)
        # text mode reads a bar's "\r" as a line's end, as the relay does
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                encoding="utf-8", errors="replace", env={**plain_env(os.environ), **env}, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            relay.feed(line)
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{label} failed (exit {code}); its log: {log_file}\n{tail}")

