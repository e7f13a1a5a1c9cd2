"""Checkpoint store of one dataset: records.jsonl and failures.jsonl, crash-safe, one writer at a time.

Each finished prompt is one line written by a single `write` on an O_APPEND descriptor, so a SIGKILL
leaves whole lines plus at most one torn tail, which the next open cuts off (kept aside in
`records.jsonl.torn`). An index of finished ids (`done.idx`, id + byte offset) makes resume start-up
independent of record size; it is only a cache: lines past its last offset are re-read from the file.
Paths come from `eagledata.paths.DatasetFiles`.

Conversations (conversations/turns.py): a record that does not finish its conversation (a turn with more to come, its
record's `meta.turns` saying how many) leaves the conversation open; `finished` says which conversations are
done (their last turn recorded, a cut turn, or a failure), which is what a resume skips, and `chains` where the
recorded turns of each open one are, so that a resume continues it at the next turn from its recorded answers.

A pause sample (conversations/turns.py `pauses`: the prefix of a stream a Ctrl-C closed, or a SIGKILL left) is a record
under its own id (`<turn id>~n`) that neither answers its turn nor ends its conversation: the turn stays to do, and
the next run asks it again. It counts in `spend_usd` (it was paid for) and `paused`, not in `output_tokens` (what a
token target counts: training keeps the finished answer to the same prompt in its place) nor in the priors.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...files import LockHeld, atomic_write_text, hold_lock, iter_jsonl, make_dir
from ...paths import DatasetFiles
from ...records import Record, output_tokens
from .rollouts import rollout_ends
from .turns import PAUSE_SEP, conversation_ends, pause_id, pauses

COSTS_KEPT = 20_000  # the newest records' costs and lengths: the priors of the next run


class StoreLocked(InputError):
    """Another run holds this dataset's lock."""


def _repair_tail(path: Path) -> int:
    """Cut a torn last line (no newline) off `path`; return the bytes removed (saved to .torn)."""
    if not path.exists():
        return 0
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        pos = size
        chunk = 1 << 16
        while pos > 0:  # find the last newline
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            nl = buf.rfind(b"\n")
            if nl >= 0:
                cut = start + nl + 1
                break
            pos = start
        else:
            cut = 0
        f.seek(cut)
        torn = f.read()
        with open(str(path) + ".torn", "ab") as t:
            t.write(torn + b"\n")
        f.truncate(cut)
        os.fsync(f.fileno())
        return len(torn)


# One record as the index keeps it, a plain tuple (a million are read at every resume): (id, end offset of its line,
# output tokens, cost USD) for a record that is its own conversation, finished; any other (a turn of a chained
# conversation, a pause sample) adds (conversation id, turn, what it does to its conversation: `GOES_ON`, `ENDS`,
# `PAUSES`).
Entry = tuple
GOES_ON, ENDS, PAUSES = 0, 1, 2


def _entry(rid: str, end: int, tokens: int, cost: float, conversation: str, turn: int, does: int) -> Entry:
    return (rid, end, tokens, cost) if conversation == rid and does == ENDS else (rid, end, tokens, cost, conversation,
                                                                                 turn, does)


def _index_line(e: Entry) -> str:
    line = f"{e[0]}\t{e[1]}\t{e[2]}\t{e[3]!r}"
    return line + "\n" if len(e) == 4 else f"{line}\t{e[4]}\t{e[5]}\t{e[6]}\n"


def _does(turn: int, meta: dict[str, Any], finish_reason: str | None) -> int:
    """A record's turn, its `meta` (`turns`: its chain's last turn; `ended`: a tool-call mismatch; `cut`: a pause
    sample's; `rollout`: a rollout's step, and whether it ended its trajectory) and its finish reason → what it does to
    its conversation (`GOES_ON`, `ENDS`, `PAUSES`)."""
    if pauses(meta):
        return PAUSES
    if isinstance(rollout := meta.get("rollout"), dict):
        return ENDS if rollout_ends(rollout, finish_reason) else GOES_ON
    return ENDS if conversation_ends(turn, meta.get("turns"), finish_reason, meta.get("ended")) else GOES_ON


