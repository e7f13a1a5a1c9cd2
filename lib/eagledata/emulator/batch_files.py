"""Moonshot's Batch API, emulated: the organization's files. Uploads (purpose "batch", checked as Moonshot checks
them) and the output and error files batches make (purpose "batch_output")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .batch_requests import BatchError, new_id
from .config import BatchConfig


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str  # "batch" (an upload) | "batch_output" (a batch's output or error file)
    created_at: int
    data: bytes

    def obj(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": len(self.data), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "ok", "status_details": ""}


class Files:
    """The files by id, in the order they were made."""

    def __init__(self) -> None:
        self.by_id: dict[str, StoredFile] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def listing(self) -> list[dict]:
        return [f.obj() for f in self.by_id.values()]

    def upload(self, cfg: BatchConfig, filename: str, purpose: Any, data: bytes, created_at: int) -> StoredFile:
        if purpose != "batch":
            raise BatchError(400, f"purpose must be 'batch', got {purpose!r}")
        if not filename.endswith(".jsonl"):
            raise BatchError(400, f"the file must be a .jsonl file, got {filename!r}")
        if not data:
            raise BatchError(400, "the file is empty")
        if len(data) > cfg.max_file_bytes:
            raise BatchError(400, f"the file is {len(data)} bytes, over the limit of {cfg.max_file_bytes}")
        held = sum(f.purpose == "batch" for f in self.by_id.values())
        if held >= cfg.max_files:
            raise BatchError(400, f"the organization already holds {held} batch files (the limit): delete some first")
        return self._add(StoredFile(new_id("file-"), filename, "batch", created_at, data))

    def output(self, filename: str, rows: list[str], created_at: int) -> StoredFile:
        """A batch's output or error file: its JSONL lines."""
        return self._add(StoredFile(new_id("file-"), filename, "batch_output", created_at,
                                    ("\n".join(rows) + "\n").encode()))

    def get(self, file_id: str) -> StoredFile:
        if file_id not in self.by_id:
            raise BatchError(404, f"file {file_id} not found")
        return self.by_id[file_id]

    def delete(self, file_id: str) -> dict:
        del self.by_id[self.get(file_id).id]
        return {"id": file_id, "object": "file", "deleted": True}

    def _add(self, f: StoredFile) -> StoredFile:
        self.by_id[f.id] = f
        return f
