"""Contained environments: each in a worker process of its own (worker.py), with a time limit per call and a memory
limit. A call that does not return in time is stopped (the worker killed), one that runs out of memory or kills
the process is a failure too; each is an error result of its kind (`calls.TIMEOUT`, `OUT_OF_MEMORY`, `CRASHED`),
and before the next call the environment is rebuilt in a fresh worker by replaying the calls before it (not the
failed one: its effect died with the process). The rest of the run goes on.

The worker gets no secrets: a clean environment (no API keys, `PYTHONHASHSEED=0` so string hashing, and any set
order a backend shows, is the same in every rebuild), an empty working folder of its own, no user site-packages,
no bytecode written. What it may touch is worker.py's business."""
from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backends import EnvironmentSpec
from .calls import CRASHED, OUT_OF_MEMORY, TIMEOUT, Call, CallResult, Executed, failure, replays
from .dispatch import BuildError
from .environment import check_replayed

LIB_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the eagledata package
BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from eagledata.agentic.worker import main; main()"
CHILD_ENV = {"PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8", "PATH": os.defpath}


@dataclass(frozen=True)
class Limits:
    """What one environment may use."""

    call_s: float = 10.0  # a call that has not returned by then is stopped
    start_s: float = 60.0  # building the environment: interpreter, imports, scenario
    memory_bytes: int = 1 << 30  # the worker's address space (RLIMIT_AS)
    replay_slack: float = 3.0  # a replayed call may take this many times call_s (a loaded machine is no mismatch)


class _Died(Exception):
    """The worker's process ended (the message says how)."""


class Worker:
    """One worker process and the protocol's parent side: a request, then its one-line reply within a deadline."""

    def __init__(self, python: str = sys.executable):
        self.folder = tempfile.mkdtemp(prefix="eagledata-env-")
        self.proc = subprocess.Popen([python, "-s", "-B", "-P", "-c", BOOT, LIB_ROOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.folder,
                                     env=CHILD_ENV, start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ, "out")
        self.selector.register(self.proc.stderr, selectors.EVENT_READ, "err")
        self.pending = b""
        self.stderr_tail = b""

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send `message`, return the reply; None when none came within `timeout_s`; `_Died` when the process
        ended before replying."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Died(self.how_it_ended()) from None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for key, _ in self.selector.select(left):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
                if key.data == "err":
                    self.stderr_tail = (self.stderr_tail + chunk)[-2000:]
                elif not chunk:
                    raise _Died(self.how_it_ended())
                else:
                    self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        reply = json.loads(line)
        assert isinstance(reply, dict)
        return reply

    def how_it_ended(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        said = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        return how + (f": {said[-1]}" if said else "")

    def kill(self) -> None:
        """SIGKILL the worker's process group and reap it; remove its folder."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        shutil.rmtree(self.folder, ignore_errors=True)


class ContainedEnvironment:
    """A task's environment in a worker (see the module's docstring). `history` is every call executed, in order;
    `restarts` how many times the worker was rebuilt after a failure."""

    def __init__(self, spec: EnvironmentSpec, limits: Limits = Limits(), python: str = sys.executable):
        self.spec, self.limits, self.python = spec, limits, python
        self.history: list[Executed] = []
        self.restarts = 0
        self.worker: Worker | None = self._start()

    def _start(self) -> Worker:
        worker = Worker(self.python)
        try:
            reply = worker.request({"spec": self.spec.to_dict(), "memory_bytes": self.limits.memory_bytes,
                                    "alarm_s": math.ceil(self.limits.call_s * self.limits.replay_slack) + 5},
                                   self.limits.start_s)
        except _Died as e:
            worker.kill()
            raise BuildError(f"task {self.spec.task_id}: the environment's worker ended while building ({e})") \
                from None
        if reply is None:
            worker.kill()
            raise BuildError(f"task {self.spec.task_id}: building the environment took over {self.limits.start_s:g} s")
        if "failed" in reply:
            worker.kill()
            raise BuildError(f"task {self.spec.task_id}: {reply['failed']}")
        return worker

    def _call(self, worker: Worker, call: Call, timeout_s: float) -> CallResult:
        try:
            reply = worker.request({"name": call.name, "arguments": call.arguments}, timeout_s)
        except _Died as e:
            worker.kill()
            self.worker = None
            return failure(CRASHED, f"{call.name}() ended the environment's process ({e}); the environment was "
                                    "restarted without this call")
        if reply is None:
            worker.kill()
            self.worker = None
            return failure(TIMEOUT, f"{call.name}() did not return within {timeout_s:g} s and was stopped; "
                                    "the environment was restarted without this call")
        result = CallResult(reply["text"], reply["error"])
        if result.error == OUT_OF_MEMORY:
            worker.kill()
            self.worker = None
        return result

    def _rebuild(self) -> Worker:
        """A fresh worker replaying the history; the replays must agree with it (`ReplayMismatch`)."""
        self.restarts += 1
        worker = self._start()
        self.worker = worker
        for i, ex in enumerate(self.history):
            if replays(ex):
                got = self._call(worker, ex.call, self.limits.call_s * self.limits.replay_slack)
                if got != ex.result:
                    self.close()
                    check_replayed(self.spec.task_id, i, ex, got)
        return worker

    def execute(self, name: str, arguments: str) -> CallResult:
        worker = self.worker if self.worker is not None else self._rebuild()
        call = Call(name, arguments)
        result = self._call(worker, call, self.limits.call_s)
        self.history.append(Executed(call, result))
        return result

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def __enter__(self) -> ContainedEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ContainedEnvironments:
    """Opens each environment in a worker of its own, under `limits`."""

    def __init__(self, limits: Limits = Limits(), python: str = sys.executable):
        self.limits, self.python = limits, python

    def open(self, spec: EnvironmentSpec) -> ContainedEnvironment:
        return ContainedEnvironment(spec, self.limits, self.python)