def _entries_of_lines(path: Path, start: int = 0) -> list[Entry]:
    """Index entries of every line from byte `start`; a line that is not JSON is an error (file:line)."""
    out: list[Entry] = []
    with path.open("rb") as f:
        f.seek(start)
        offset = start
        for lineno, line in enumerate(f, 1):
            offset += len(line)
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                usage = d.get("usage") or {}
                tokens = int(output_tokens(usage.get("completion_tokens"), d.get("output_ids")))
                rid = str(d["id"])
                meta = d.get("meta") or {}
                entry = _entry(rid, offset, tokens, float(usage.get("cost") or 0.0),
                               str(d.get("conversation_id") or rid), int(d.get("turn", 1)),
                               _does(int(d.get("turn", 1)), meta, d.get("finish_reason")))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise InputError(f"not a valid record line (after byte {start})", path, lineno) from None
            out.append(entry)
    return out


def _read_index(index: Path, records_size: int) -> tuple[list[Entry], list[int]]:
    """The index's entries and the positions of the chained ones among them; ([], []) (rebuild from the records)
    when a line is bad or points past the file."""
    entries: list[Entry] = []
    chained: list[int] = []
    for line in index.read_text().splitlines():
        try:  # the four fields of a one-turn record first: this loop runs a million times at a resume
            rid, end, tokens, cost = line.split("\t")
            entries.append((rid, int(end), int(tokens), float(cost)))
        except ValueError:
            try:
                rid, end, tokens, cost, conversation, turn, does = line.split("\t")
                entries.append((rid, int(end), int(tokens), float(cost), conversation, int(turn), int(does)))
            except ValueError:
                return [], []
            chained.append(len(entries) - 1)
    if entries and entries[-1][1] > records_size:
        return [], []
    return entries, chained


