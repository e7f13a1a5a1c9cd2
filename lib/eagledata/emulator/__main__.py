"""`python -m eagledata.emulator --port PORT [--config FILE] [--host 127.0.0.1]`."""
from __future__ import annotations

import argparse
import sys

from ..errors import run_command
from .config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagledata.emulator",
                                     description="Serve an OpenRouter emulator under /api/v1.")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on start)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", help="YAML or JSON config file")
    args = parser.parse_args(argv)

    def serve() -> None:
        cfg = load_config(args.config)
        from .server import serve

        try:
            serve(cfg, args.host, args.port)
        except OSError as e:
            raise RuntimeError(f"cannot listen on {args.host}:{args.port}: {e}") from None

    return run_command("emulator", serve)


if __name__ == "__main__":
    sys.exit(main())
