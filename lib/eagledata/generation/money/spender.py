"""One spender per account on this machine.

Admission (admission.py) commits the money left to the requests it can see in flight. Two runs on one account
cannot see each other's: each would commit the same remaining money, and together they overdraw it. So a paid
run holds an exclusive lock named after the account — the base URL and a hash of the API key, never the key
itself — and a second run on this machine is refused with a message naming the one running. The lock is an
`flock` (`files.hold_lock`, as each dataset's store takes), so a killed run (SIGKILL included) releases it with
its process. Runs on other machines sharing the key are not seen here: the account readings notice their usage
(`Books.foreign_usd`), but not their requests in flight.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...files import LockHeld, hold_lock

STATE_DIR_ENV = "EAGLEDATA_STATE_DIR"


class AccountBusy(InputError):
    """Another run on this machine is spending on the same account."""


def account_id(base_url: str, api_key: str | None) -> str:
    """Names the account without revealing the key: sha256 of the base URL and the key, 16 hex digits."""
    text = f"{base_url.rstrip('/')}\n{api_key or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_dir() -> Path:
    """Where the locks live: `$EAGLEDATA_STATE_DIR`, else `$XDG_RUNTIME_DIR/eagledata`, else the temp dir."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "eagledata"
    return Path(tempfile.gettempdir()) / f"eagledata-{os.getuid()}"


@dataclass
class SpenderLock:
    """Held for the whole of a paid run; `close` (or the process ending) releases it."""

    path: Path
    fd: int | None

    @classmethod
    def acquire(cls, base_url: str, api_key: str | None, *, describe: dict[str, Any],
                directory: Path | None = None) -> SpenderLock:
        directory = directory or state_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"account-{account_id(base_url, api_key)}.lock"
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started_at": datetime.now(UTC).isoformat(timespec="seconds"), **describe}
        try:
            fd = hold_lock(path, json.dumps(info), mode=0o600)
        except LockHeld as e:
            raise AccountBusy(f"another run is spending on this account ({base_url}): {_describe(e.holder)}. Two "
                              "runs cannot see each other's requests in flight, so together they could overdraw "
                              "the balance; put the datasets into one run (dataset: [A, B, …]) or wait for it",
                              field="base_url") from None
        return cls(path, fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def _describe(holder: str) -> str:
    try:
        d = json.loads(holder)
        return (f"pid {d.get('pid')} on {d.get('host')}, datasets {', '.join(d.get('datasets', []))} into "
                f"{d.get('output_dir')}, started {d.get('started_at')}")
    except (ValueError, AttributeError):
        return "pid unknown"
