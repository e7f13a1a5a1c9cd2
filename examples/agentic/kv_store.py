"""A user's own environment for agentic tasks: a small key-value store (see lib/eagledata/agentic/README.md,
"Your own environment"). A task file names it as `environment: "kv_store.py:KeyValueStore"` (a path relative to the
task file) or, when this folder is importable, `kv_store:KeyValueStore`.

The contract: the class is constructed as `KeyValueStore(initial_config)` with a copy of the task's initial_config;
each public method is a function the task's tools offer, called with the call's JSON arguments as keyword arguments;
its return value is shown to the model as BFCL shows it (a str as is, a dict as JSON, anything else as str()); an
exception is shown as `Error during execution: <message>`. It must be deterministic given its initial_config and the
calls so far (seed any randomness from initial_config): a rebuild replays the calls and expects the same results.
It runs in a worker process with a time limit per call and a memory limit, and may not touch the host's files,
processes or network."""
from __future__ import annotations

import random
from typing import Any


class KeyValueStore:
    def __init__(self, initial_config: dict[str, Any]):
        self.items: dict[str, str] = dict(initial_config.get("items", {}))
        self._random = random.Random(initial_config.get("random_seed", 0))  # seeded: replays agree

    def put(self, key: str, value: str) -> dict[str, Any]:
        """Store `value` under `key`."""
        self.items[key] = value
        return {"stored": key, "size": len(self.items)}

    def get(self, key: str) -> str:
        """The value under `key`."""
        if key not in self.items:
            raise KeyError(f"no key {key!r}")
        return self.items[key]

    def keys(self, prefix: str = "") -> list[str]:
        """The keys starting with `prefix`, sorted."""
        return sorted(k for k in self.items if k.startswith(prefix))

    def new_ticket(self) -> dict[str, Any]:
        """A fresh random ticket number stored under `ticket` (seeded randomness)."""
        self.items["ticket"] = str(self._random.randint(100000, 999999))
        return {"ticket": self.items["ticket"]}
