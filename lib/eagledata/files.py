"""Files every stage shares: atomic writes (a reader or a resume sees the old file or the new one, never
half) and JSONL reading that names the bad line."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import InputError, open_input


def atomic_write_lines(path: str | Path, chunks: Iterable[str]) -> Path:
    """Stream `chunks` to a temp file beside `path`, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(chunks)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_lines(path, [text])


def iter_jsonl(path: str | Path, *, tolerate_torn_tail: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line; a bad line raises naming file:line.

    `tolerate_torn_tail`: a last line without its newline that does not parse is what a kill
    mid-write leaves; it is dropped instead of failing (checkpoint resume).
    """
    path = Path(path)
    with open_input(path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield lineno, json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                if tolerate_torn_tail and not raw.endswith(b"\n"):
                    return
                raise InputError(f"not valid JSON: {getattr(e, 'msg', e)}", path, lineno) from None


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> Path:
    """Atomically, one compact JSON object per line, non-ASCII kept as is."""
    return atomic_write_lines(path, (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"
                                     for row in rows))
