"""The batch route's state of each dataset (`LaneBatches`) and of each batch (`RoundInfo`), shared by the planner,
the service conversation, the settling and the run."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...prompts import Prompt
from ..conversations.turns import Conversation
from ..conversations.work import Work
from ..lanes import DatasetRun
from .journal import BatchEntry, BatchJournal

INPUTS = "batch_inputs"  # <dataset dir>/batch_inputs/<batch name>.jsonl: each batch's input file, kept


def messages_sha(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass
class RoundInfo:
    """One batch as the panel and the summary show it."""

    dataset: str
    round: int
    name: str
    lines: int
    batch_id: str | None = None
    status: str = "prepared"
    answered: int = 0
    failed: int = 0
    usd: float = 0.0
    booked_usd: float = 0.0
    started: float = 0.0   # the run's clock
    waited_s: float = 0.0
    window_end: float | None = None  # wall clock (time.time): the service answers its lines by then, or expires it

    def row(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "usd": round(self.usd, 10), "booked_usd": round(self.booked_usd, 10),
                "waited_s": round(self.waited_s, 1), "started": round(self.started, 1),
                "window_end": None if self.window_end is None else
                datetime.fromtimestamp(self.window_end, UTC).isoformat(timespec="seconds")}


@dataclass(eq=False)
class LaneBatches:
    """The batch route's state of one dataset: its journal, the conversations at hand, what the next round sends."""

    lane: DatasetRun
    journal: BatchJournal
    conversations: dict[str, Conversation] = field(default_factory=dict)
    unstarted: deque[Prompt] = field(default_factory=deque)  # taken from the scan, not started yet
    ready: list[Work] = field(default_factory=list)            # turns for the next round
    entry: BatchEntry | None = None                            # its batch in progress
    in_flight: dict[str, Work] = field(default_factory=dict)   # that batch's lines
    info: RoundInfo | None = None
    rounds: list[RoundInfo] = field(default_factory=list)
    went_on: int = 0
    ended: int = 0
    usd: float = 0.0   # what this run's answers of this dataset cost
    planned_rounds: int = 0  # the rounds it is planned to take (rounds.Rounds.planned_rounds)

    @property
    def rounds_used(self) -> int:
        """Its rounds so far, every run's (a batch sent again after a 404 or a failure counts: it took a round)."""
        return self.journal.rounds

    @property
    def dir(self) -> Path:
        return self.lane.store.files.directory

    def prompts(self) -> Iterator[Prompt]:
        """The prompts not started, in file order: those taken out of the scan first."""
        i = 0
        while True:
            if i < len(self.unstarted):
                yield self.unstarted[i]
            else:
                p = next(self.lane.prompts, None)
                if p is None:
                    self.lane.exhausted = True
                    return
                self.unstarted.append(p)
                yield p
            i += 1
