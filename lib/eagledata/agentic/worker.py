"""The worker: one environment in a process of its own, speaking JSON lines on its stdin and stdout
(`contained.py` starts it and is the only side that reads this protocol).

    parent -> {"spec": EnvironmentSpec, "memory_bytes": N, "alarm_s": S}
                                                               worker -> {"ready": true} | {"failed": message}
    parent -> {"name": ..., "arguments": "<json text>"}        worker -> {"text": ..., "error": kind | null}

Before it builds anything it limits itself (`limit_resources`: address space, no file growth, no core dumps); once
built, before the first call, it installs an audit hook (`guard`) that refuses, inside the environment's code,
writing any file, reading a file outside the code's folders, listing folders outside them, sockets, starting or
signalling processes, and ctypes. A call that runs out of memory is answered, then the worker exits: a process that
hit its limit is not trusted with the next call. Each call runs under `alarm(alarm_s)` (well past the parent's own
limit): a worker whose parent died while a call hung ends itself; one idle ends when its stdin closes. What this
does not give (documented in agentic/README.md): no network namespace, no separate user; code that reaches for C (an
extension module already loaded) is not stopped."""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from .backends import EnvironmentSpec, build_dispatcher
from .calls import OUT_OF_MEMORY, Call
from .dispatch import BuildError

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DENIED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "os.kill", "os.killpg", "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown",
          "os.link", "os.symlink", "os.truncate", "os.utime", "os.putenv", "os.unsetenv", "os.chdir", "os.setxattr",
          "os.removexattr", "shutil.", "ctypes.", "pty.", "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.",
          "poplib.", "imaplib.", "nntplib.", "telnetlib.", "sqlite3.", "mmap.")
LISTING = ("os.listdir", "os.scandir", "glob.glob", "glob.glob/2")


def limit_resources(memory_bytes: int) -> None:
    """Address space capped (a runaway allocation is a MemoryError here, not the host's trouble), no file may grow
    (RLIMIT_FSIZE 0: the worker's output is a pipe), no core file."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def guard(roots: Sequence[str]) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook: the environment may read its code (files under `roots`) and nothing else of the host."""
    real_roots = [os.path.realpath(r) for r in roots]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:  # an open descriptor of this process
                return
            where = os.path.realpath(os.fsdecode(path))
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS:
                raise PermissionError(f"writing {where} is not allowed in an environment")
            if not _inside(where, real_roots):
                raise PermissionError(f"reading {where} is not allowed in an environment")
        elif event in LISTING:
            path = args[0] if args and args[0] is not None else "."
            if not isinstance(path, int) and not _inside(os.path.realpath(os.fsdecode(path)), real_roots):
                raise PermissionError(f"listing {os.path.realpath(os.fsdecode(path))} is not allowed in an "
                                      "environment")
        elif event.startswith(DENIED):
            raise PermissionError(f"{event} is not allowed in an environment")

    return hook


def code_roots(spec: EnvironmentSpec) -> list[str]:
    """The folders the environment may read: the interpreter's import path and the environment's own code."""
    roots = [p for p in (*sys.path, *spec.code_path) if p and os.path.isdir(p)]
    where = spec.backend.rpartition(":")[0]
    if where.endswith(".py"):
        roots.append(os.path.dirname(os.path.abspath(where)))
    return roots


def serve(requests: BinaryIO, replies: BinaryIO) -> int:
    """The protocol loop; returns the exit code."""
    def send(obj: dict[str, Any]) -> None:
        replies.write(json.dumps(obj).encode("utf-8") + b"\n")
        replies.flush()

    hello = requests.readline()
    if not hello:
        return 0
    opening = json.loads(hello)
    spec = EnvironmentSpec.from_dict(opening["spec"])
    limit_resources(int(opening["memory_bytes"]))
    try:
        dispatcher = build_dispatcher(spec)
    except BuildError as e:
        send({"failed": e.message})
        return 0
    except MemoryError:
        send({"failed": f"building the environment needs more than the memory limit ({opening['memory_bytes']:,} "
                        "bytes of address space)"})
        return 0
    sys.addaudithook(guard(code_roots(spec)))
    send({"ready": True})
    for line in requests:
        request = json.loads(line)
        signal.alarm(int(opening.get("alarm_s", 0)))
        result = dispatcher.execute(Call(request["name"], request["arguments"]))
        signal.alarm(0)
        send({"text": result.text, "error": result.error})
        if result.error == OUT_OF_MEMORY:
            return 3
    return 0


def main() -> None:
    """The protocol on private descriptors; whatever the environment prints goes to stderr, never into replies."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdout = sys.stderr
    sys.exit(serve(requests, replies))


if __name__ == "__main__":
    main()
