"""A real vLLM server on 127.0.0.1 for the `vllm` tests (make test-vllm), started with the command the project
prints (`python -m eagledata.hidden_states serve-command`) plus only what CPU and the test machine need.

`start_vllm(checkpoint, storage)` returns a running `VllmServer` (its `.url` is the OpenAI base); `stop()` ends it,
`kill()` SIGKILLs it mid-run, `restart()` starts it again on the same port and folder. The server runs in the
vLLM environment (`$EAGLEDATA_VLLM_PYTHON`, default `.venv-vllm/bin/python`) with PYTHONPATH naming only
`site/`, whose sitecustomize installs the CPU stand-ins for the hidden-states connector's three CUDA calls in
every process vLLM starts (see site/eagledata_vllm_cpu.py). This folder is not named `vllm`: the tests folder is on
sys.path, and a `vllm` package there would shadow (or fake) the real one for transformers' availability checks.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from eagledata.quality.serve import chat_server_command, free_port, server_env

ROOT = Path(__file__).resolve().parents[3]
SITE = Path(__file__).resolve().parent / "site"
# What the test machine needs beyond the printed command: no tokenizer (random checkpoints have none; requests are
# token ids), a context that fits a 1 GiB CPU KV cache, and 127.0.0.1 on a free port instead of 0.0.0.0:8000.
CPU_FLAGS = ("--skip-tokenizer-init", "--max-model-len", "4096")
START_TIMEOUT_S = 600.0


def vllm_python() -> str:
    return os.environ.get("EAGLEDATA_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))


def printed_command(checkpoint: Path, storage: Path, layers: Sequence[int] | None = None) -> list[str]:
    """The argv `python -m eagledata.hidden_states serve-command` prints for this checkpoint (run as a user would)."""
    argv = [sys.executable, "-m", "eagledata.hidden_states", "serve-command", "--model", str(checkpoint),
            "--shared-storage-path", str(storage)]
    if layers is not None:
        argv += ["--layers", *map(str, layers)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(
        ROOT / "lib") + os.pathsep + os.environ.get("PYTHONPATH", "")})
    if done.returncode != 0:
        raise RuntimeError(f"serve-command failed: {done.stderr[-2000:]}")
    return shlex.split(done.stdout.strip().splitlines()[-1])


def server_argv(printed: list[str], port: int, extra: Sequence[str] = (), python: str | None = None) -> list[str]:
    """`vllm serve MODEL …` as `python -m vllm.entrypoints.openai.api_server --model MODEL …` (vllm-cpu's console
    script looks up metadata of a package named `vllm` and fails), on 127.0.0.1:port, plus CPU_FLAGS."""
    if printed[:2] != ["vllm", "serve"]:
        raise ValueError(f"not a vllm serve line: {printed}")
    rest = list(printed[3:])
    at = rest.index("--port")
    rest[at + 1] = str(port)
    return [python or vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", printed[2], *rest,
            "--host", "127.0.0.1", *CPU_FLAGS, *extra]


@dataclass
class VllmServer:
    """One vLLM process group; its log is `log` (read it when a start fails)."""

    checkpoint: Path
    storage: Path
    log: Path
    port: int
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def launch(self) -> VllmServer:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            cwd=str(self.storage.parent), start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode} while starting; its log "
                                   f"({self.log}) ends:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM not ready after {timeout_s:.0f} s; its log ends:\n{self.tail()}")

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def _signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)  # the API server and the engine core it started
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would end it: no shutdown, requests in flight lost."""
        self._signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(30)
            self._reap()

    def stop(self) -> None:
        self._signal(signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(30)
            self._reap()

    def _reap(self) -> None:
        """Wait until no process of the group is left (the engine core holds the port and memory)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def restart(self) -> VllmServer:
        self.stop()
        return self.launch().wait_ready()


def start_vllm(checkpoint: str | Path, storage: str | Path, *, layers: Sequence[int] | None = None,
               extra: Sequence[str] = (), env: dict[str, str] | None = None, wait: bool = True, cpu: bool = True,
               python: str | None = None) -> VllmServer:
    """A real vLLM serving `checkpoint` with the project's printed command; connector files go to `storage`.

    `extra`: more flags (say `--served-model-name`); `env`: more environment; `cpu`: with the CPU stand-ins and
    CPU settings (False on a GPU node: vLLM's own code only); `python`: the interpreter with vLLM (default
    `vllm_python()`). Raises with the server's log when it does not come up."""
    checkpoint, storage = Path(checkpoint), Path(storage)
    storage.mkdir(parents=True, exist_ok=True)
    python = python or vllm_python()
    if not Path(python).is_file():
        raise RuntimeError(f"no vLLM environment at {python}: run `make test-vllm`")
    port = free_port()
    argv = server_argv(printed_command(checkpoint, storage, layers), port, extra, python)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    # CPU: the stand-ins (PYTHONPATH=site), a 1 GiB KV cache, OpenMP threads left unpinned (several servers and
    # the tests share two cores). Everywhere: no usage report, no hub.
    on_cpu = {"PYTHONPATH": str(SITE), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "OMP_NUM_THREADS": str(min(2, os.cpu_count() or 1))} if cpu else {}
    run_env = {**base, **on_cpu, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
               "VLLM_LOGGING_LEVEL": "INFO", **(env or {})}
    log = storage.parent / f"vllm-{port}.log"
    log.write_text("$ " + shlex.join(argv) + "\n" + json.dumps({k: run_env[k] for k in sorted(run_env)
                                                                if k.startswith(("VLLM", "OMP", "PYTHONPATH"))}) + "\n")
    server = VllmServer(checkpoint, storage, log, port, argv, run_env).launch()
    return server.wait_ready() if wait else server


def start_chat_vllm(checkpoint: str | Path, workdir: str | Path, *, served_name: str, max_model_len: int = 2048,
                    dtype: str = "float32", extra: Sequence[str] = (), python: str | None = None) -> VllmServer:
    """A real vLLM serving `checkpoint` for chat completions (the generation stage's `backend: local`): the
    checkpoint's own tokenizer and chat template, no hidden-states connector; 127.0.0.1 on a free port, a 1 GiB CPU
    KV cache, OpenMP threads unpinned: the command and environment of `eagledata.quality.serve` (one
    launcher). `dtype` float32 by default: the converted target is float32 and the τ
    measurement decodes it in float32."""
    workdir, checkpoint = Path(workdir).resolve(), Path(checkpoint).resolve()  # the server runs in another folder
    workdir.mkdir(parents=True, exist_ok=True)
    python = python or vllm_python()
    if not Path(python).is_file():
        raise RuntimeError(f"no vLLM environment at {python}: run `make test-vllm`")
    port = free_port()
    # the library's launcher's command and environment (quality/serve.py: what the experiment serves with)
    argv = chat_server_command(python, checkpoint, port, served_name=served_name, max_model_len=max_model_len,
                               dtype=dtype, extra=extra)
    run_env = {**server_env(), "VLLM_LOGGING_LEVEL": "INFO"}
    log = workdir / f"vllm-{port}.log"
    log.write_text("$ " + shlex.join(argv) + "\n")
    return VllmServer(Path(checkpoint), workdir, log, port, argv, run_env).launch().wait_ready()
