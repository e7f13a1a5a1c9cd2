"""`python -m eagledata.emulator --port PORT [--config FILE] [--host 127.0.0.1]`."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from ..errors import command_prog, run_command
from .config import load_config


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {text}")
    return port


def _stop_with_parent() -> None:
    """Started by `run_emulator` (its pid in `PARENT_ENV`): SIGTERM ourselves once that process is gone, so an
    emulator started for a run never outlives it (a notebook kernel killed mid-run, a test process SIGKILLed)."""
    from ..emulator_process import PARENT_ENV

    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_prog("eagledata-emulator", "eagledata.emulator"),
                                     description="Serve an OpenRouter emulator under /api/v1.")
    parser.add_argument("--port", type=_port, default=8765, help="0 picks a free port (printed on start)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", help="YAML or JSON config file")
    args = parser.parse_args(argv)

    def serve() -> None:
        cfg = load_config(args.config)
        _stop_with_parent()
        from .server import serve

        try:
            serve(cfg, args.host, args.port)
        except OSError as e:
            raise RuntimeError(f"cannot listen on {args.host}:{args.port}: {e}") from None

    return run_command(parser.prog, serve)


if __name__ == "__main__":
    sys.exit(main())
