"""One error type for bad input, so callers and notebooks can show a single clear message."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")


class InputError(ValueError):
    """Bad user input: a file, a line in it, or a field. The message names where."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        where = ""
        if self.path is not None:
            where = self.path + (f":{line}" if line is not None else "")
        if field is not None:
            where = f"{where} field '{field}'" if where else f"field '{field}'"
        super().__init__(f"{where}: {message}" if where else message)

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it (a notebook cell, papermill's report): its one line, `InputError: <message>`,
        not a traceback that ends in it; the cell still fails, so papermill and Run All stop there."""
        return [f"{type(self).__name__}: {self}"]

    def at(self, path: str | Path, line: int | None = None) -> InputError:
        """The same error located in `path` (a check that names only the field, run on a file's part)."""
        return InputError(self.message, path, line, self.field)


def open_input(path: str | Path) -> BinaryIO:
    """Open an input file for reading, or fail with one message naming it."""
    try:
        return Path(path).open("rb")
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", path) from None


def command_prog(console: str, module: str) -> str:
    """A command's name as it was called, for its usage and error lines: the console script (`eagledata-generate`),
    else `python -m <module>`."""
    return console if Path(sys.argv[0]).name == console else f"python -m {module}"


def build_settings(parser: argparse.ArgumentParser, build: Callable[[], T]) -> T:
    """`build()` (a command's settings from its parsed flags), a value its checks refuse reported as argparse
    reports a bad flag: the usage, `<prog>: error: <message>`, exit 2, no traceback."""
    try:
        return build()
    except InputError as e:
        parser.error(str(e))


def run_command(prog: str, body: Callable[[], int | None]) -> int:
    """A command's exit code: bad input → its message and 2; a run that failed (RuntimeError) → 1.

    Anything else is a bug and keeps its traceback.
    """
    try:
        return body() or 0
    except InputError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
