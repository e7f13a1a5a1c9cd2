"""How fast this disk takes many small files made durable in different ways, with no serialization at all.

Each mode writes N ready-made buffers (0.53 MB: a 10k-sample H = 256 conversion's mean file) as temp files, makes
them durable, renames them into place and fsyncs the folder, 400 files per batch, as `write_durably` does:

- `stream`: the same bytes as one file and one fsync (the disk's bandwidth in convert_bench.py);
- `fsync`: an fsync per file, 8 threads (the portable way, and `write_durably` on NFS or FUSE);
- `syncfs`: no per-file sync, one `syncfs` per batch;
- `writeback_syncfs`: `sync_file_range(WRITE)` as each file is written, one `syncfs` per batch (`write_durably`
  on a local block filesystem).

Nothing is deleted until every mode has run (on an ext4 without a journal, files created within minutes of a big
deletion are much slower to create: see bench/README.md); start it minutes after the last big deletion.

    python bench/small_files_probe.py --files 6000 --dir /work
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagledata.files import fsync, start_writeback, syncfs

BATCH = 400
MODES = ("stream", "fsync", "syncfs", "writeback_syncfs")


def write(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def run(mode: str, root: Path, files: int, data: bytes) -> float:
    root.mkdir()
    start = time.perf_counter()
    if mode == "stream":
        with (root / "stream").open("wb") as f:
            for _ in range(files):
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
    else:
        with ThreadPoolExecutor(8) as pool:
            for first in range(0, files, BATCH):
                batch = range(first, min(files, first + BATCH))
                if mode == "fsync":
                    tmps = list(pool.map(lambda i: write(root / f".t{i}", data), batch))
                    list(pool.map(fsync, tmps))
                else:
                    tmps = [write(root / f".t{i}", data) for i in batch]
                    if mode == "writeback_syncfs":
                        for tmp in tmps:
                            start_writeback(tmp)
                    syncfs(root)
                for i, tmp in zip(batch, tmps):
                    os.replace(tmp, root / f"f{i}")
                fsync(root)
    return files * len(data) / 1e6 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=6000)
    parser.add_argument("--size", type=int, default=530_000)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--dir", default=None, help="a directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    data = os.urandom(args.size)
    base = Path(tempfile.mkdtemp(prefix="small-files-", dir=args.dir))
    try:
        for n, mode in enumerate(args.modes):
            print(f"{mode:17s} {run(mode, base / f'{n}-{mode}', args.files, data):5.0f} MB/s", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
