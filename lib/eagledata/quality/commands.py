"""The experiment's commands in other processes (the trainer, τ in the speculators environment): `run_logged` runs
one with its output in a log file and a progress line said every so often; `Runner` is its seam's type;
`stop_commands` ends those still running (an interrupt reaches only the main thread, not the threads that run
commands side by side, nor the commands: a kernel's interrupt signals the kernel alone)."""
from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from .progress import Relay, plain_env


def print_line(text: str) -> None:
    print(text, flush=True)


Runner = Callable[[list[str], dict[str, str], Path, str], None]

_running: set[subprocess.Popen[str]] = set()  # the commands run_logged has started and not yet seen end
_lock = threading.Lock()


def end_command(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """A command terminated, killed when it has not ended `grace_s` later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_commands() -> None:
    """Every command `run_logged` started that still runs, ended: a trainer left running after an interrupt would
    go on spending the machine, and write into the folder the rerun starts over in."""
    with _lock:
        procs = list(_running)
    for proc in procs:
        end_command(proc)


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
        with _lock:
            _running.add(proc)
        try:
            for line in proc.stdout:
                relay.feed(line)
            code = proc.wait()
        except BaseException:  # an interrupt (or a failed relay): the command ends with this call, not after it
            end_command(proc)
            raise
        finally:
            with _lock:
                _running.discard(proc)
    if code != 0:
        tail = "\n".join(log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{label} failed (exit {code}); its log: {log_file}\n{tail}")

