"""Run the emulator as a subprocess for tests, the demo and `base_url: emulator`: free port, readiness, guaranteed
stop (and, should this process die without stopping it, the emulator stops itself: `PARENT_ENV`)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .defaults import EMULATOR_SPEED, is_emulator

_LISTENING = re.compile(r"listening on (http://\S+)/api/v1")
PARENT_ENV = "EAGLEDATA_EMULATOR_PARENT"  # the pid whose end stops the emulator (a killed kernel leaves none behind)


@dataclass
class EmulatorHandle:
    """Where the emulator listens, and its admin API (tests top up, read stats and ground truth)."""

    base_url: str  # http://127.0.0.1:PORT/api/v1
    admin_url: str  # http://127.0.0.1:PORT/admin
    process: subprocess.Popen
    log_path: Path

    def _admin(self, method: str, path: str, **kw: Any) -> Any:
        r = httpx.request(method, f"{self.admin_url}/{path}", timeout=30, **kw)
        r.raise_for_status()
        return r.json()

    def stats(self) -> dict:
        return self._admin("GET", "stats")

    def topup(self, amount: float) -> dict:
        return self._admin("POST", "topup", json={"amount": amount})["data"]

    def ground_truth(self, generation_id: str | None = None) -> Any:
        params = {"id": generation_id} if generation_id else None
        return self._admin("GET", "ground_truth", params=params)["data"]

    def reset(self, config: dict | None = None) -> None:
        """Fresh state (credits, attempts, stats); a config dict replaces the running config."""
        self._admin("POST", "reset", content=json.dumps(config) if config is not None else b"")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group (uvicorn shuts down cleanly), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


@contextmanager
def run_emulator(config: dict | str | Path | None = None, *, host: str = "127.0.0.1",
                 ready_timeout: float = 30.0, **overrides: Any) -> Iterator[EmulatorHandle]:
    """Start `python -m eagledata.emulator` on a free port in its own process group; yield a handle.

    `config` is a mapping or a YAML/JSON file; keyword overrides (e.g. `speed=0`, `balance=5`) are
    applied on top. The server is always stopped on exit, exceptions included.
    """
    import yaml

    if isinstance(config, (str, Path)):
        raw = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
    else:
        raw = dict(config or {})
    raw.update(overrides)
    with tempfile.TemporaryDirectory(prefix="eagledata-emulator-") as tmp:
        cfg_path, log_path = Path(tmp) / "config.json", Path(tmp) / "emulator.log"
        cfg_path.write_text(json.dumps(raw))
        env = dict(os.environ)
        lib = str(Path(__file__).resolve().parents[1])  # this checkout's lib/, whatever is installed
        env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[PARENT_ENV] = str(os.getpid())
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "eagledata.emulator", "--host", host, "--port", "0",
                                     "--config", str(cfg_path)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            root = _wait_ready(proc, log_path, ready_timeout)
            yield EmulatorHandle(f"{root}/api/v1", f"{root}/admin", proc, log_path)
        finally:
            _stop(proc)


def embedded_config(*, speed: float = EMULATOR_SPEED, tool_datasets: Sequence[str | Path] = (),
                    **overrides: Any) -> dict[str, Any]:
    """The config of an emulator started for a run: seed 0, the default catalog, $100, no faults, delays x `speed`,
    and the prompt files whose agent conversations its model follows (`tool_datasets`, absolute paths)."""
    return {"seed": 0, "speed": speed, "tool_datasets": [str(Path(p).resolve()) for p in tool_datasets], **overrides}


@asynccontextmanager
async def serving(base_url: str, **config: Any) -> AsyncIterator[str]:
    """The URL to talk to: `base_url` itself, or for `emulator` the URL of an emulator started for the block
    (`embedded_config(**config)`) and stopped after it, errors and cancellation included. The start (a few seconds:
    the tokenizer loads) runs off the event loop."""
    if not is_emulator(base_url):
        yield base_url
        return
    started = run_emulator(embedded_config(**config))
    handle = await asyncio.to_thread(started.__enter__)
    try:
        yield handle.base_url
    finally:
        started.__exit__(None, None, None)  # at once, not awaited: a cancelled task still stops its emulator


def _wait_ready(proc: subprocess.Popen, log_path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    root = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with code {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        if root is None:
            m = _LISTENING.search(log_path.read_text(errors="replace"))
            root = m.group(1) if m else None
        if root is not None:
            try:
                if httpx.get(f"{root}/admin/health", timeout=1).status_code == 200:
                    return root
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"emulator not ready after {timeout}s:\n{log_path.read_text(errors='replace')}")
