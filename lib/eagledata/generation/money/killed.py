"""The streams a killed run left in flight: journaled as they start, their cost read back by the next run.

A stream's generation id arrives with its response's first bytes (the `X-Generation-Id` header; else its first chunk),
long before its answer is whole. The engine appends it to its dataset's `streams.jsonl` the moment it comes, and
`{"end": id}` once the attempt ends in this process (recorded, retried or cancelled: the run books those itself). A
SIGKILL leaves ids with no end. The next run reads what each cost from the generation endpoint
(`openrouter.read_generation`): on a provider with stream cancellation only what it generated before the dead
process's connection closed, elsewhere the whole answer. Its summary shows them as `run.killed_before`: paid for, and
no record holds them. An id the service does not know yet (an answer still being generated upstream: the endpoint lags
its end) is read again when the run ends, and kept for the next run if still unknown then.

What each stream delivers is journaled too, as it arrives (`{"text": id, "reasoning"|"reasoning_content"|"content":
piece}`, and `"reasoning_details_text"` for reasoning a provider serves only in `reasoning_details`; every stream's
new text in one write a second: `Journals.flush`, so a kill loses at most the last second).
The run after a kill keeps each killed stream's delivered prefix as a pause sample (`meta.cut: killed`, exact ids to its
last whole word, as a Ctrl-C's; realtime/salvage.py) where the provider served it faithfully, and asks its turn again.
The text lines go with the first rewrite after that run's start.

A stream killed before the service named it is in no journal; its cost is in the account only. So each run also
journals where the account stood when it began (`Baseline`: the key's usage and what the records of the run's
datasets cost), kept until a summary is written. The run after a kill (or a chain of them) finds the baseline of the
first killed run and tells what the killed runs were charged beyond what their records hold, by its own start:
`run.killed_wasted_usd` (every stream they left, named or not, and their retries; answers still generating upstream
are billed during this run, in its own figures).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ...openrouter.client import read_generation
from ...openrouter.stream import DELIVERED, DETAILS_TEXT
from .readback import read_generations

CARRIED = ("streams", "read", "cancelled", "usd")  # a `carried` line's figures


def _events(path: Path) -> Iterator[dict]:
    """The journal's lines, read (a torn or unreadable line is skipped)."""
    if not path.exists():
        return
    for raw in path.read_bytes().splitlines():
        try:
            d = json.loads(raw)
        except ValueError:
            continue
        if isinstance(d, dict):
            yield d


@dataclass(frozen=True)
class Baseline:
    """Where the account stood when a run began: the key's lifetime usage, the datasets of the run and what their
    records had cost by then (the stores' totals)."""

    usage_usd: float
    recorded_usd: float
    datasets: tuple[str, ...]

    def line(self) -> dict:
        return {"baseline": {"usage_usd": self.usage_usd, "recorded_usd": self.recorded_usd,
                             "datasets": list(self.datasets)}}

    def wasted(self, usage_now: float, recorded_now: dict[str, float]) -> float | None:
        """What the runs since this baseline were charged beyond what their records cost (`recorded_now`: each
        dataset's store total now); None when a dataset of theirs is not among `recorded_now`."""
        if not set(self.datasets) <= set(recorded_now):
            return None
        return max(0.0, (usage_now - self.usage_usd) - (sum(recorded_now[d] for d in self.datasets)
                                                        - self.recorded_usd))


def baseline(path: Path) -> Baseline | None:
    """The first baseline the journal holds (a killed run's, kept until a summary is written), None when none."""
    return _baseline(_events(path))


def _baseline(events: Iterable[dict]) -> Baseline | None:
    for d in events:
        b = d.get("baseline")
        if isinstance(b, dict):
            try:
                return Baseline(float(b["usage_usd"]), float(b["recorded_usd"]), tuple(b["datasets"]))
            except (KeyError, TypeError, ValueError):
                continue
    return None


