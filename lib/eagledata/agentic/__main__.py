"""`python -m eagledata.agentic --cache DIR --out tasks.jsonl`: BFCL's multi-turn tasks (the bfcl-eval wheel, fetched
once into the cache) written as an agentic task file (docs/FORMATS.md "Agentic tasks"), to edit, filter or extend."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import command_prog, run_command
from .bfcl import TASKS_MEMBER, bfcl_wheel, read_bfcl_tasks
from .tasks import write_tasks


def main(argv: list[str] | None = None) -> int:
    prog = command_prog("eagledata-agentic", "eagledata.agentic")
    parser = argparse.ArgumentParser(prog=prog, description="Write BFCL's multi-turn tasks as an agentic task file.")
    parser.add_argument("--cache", required=True, type=Path, help="folder for the bfcl-eval wheel")
    parser.add_argument("--out", required=True, type=Path, help="the task file to write (JSONL)")
    parser.add_argument("--member", default=TASKS_MEMBER, help=f"the tasks inside the wheel (default {TASKS_MEMBER})")
    args = parser.parse_args(argv)

    def body() -> None:
        print(write_tasks(args.out, read_bfcl_tasks(bfcl_wheel(args.cache), args.member)))

    return run_command(prog, body)


if __name__ == "__main__":
    sys.exit(main())
