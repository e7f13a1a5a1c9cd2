"""The batch route's state of one dataset: `batches.jsonl` beside its records, an append-only journal of events.

A batch goes prepared → uploaded → created → settled, each step one line written (and synced) before the next call
to the service, so a kill at any instant leaves a state a rerun can adopt (route.py):
- `prepared`: the round, the batch's name (also the uploaded file's name and the batch's metadata), and which turn
  each line holds (its custom_id, tries, cost bound and a hash of its messages); the lines themselves are written to
  `batch_inputs/<name>.jsonl` first; a dataset's first batch also holds the rounds it is planned to take
  (`planned_rounds`), so that a rerun reports its rounds against the same plan;
- `uploaded`: the input file's id; `created`: the batch's id;
- `settled`: the batch's end (`batch_status`: the service's, or `vanished` when it answered 404 for a journaled batch),
  and each line's outcome (`recorded`, `failed` for good, `retry` counted against `max_attempts`, `resend` not
  counted: expired, cancelled, vanished).
A rerun reads the journal: an entry prepared but not uploaded is matched to the account's files by name, one
uploaded but not created to its batches by metadata, so no line is sent twice. A torn last line (a kill mid-write)
is dropped, as the store drops a torn record.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ...errors import InputError

LineOutcome = Literal["recorded", "failed", "retry", "resend"]
COUNTED: tuple[LineOutcome, ...] = ("retry",)  # outcomes that count against max_attempts (`failed` ends the turn)


@dataclass(frozen=True)
class JournalLine:
    """Which turn one line of a batch holds."""

    custom_id: str
    conversation_id: str
    turn: int
    tries: int                # this line included
    bound_usd: float          # its worst case at the batch price, booked when submitted
    prompt_tokens: int
    sha: str                  # of its messages: a rerun on a changed prompt file is refused, not recorded


@dataclass
class BatchEntry:
    """One batch of one dataset, as far as the journal knows it."""

    name: str
    round: int
    lines: dict[str, JournalLine]
    file_id: str | None = None
    batch_id: str | None = None
    status: str = "prepared"
    outcomes: dict[str, LineOutcome] = field(default_factory=dict)
    usd: float = 0.0          # what its answers cost (batch price), once settled
    submitted_at: float = 0.0  # wall clock (time.time) when prepared
    planned_rounds: int | None = None  # the dataset's plan, on its first batch

    @property
    def settled(self) -> bool:
        return self.status == "settled"

    @property
    def bound_usd(self) -> float:
        return sum(line.bound_usd for line in self.lines.values())


class BatchJournal:
    """`batches.jsonl` of one dataset (its store holds the dataset's lock, so one writer)."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, BatchEntry] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):  # a torn last event: the step it names did not happen as far as a rerun knows
            with self.path.open("r+b") as f:
                f.truncate(keep)
        for n, raw in enumerate(data[:keep].splitlines(), 1):
            try:
                self._apply(json.loads(raw))
            except (ValueError, KeyError, TypeError) as e:
                raise InputError(f"line {n} is not a batch journal event ({e}): was the file edited?",
                                 self.path) from None

    def _apply(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "prepared":
            lines = {d["custom_id"]: JournalLine(**d) for d in ev["lines"]}
            self.entries[ev["name"]] = BatchEntry(ev["name"], ev["round"], lines, submitted_at=ev.get("at", 0.0),
                                                  planned_rounds=ev.get("planned_rounds"))
            return
        entry = self.entries[ev["name"]]
        if kind == "uploaded":
            entry.file_id, entry.status = ev["file_id"], "uploaded"
        elif kind == "created":
            entry.batch_id, entry.status = ev["batch_id"], "created"
        elif kind == "settled":
            entry.status, entry.outcomes, entry.usd = "settled", dict(ev["outcomes"]), float(ev["usd"])
        else:
            raise KeyError(kind)

    def _write(self, ev: dict[str, Any]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(ev, ensure_ascii=False) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._apply(ev)

    def prepared(self, name: str, round_: int, lines: Iterable[JournalLine], at: float,
                 planned_rounds: int | None = None) -> BatchEntry:
        plan = {} if planned_rounds is None else {"planned_rounds": planned_rounds}
        self._write({"event": "prepared", "name": name, "round": round_, "at": round(at, 3), **plan,
                     "lines": [asdict(line) for line in lines]})
        return self.entries[name]

    def uploaded(self, name: str, file_id: str) -> None:
        self._write({"event": "uploaded", "name": name, "file_id": file_id})

    def created(self, name: str, batch_id: str) -> None:
        self._write({"event": "created", "name": name, "batch_id": batch_id})

    def settled(self, name: str, outcomes: dict[str, LineOutcome], usd: float, status: str) -> None:
        self._write({"event": "settled", "name": name, "batch_status": status, "outcomes": outcomes,
                     "usd": round(usd, 10)})

    @property
    def pending(self) -> list[BatchEntry]:
        return [e for e in self.entries.values() if not e.settled]

    @property
    def planned_rounds(self) -> int | None:
        """The rounds the dataset was planned to take when its first batch was prepared (None before)."""
        return next((e.planned_rounds for e in sorted(self.entries.values(), key=lambda e: e.round)
                     if e.planned_rounds is not None), None)

    @property
    def rounds(self) -> int:
        return max((e.round for e in self.entries.values()), default=0)

    def attempts(self, custom_id: str) -> int:
        """How many settled lines of this turn failed in a way that counts against `max_attempts`."""
        return sum(1 for e in self.entries.values() if e.outcomes.get(custom_id) in COUNTED)

    def tries(self, custom_id: str) -> int:
        return sum(1 for e in self.entries.values() if custom_id in e.lines)
