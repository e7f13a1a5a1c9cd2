"""`make demo`: run every workbench notebook on demo inputs into `<output_dir>/runs/`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .notebooks import run_notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output-dir", default="outputs")
    args = parser.parse_args(argv)
    runs = Path(args.output_dir) / "runs"
    steps = [("tokenizer", {"output_dir": args.output_dir})]
    for name, params in steps:
        out = run_notebook(name, runs / f"{name}.ipynb", params)
        print(f"demo: {name}.ipynb -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
