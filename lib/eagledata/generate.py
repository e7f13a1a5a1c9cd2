"""`python -m eagledata.generate --dataset NAME [NAME …] [--flag VALUE …]`: generate.ipynb's run as a command.

Every flag is a field of `eagledata.generation.GenerateConfig` (same names and defaults as the notebook's
parameters; `--help` lists them). The engine itself lives in `eagledata.generation`.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from .errors import build_settings, command_prog, run_command
from .generation import GenerateConfig, run_generation, tool_loop_note
from .generation.policy import ERROR_PREFIX, StopReason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_prog("eagledata-generate", "eagledata.generate"),
                                     description=__doc__.split("\n\n")[0])
    GenerateConfig.add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = build_settings(parser, lambda: GenerateConfig.from_args(args))

    def run() -> int:
        summary = asyncio.run(run_generation(cfg))
        per = summary.get("datasets", {summary.get("dataset"): summary})
        if "datasets" in summary:
            print(f"{len(per)} datasets: {_line(summary)}")
        for name, s in per.items():
            print(f"{name}: {_line(s)}")
        if note := tool_loop_note(summary):
            print(note)
        reason = summary["stop_reason"]  # stopped cleanly, but on a bug; or nothing at all recorded
        return 1 if reason.startswith(ERROR_PREFIX) or reason == StopReason.ALL_FAILED else 0

    return run_command(parser.prog, run)


def _line(summary: dict) -> str:
    run = summary["run"]
    return (f"{summary['stop_reason']}; recorded {run['recorded']}, failed {run['failed']}, "
            f"{run['output_tokens']:,} output tokens, charged ${run['spend_usd']:.4f} (answers kept "
            f"${run['recorded_usd']:.4f}); {summary['records']} records, {summary['remaining']} remaining"
            + (f", {summary['output_tokens']:,} of {summary['target_output_tokens']:,} target tokens"
               if summary.get("target_output_tokens") else ""))


if __name__ == "__main__":
    sys.exit(main())
