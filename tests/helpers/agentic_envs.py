"""Planted environments for the agentic tests: each method is a way a call can go wrong (or a plain one that must
keep working after it). Loaded by the tests through the user-module route (`path/to/this.py:Class`)."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def tool(name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": properties or {}, "required": required or []}}}


class Planted:
    """A counter, and calls that raise, hang, eat memory, kill the process or reach for the host."""

    def __init__(self, initial_config: dict[str, Any]):
        self.count = int(initial_config.get("start", 0))

    def add(self, n: int) -> dict[str, int]:
        self.count += n
        return {"count": self.count}

    def boom(self) -> str:
        self.count += 1000  # a change before the raise: replays must repeat it
        raise RuntimeError("planted failure")

    def hang(self) -> str:
        while True:
            time.sleep(0.05)

    def hog(self) -> int:
        return len(bytearray(8 << 30))

    def crash(self) -> str:
        os._exit(7)

    def read_file(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def write_file(self, path: str, text: str) -> int:
        with open(path, "w") as f:
            return f.write(text)

    def connect(self) -> str:
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()
        return "connected"

    def spawn(self) -> str:
        return subprocess.run(["true"], check=False).args[0]

    def secret(self) -> str:
        return os.environ.get("EAGLEDATA_PLANTED_SECRET", "")


PLANTED_TOOLS = [tool("add", {"n": {"type": "integer"}}, ["n"]), tool("boom"), tool("hang"), tool("hog"),
                 tool("crash"), tool("read_file", {"path": {"type": "string"}}, ["path"]),
                 tool("write_file", {"path": {"type": "string"}, "text": {"type": "string"}}, ["path", "text"]),
                 tool("connect"), tool("spawn"), tool("secret")]


class Unseeded:
    """Randomness not seeded from the task: a rebuild cannot give the same results."""

    def __init__(self, initial_config: dict[str, Any]):
        self._random = random.Random()

    def roll(self) -> float:
        return self._random.random()


UNSEEDED_TOOLS = [tool("roll")]