def _carried(events: Iterable[dict]) -> KilledBefore | None:
    """What earlier runs read of the streams killed runs left and no summary has shown yet (a run that read them and
    was killed in turn before its summary carries them on), None when nothing is."""
    out = None
    for d in events:
        if isinstance(d.get("carried"), dict):
            out = (out or KilledBefore()).add(KilledBefore(**{k: d["carried"][k] for k in CARRIED}))
    return out


@dataclass
class Delivered:
    """What a stream a killed run left had delivered, as its journal holds it: its turn, and its text as a delta."""

    generation_id: str
    conversation_id: str
    turn_id: str
    provider: str = ""
    model: str = ""
    text: dict[str, list[str]] = field(default_factory=dict)  # delta field -> its pieces, in order

    def delta(self) -> dict[str, Any]:
        """Its text as one stream delta (reasoning served only in `reasoning_details` back in that field)."""
        out: dict[str, Any] = {name: "".join(pieces) for name, pieces in self.text.items()}
        if (details := out.pop(DETAILS_TEXT, None)) is not None:
            out["reasoning_details"] = [{"type": "reasoning.text", "text": details, "index": 0}]
        return out


def _delivered(events: Iterable[dict], ids: Iterable[str]) -> dict[str, Delivered]:
    """The text each of `ids` delivered (streams journaled with their conversation, that delivered any)."""
    wanted = set(ids)
    out: dict[str, Delivered] = {}
    for d in events:
        if d.get("start") in wanted and isinstance(d.get("conversation"), str):
            out[d["start"]] = Delivered(d["start"], d["conversation"], str(d.get("turn", "")))
        elif (gid := d.get("text")) in out:
            got = out[gid]
            got.provider = got.provider or str(d.get("provider") or "")
            got.model = got.model or str(d.get("model") or "")
            for name in (*DELIVERED, DETAILS_TEXT):
                if isinstance(piece := d.get(name), str):
                    got.text.setdefault(name, []).append(piece)
    return {gid: got for gid, got in out.items() if got.text}


def leftovers(path: Path) -> list[str]:
    """The ids a journal holds without an end, in the order they started (a torn last line is ignored)."""
    return _leftovers(_events(path))


def _leftovers(events: Iterable[dict]) -> list[str]:
    started: dict[str, None] = {}
    for d in events:
        if "start" in d:
            started[d["start"]] = None
        elif "end" in d:
            started.pop(d["end"], None)
    return list(started)


