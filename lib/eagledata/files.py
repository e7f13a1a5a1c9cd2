"""Atomic file writes: a reader (or a resume after a kill) sees the old file or the new one, never half."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterable


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
