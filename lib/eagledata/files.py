"""Files every stage shares: atomic writes (a reader or a resume sees the old file or the new one, never
half), durable writes of many files at once, JSONL reading that names the bad line, and exclusive locks."""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import re
import sys
import threading
import uuid
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, open_input

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


def make_dir(path: str | Path, setting: str | None = None) -> Path:
    """`path` as a folder, made with its parents; one that cannot be made is an InputError naming the folder, what is
    in the way (a file where a folder must be) and the `setting` it came from (e.g. `output_dir`)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        there = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), None)
        why = f"{there} is a file, not a folder" if there is not None and not there.is_dir() else e.strerror
        raise InputError(f"cannot create the folder {path}: {why}", field=setting) from None
    return path


def atomic_write_lines(path: str | Path, chunks: Iterable[str]) -> Path:
    """Stream `chunks` to a temp file beside `path`, fsync, then rename over `path`."""
    path = Path(path)
    make_dir(path.parent)
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


# -- durability -------------------------------------------------------------------------------------
# Local block filesystems, where syncfs(2) writes back and flushes every file of the filesystem. Elsewhere
# (NFS, FUSE, anything unknown) only fsync(2) is trusted to put a file's bytes on stable storage.
SYNCFS_FLUSHES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"})
SYNC_FILE_RANGE_WRITE = 2


class LockHeld(Exception):
    """Another process holds the lock; `holder` is what it wrote into the lock file."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def hold_lock(path: str | Path, note: str, mode: int = 0o644) -> int:
    """An exclusive `flock` on `path` with `note` (who holds it) written inside. The descriptor returned holds
    it until closed, or until the process ends, SIGKILL included. Raises LockHeld with the holder's note."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        os.close(fd)
        raise LockHeld(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, note.encode(), 0)
    return fd


def fsync(path: str | Path) -> None:
    """A file's bytes, or a directory's entries, on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def filesystem_type(path: str | Path, mounts: str | None = None) -> str:
    """The type of the filesystem holding `path`: its longest mount point in `mounts` (/proc/self/mounts by
    default; a later line shadows an earlier one on the same point); "" when unknown."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return ""
    target, best, kind = os.path.realpath(path), "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # "\040" is a space
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


@lru_cache(maxsize=1)
def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    except (OSError, AttributeError):
        return None
    return libc


def _call(path: str | Path, syscall: str, *args: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if getattr(_libc(), syscall)(fd, *args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{syscall}: {os.strerror(err)}", str(path))
    finally:
        os.close(fd)


def batch_sync(directory: str | Path) -> bool:
    """Whether files written under `directory` can be made durable together (`start_writeback` each, one
    `syncfs`) instead of one fsync each: on Linux, on a local block filesystem."""
    return _libc() is not None and filesystem_type(directory) in SYNCFS_FLUSHES


def start_writeback(path: str | Path) -> None:
    """Have the kernel start writing `path`'s dirty pages now, without waiting (sync_file_range)."""
    _call(path, "sync_file_range", 0, 0, SYNC_FILE_RANGE_WRITE)


def syncfs(path: str | Path) -> None:
    """Everything written to `path`'s filesystem, data and metadata, on stable storage (syncfs)."""
    _call(path, "syncfs")


# -- writing around the page cache -------------------------------------------------------------------
DIRECT_ALIGN = 4096  # O_DIRECT wants address, offset and length aligned to the logical block; 4 KiB covers all
STAGING_BYTES = 8 << 20  # one write per 8 MiB: past ~1 MiB a direct write runs at the disk's stream speed
_staging = threading.local()


def staging_buffer() -> mmap.mmap:
    """This thread's page-aligned staging buffer, kept for the thread's life: memory a process touches again
    is ~40x faster than fresh memory on a VM whose free pages go back to the host (0.4 vs 18 GB/s here)."""
    buf = getattr(_staging, "buf", None)
    if buf is None:
        buf = _staging.buf = mmap.mmap(-1, STAGING_BYTES)
    return buf


class DirectFile:
    """A new file written with O_DIRECT from this thread's staging buffer, where the filesystem allows it.

    Why: a file written through the page cache is copied into freshly allocated cache pages; on this VM that copy
    runs at first-touch speed (perf: `copy_folio_from_iter_atomic` was 20 % of a conversion's CPU). A conversion's
    output is read by a trainer later, not now: written around the cache it costs no CPU and keeps the source's
    pages cached. Only the file's last partial block goes through the cache; all of it does where O_DIRECT is
    refused (tmpfs, some FUSE; an unusual block size). Durability is the caller's: O_DIRECT does not flush the
    disk's cache or the file's metadata, and the last block is a dirty page (fsync or syncfs does both).
    """

    def __init__(self, path: str | Path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            self.fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
            self.direct = hasattr(os, "O_DIRECT")
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.fd, self.direct = os.open(path, flags, 0o644), False
        self.shared = not getattr(_staging, "busy", False)  # a second file open in this thread gets its own
        self.buf = staging_buffer() if self.shared else mmap.mmap(-1, STAGING_BYTES)
        _staging.busy = True
        self.fill = self.size = 0

    def space(self) -> memoryview:
        """The free part of the staging buffer (never empty): fill some of it, then say how much with `wrote`."""
        if self.fill == len(self.buf):
            self._flush(self.fill)
        return memoryview(self.buf)[self.fill:]

    def wrote(self, n: int) -> None:
        self.fill += n
        self.size += n

    def write(self, data: Buffer) -> None:
        data = memoryview(data).cast("B")
        while data:
            space = self.space()
            n = min(len(space), len(data))
            space[:n] = data[:n]
            self.wrote(n)
            data = data[n:]

    def _flush(self, n: int) -> None:
        self._write(memoryview(self.buf)[:n])
        self.fill = 0

    def _write(self, view: memoryview) -> None:
        try:
            written = os.write(self.fd, view)
        except OSError as e:  # a block size O_DIRECT does not accept: the rest goes through the cache
            if e.errno != errno.EINVAL or not self.direct:
                raise
            self._through_cache()
            self.direct = False
            written = os.write(self.fd, view)
        if written != len(view):
            raise OSError(errno.EIO, f"short write ({written} of {len(view)} bytes)")

    def _through_cache(self) -> None:
        import fcntl

        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)

    def close(self) -> None:
        """Write what is staged and close: whole blocks directly, the last partial block through the cache
        (cutting a padded block off with ftruncate waited on the disk: 11 % of a conversion's samples)."""
        try:
            whole = self.fill - self.fill % DIRECT_ALIGN if self.direct else self.fill
            if whole:
                self._write(memoryview(self.buf)[:whole])
            if whole < self.fill:
                if self.direct:
                    self._through_cache()
                self._write(memoryview(self.buf)[whole:self.fill])
            self.fill = 0
        finally:
            os.close(self.fd)
            if self.shared:
                _staging.busy = False

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
