"""A folder carried to the GPU machine in parts: each device command carries at most 64 MiB (the working tree
included), and the machine keeps the ignored files an earlier command left while it stays in use, so a bundle larger
than that arrives whole over several commands, one part each, and is put together there.

`pack` cuts the folder's files into chunks, part after part, each part at most `part_bytes`, and writes
`manifest.json` (every file's size and sha256, every chunk's part and sha256) into every part, so any one part tells
what the whole is. `check_part` checks one part's chunks where they arrived (a broken transfer is found by the command
that carried it); `unpack` names every part still missing, then puts each file together and checks it whole.
Stdlib only: it runs on the GPU machine before anything is installed."""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def part_name(index: int) -> str:
    return f"{index:02d}"


@dataclass(frozen=True)
class Manifest:
    """The files (`path`, `bytes`, `sha256`, `chunks`: [part, chunk file, bytes, sha256] each) and the parts."""

    files: list[dict]
    parts: int
    part_bytes: int

    def chunks_of(self, part: int) -> list[list]:
        return [c for f in self.files for c in f["chunks"] if c[0] == part]

    def part_size(self, part: int) -> int:
        return sum(c[2] for c in self.chunks_of(part))

    def total(self) -> int:
        return sum(f["bytes"] for f in self.files)

    @staticmethod
    def read(part_dir: Path) -> Manifest:
        doc = json.loads((part_dir / MANIFEST).read_text())
        return Manifest(doc["files"], doc["parts"], doc["part_bytes"])


def pack(folder: Path, parts: Path, part_bytes: int) -> Manifest:
    """`folder`'s files cut into `parts/00/`, `parts/01/`, …, each at most `part_bytes` (the manifest aside); a part
    is filled before the next begins. `parts` is made anew."""
    if part_bytes < 1:
        raise ValueError("part_bytes must be positive")
    if parts.exists():
        shutil.rmtree(parts)
    files, part, room = [], 0, part_bytes
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        entry = {"path": rel, "bytes": path.stat().st_size, "sha256": sha256(path), "chunks": []}
        with path.open("rb") as f:
            while True:
                if room == 0:
                    part, room = part + 1, part_bytes
                data = f.read(room)
                if not data:
                    break
                name = f"{len(files):04d}.{len(entry['chunks']):03d}"
                target = parts / part_name(part) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                entry["chunks"].append([part, name, len(data), hashlib.sha256(data).hexdigest()])
                room -= len(data)
        files.append(entry)
    count = max((c[0] for f in files for c in f["chunks"]), default=-1) + 1
    manifest = Manifest(files, count, part_bytes)
    doc = json.dumps({"files": files, "parts": count, "part_bytes": part_bytes}, indent=1) + "\n"
    for index in range(count):
        (parts / part_name(index) / MANIFEST).write_text(doc)
    return manifest


def check_part(parts: Path, index: int) -> Manifest:
    """Part `index` as it arrived: every chunk there, each its size and sha256; a `ValueError` naming the first that
    is not."""
    where = parts / part_name(index)
    if not (where / MANIFEST).is_file():
        raise ValueError(f"part {part_name(index)} has not arrived: no {where / MANIFEST}")
    manifest = Manifest.read(where)
    for _, name, size, digest in manifest.chunks_of(index):
        chunk = where / name
        if not chunk.is_file() or chunk.stat().st_size != size or sha256(chunk) != digest:
            raise ValueError(f"part {part_name(index)}: chunk {name} is missing or damaged ({chunk})")
    return manifest


def missing_parts(parts: Path) -> list[str]:
    """The parts not here yet, by a manifest any arrived part holds (all of them when none has)."""
    arrived = sorted(p for p in parts.glob("*/" + MANIFEST)) if parts.exists() else []
    if not arrived:
        return ["all (no part has arrived)"]
    manifest = Manifest.read(arrived[0].parent)
    return [part_name(i) for i in range(manifest.parts) if not (parts / part_name(i) / MANIFEST).is_file()]


def unpack(parts: Path, folder: Path) -> Manifest:
    """Every file put together into `folder` and checked whole (its size and sha256); refused, naming them, while
    a part is missing."""
    missing = missing_parts(parts)
    if missing:
        raise ValueError(f"parts not arrived: {', '.join(missing)} (under {parts})")
    manifest = Manifest.read(next(parts.glob("*/" + MANIFEST)).parent)
    for index in range(manifest.parts):
        check_part(parts, index)
    for f in manifest.files:
        target = folder / f["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            for part, name, _, _ in f["chunks"]:
                with (parts / part_name(part) / name).open("rb") as chunk:
                    shutil.copyfileobj(chunk, out)
        if target.stat().st_size != f["bytes"] or sha256(target) != f["sha256"]:
            raise ValueError(f"{f['path']} put together is not the file packed")
    return manifest