class StreamJournal:
    """`streams.jsonl` of one dataset in this run: appends only (one write each, no sync: a SIGKILL keeps what the
    kernel holds); `rewrite` leaves the ids still to be read."""

    def __init__(self, path: Path):
        self.path = path
        events = list(_events(path))    # the journal, read once
        self.before = _leftovers(events)  # what an earlier run left
        self.carried = _carried(events)   # what earlier runs read of such streams, not shown by a summary yet
        self.killed = _baseline(events)   # where the account stood when the first killed run since a summary began
        self.delivered = _delivered(events, self.before)  # what those streams had delivered
        self.baseline = self.killed    # the one kept: the killed run's, else this run's
        self.open: set[str] = set()
        if path.exists() and (data := path.read_bytes()) and not data.endswith(b"\n"):  # a torn last line
            with path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def _append(self, *objs: dict) -> None:
        data = "".join(json.dumps(obj, ensure_ascii=False) + "\n" for obj in objs).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            n = os.write(fd, data)
            while n < len(data):
                n += os.write(fd, data[n:])
        finally:
            os.close(fd)

    def begin(self, where: Baseline) -> None:
        """This run begins at `where`: journaled unless a killed run's baseline is kept (the chain's start)."""
        if self.baseline is None:
            self.baseline = where
            self._append(where.line())

    def started(self, generation_id: str, turn_id: str, conversation_id: str) -> None:
        if generation_id not in self.open:
            self.open.add(generation_id)
            self._append({"start": generation_id, "turn": turn_id, "conversation": conversation_id})

    def append_text(self, texts: list[dict]) -> None:
        """What open streams delivered since the last call (`{"text": id, provider?, model?, <delta fields>}` each),
        in one write."""
        if texts:
            self._append(*texts)

    def ended(self, generation_id: str) -> None:
        if generation_id in self.open:
            self.open.discard(generation_id)
            self._append({"end": generation_id})

    def rewrite(self, unread: Iterable[str], carry: KilledBefore | None = None, *, summarized: bool = False) -> None:
        """Keep only `unread` (an earlier run's ids the service could not tell yet), what was read of the others until
        a summary shows it (`carry`: this run may be killed before writing one), this run's open ones, and the
        baseline until a summary is written (`summarized`)."""
        if summarized:
            self.baseline = None
        keep = [*unread, *sorted(self.open)]
        tmp = self.path.with_suffix(".tmp")
        lines = [json.dumps(self.baseline.line()) + "\n"] if self.baseline is not None else []
        lines += [json.dumps({"start": gid}) + "\n" for gid in keep]
        if carry is not None and (read := carry.streams - len(carry.unread)):  # the unread ones: `start` lines above
            lines.append(json.dumps({"carried": {**{k: getattr(carry, k) for k in CARRIED}, "streams": read}}) + "\n")
        if not lines and not self.path.exists():
            return  # nothing to keep, and no journal yet: none is made
        tmp.write_text("".join(lines))
        os.replace(tmp, self.path)


@dataclass
class KilledBefore:
    """What the streams an earlier, killed run left cost, as the generation endpoint tells it."""

    streams: int = 0
    read: int = 0
    cancelled: int = 0        # stopped when the dead process's connection closed (billed until then)
    usd: float = 0.0
    unread: list[str] = field(default_factory=list)  # not known to the service (yet)
    # of `usd`, what the ids unknown at this run's start cost, read at its end: answers that ended upstream during
    # this run, so billed in its account delta too (its `foreign_usd`: usage it did not book); never carried on
    late_usd: float = 0.0
    costs: dict[str, float] = field(default_factory=dict, repr=False)  # id -> its cost, as read by this run
    kept: int = 0             # of the streams, kept by this run as pause samples (what they delivered)
    kept_usd: float = 0.0     # what those records hold (their prompt and prefix at the provider's price)
    not_kept: dict[str, int] = field(default_factory=dict)  # streams that delivered text, kept as no sample: why

    def add(self, other: KilledBefore | None) -> KilledBefore:
        """Both readings together (the unread ids are this one's)."""
        if other is not None:
            self.streams += other.streams
            self.read += other.read
            self.cancelled += other.cancelled
            self.usd += other.usd
            self.late_usd += other.late_usd
        return self

    def figures(self) -> dict:
        return {"streams": self.streams, "read": self.read, "cancelled": self.cancelled, "usd": round(self.usd, 8),
                "unread": len(self.unread), "late_usd": round(self.late_usd, 8), "kept": self.kept,
                "kept_usd": round(self.kept_usd, 8), "not_kept": dict(self.not_kept)}


async def read_killed(client: httpx.AsyncClient, ids: list[str], found: KilledBefore | None = None) -> KilledBefore:
    """Read each id's cost (`found`: what an earlier reading of the same ids already holds, its unread ones read
    again); a service error leaves an id unread, it never stops the run."""
    out = found or KilledBefore(streams=len(ids))
    todo = list(out.unread) if found else list(ids)
    out.unread = []
    for gid, stats in zip(todo, await read_generations(read_generation, client, todo)):
        if stats is None:
            out.unread.append(gid)
            continue
        out.read += 1
        out.cancelled += stats.cancelled
        out.usd += stats.total_cost
        out.costs[gid] = stats.total_cost
        if found is not None:
            out.late_usd += stats.total_cost
    return out