@dataclass
class Store:
    """Append-only record and failure files of one dataset; `done` holds the ids (records' and failures') written,
    `finished` the conversations done (a view), `chains` the recorded turns of the open ones, `paused` the pause
    samples per turn id."""

    files: DatasetFiles
    done: set[str] = field(default_factory=set)
    conversations_finished: int = 0
    chains: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)  # conversation -> (turn, start, end)
    paused: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # turn id -> its pause samples' lines
    recorded: int = 0
    failed: int = 0
    output_tokens: int = 0   # over every record of the dataset, all runs, pause samples aside
    spend_usd: float = 0.0
    torn_bytes: int = 0
    costs: list[float] = field(default_factory=list, repr=False)  # per record, the newest few thousand
    lengths: list[int] = field(default_factory=list, repr=False)  # output tokens per record, likewise
    _fds: dict[Path, int] = field(default_factory=dict, repr=False)
    _lock_fd: int | None = field(default=None, repr=False)

    @classmethod
    def open(cls, where: DatasetFiles | str | Path, *, retry_failed: bool = False) -> Store:
        """The dataset's store, locked and loaded; `retry_failed`: the prompts failed for good are to do again
        (`_retry_failed`)."""
        store = cls(where if isinstance(where, DatasetFiles) else DatasetFiles(Path(where)))
        make_dir(store.files.directory, "output_dir")
        store._lock()
        try:
            if retry_failed:
                store._retry_failed()
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    def _lock(self) -> None:
        try:
            self._lock_fd = hold_lock(self.files.lock, f"{os.getpid()}\n")
        except LockHeld as e:
            raise StoreLocked(f"another run (pid {e.holder or '?'}) is writing this dataset; refusing to interleave",
                              self.files.directory) from None

    def _retry_failed(self) -> None:
        """Send the failed prompts again: failures.jsonl's lines move to the end of failures.retried.jsonl (synced
        first), then failures.jsonl is emptied, so each prompt is still in records or failures exactly once. A
        kill between the two leaves them in both, and the next run with `retry_failed` copies them again: the
        history may repeat a line, failures.jsonl never loses one. A failed later turn of a conversation is asked
        again after its recorded turns."""
        failures = self.files.failures
        _repair_tail(failures)
        if not failures.is_file() or not failures.stat().st_size:
            return
        with self.files.failures_retried.open("ab") as kept:
            kept.write(failures.read_bytes())
            kept.flush()
            os.fsync(kept.fileno())
        with failures.open("rb+") as f:
            f.truncate(0)
            os.fsync(f.fileno())

    def _load(self) -> None:
        records, failures, index = self.files.records, self.files.failures, self.files.done_index
        self.torn_bytes = _repair_tail(records) + _repair_tail(failures)
        _repair_tail(index)
        indexed: list[Entry] = []
        chained: list[int] = []
        if index.exists() and records.exists():
            indexed, chained = _read_index(index, records.stat().st_size)
        tail = _entries_of_lines(records, indexed[-1][1] if indexed else 0) if records.exists() else []
        if tail or not indexed:
            with index.open("a" if indexed else "w") as f:
                f.writelines(map(_index_line, tail))
        entries = indexed + tail
        self.done.update(e[0] for e in entries)
        chained += [len(indexed) + i for i, e in enumerate(tail) if len(e) == 7]
        self.conversations_finished = len(entries) - len(chained)
        for i in chained:  # turns of chained conversations and pause samples, in order: which conversations are open
            self._chained(entries[i], entries[i - 1][1] if i else 0)
        self.recorded = len(entries)
        answers = [e for e in entries if len(e) == 4 or e[6] != PAUSES]
        self.output_tokens = sum(e[2] for e in answers)
        self.spend_usd = sum(e[3] for e in entries)
        newest = answers[-COSTS_KEPT:]
        self.costs, self.lengths = [e[3] for e in newest], [e[2] for e in newest]
        if len(self.done) != self.recorded:
            raise InputError(f"{self.recorded - len(self.done)} ids appear twice; the file was edited by hand?",
                             records)
        if failures.exists():
            for lineno, obj in iter_jsonl(failures):
                if not isinstance(obj, dict) or "id" not in obj:
                    raise InputError("not a valid failure line", failures, lineno)
                self._failed(str(obj["id"]), str(obj.get("conversation_id") or obj["id"]))
        for path in (records, failures, index):
            self._fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _append(self, path: Path, data: bytes) -> int:
        fd = self._fds[path]
        n = os.write(fd, data)
        while n < len(data):  # a short write (full disk, …) is finished, never left torn
            n += os.write(fd, data[n:])
        return os.lseek(fd, 0, os.SEEK_END)

    def _chained(self, e: Entry, start: int) -> None:
        """A turn of a chained conversation, its line starting at byte `start`: it ends the conversation, or the
        conversation stays open with one more turn recorded; or a pause sample, which leaves both as they were."""
        rid, end, _, _, conversation, turn, does = e
        if does == PAUSES:
            self.paused.setdefault(rid.rpartition(PAUSE_SEP)[0], []).append((start, end))
        elif does == ENDS:
            self.conversations_finished += 1
            self.chains.pop(conversation, None)
        else:
            self.chains.setdefault(conversation, []).append((turn, start, end))

    def _failed(self, rid: str, conversation_id: str) -> None:
        self.done.add(rid)
        self.conversations_finished += 1  # a turn that failed for good ends its conversation
        self.chains.pop(conversation_id, None)
        self.failed += 1

    @property
    def finished(self) -> set[str] | FinishedConversations:
        """The conversations done, for `in` (a resume's scan asks once per prompt): the written ids themselves while
        no conversation is open (a conversation's first request keeps its id; a later turn's id is never a prompt's),
        else a view that leaves the open ones out. Their number is `conversations_finished`."""
        return FinishedConversations(self) if self.chains else self.done

    def history(self, conversation_id: str) -> list[Record]:
        """The recorded turns of an open conversation, in order (a resume continues after the last)."""
        return self._read((start, end) for _, start, end in self.chains.get(conversation_id, ()))

    @property
    def answers(self) -> int:
        """The records that answer their turn: every record but the pause samples."""
        return self.recorded - sum(map(len, self.paused.values()))

    def next_pause_id(self, turn_id: str) -> str:
        """The id the next pause sample of `turn_id` is written under."""
        return pause_id(turn_id, len(self.paused.get(turn_id, ())) + 1)

    def pause_samples(self, turn_id: str) -> list[Record]:
        """The pause samples of a turn, in order."""
        return self._read(self.paused.get(turn_id, ()))

    def _read(self, spans: Iterable[tuple[int, int]]) -> list[Record]:
        out = []
        with self.files.records.open("rb") as f:
            for start, end in spans:
                f.seek(start)
                out.append(Record.from_json(f.read(end - start)))
        return out

    def add_record(self, record: Record, cost: float | None = None) -> None:
        """Append one record; `cost` defaults to its usage (it feeds the dataset totals). A pause sample is written
        under `next_pause_id` of its turn."""
        if record.id in self.done:
            raise ValueError(f"record {record.id!r} is already finished")
        tokens = record.output_tokens
        cost = cost if cost is not None else (record.usage.cost or 0.0)
        does = _does(record.turn, record.meta, record.finish_reason)
        line = (record.to_json() + "\n").encode()
        end = self._append(self.files.records, line)
        entry = _entry(record.id, end, tokens, cost, record.conversation_id, record.turn, does)
        self._append(self.files.done_index, _index_line(entry).encode())
        self.done.add(record.id)
        if len(entry) == 7:
            self._chained(entry, end - len(line))
        else:
            self.conversations_finished += 1
        self.recorded += 1
        self.spend_usd += cost
        if does == PAUSES:
            return
        self.output_tokens += tokens
        self.costs.append(cost)
        self.lengths.append(tokens)
        if len(self.costs) > 2 * COSTS_KEPT:
            del self.costs[:COSTS_KEPT], self.lengths[:COSTS_KEPT]

    def add_failure(self, rid: str, error: dict[str, Any], attempts: int, *, conversation_id: str | None = None,
                    turn: int | None = None, environment: str | None = None) -> None:
        """A request that failed for good; a turn of a chained conversation names its conversation and turn (the
        failure ends the conversation), a rollout's its environment's label (the report counts the trajectory
        failed there, even one that failed before any record)."""
        if rid in self.done:
            raise ValueError(f"prompt {rid!r} is already finished")
        chain = {"conversation_id": conversation_id, "turn": turn} if conversation_id is not None else {}
        if environment is not None:
            chain["environment"] = environment
        line = json.dumps({"id": rid, **chain, "error": error, "attempts": attempts}, ensure_ascii=False)
        self._append(self.files.failures, (line + "\n").encode())
        self._failed(rid, conversation_id or rid)

    def read_summary(self) -> dict[str, Any] | None:
        """The summary.json an earlier run left (None before the first): what carries across runs (fidelity)."""
        path = self.files.summary
        if not path.is_file():
            return None
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"not a valid summary ({e}); move it away to start the dataset's books afresh", path) \
                from None
        if not isinstance(summary, dict):
            raise InputError("not a valid summary (a JSON object expected)", path)
        return summary

    def write_summary(self, summary: dict[str, Any]) -> Path:
        return atomic_write_text(self.files.summary, json.dumps(summary, indent=1, ensure_ascii=False))

    def sync(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class FinishedConversations:
    """The conversations of a store that are done, without a second set of a million ids: a conversation's first
    request keeps its id, so it is done when that id is written (a record or a failure) and it is not open."""

    store: Store

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self.store.done and conversation_id not in self.store.chains
