"""Moonshot's Batch API, emulated: uploaded files, batches working through their lines, the account's balance.

Nothing runs in the background: every request first brings the state up to the clock (`BatchEmulator.now`), answering
the lines whose time has come in time order over all batches (so the balance runs out where it would). A batch's
timeline is fixed at creation from the config (`batch:`, every duration times `speed`): validating, then a queue,
then one line every 1/`lines_per_s` s, finalizing, completed; a stop (cancel, expiry) cuts it. The files are
batch_files.py's, the input file's checks batch_requests.py's, a line's answer batch_answers.py's, the routes
batch_routes.py's.
"""
from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .batch_answers import answer
from .batch_files import Files
from .batch_requests import ENDPOINT, BatchError, Line, new_id, validate_lines, window_hours
from .config import BatchConfig
from .service import Emulator

TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class Stop:
    kind: str  # "expire" | "cancel"
    at: float  # no line is answered after it
    done_at: float  # the terminal state (expired at once; cancelled after `cancel_s`)


@dataclass
class Batch:
    seq: int
    id: str
    input_file_id: str
    completion_window: str
    metadata: dict | None
    created: float  # clock times from here on
    validated: float
    start: float  # the first line's answer is due one step after it
    step: float  # seconds between lines (0 at speed 0)
    expires: float
    lines: list[Line]
    errors: list[dict]  # validation errors: the batch fails when validated
    stop: Stop | None = None
    limit: int | None = None  # a stalled batch (`expire_rate`) answers this many lines, then waits for its expiry
    done: int = 0  # lines handled so far (in order)
    output: list[str] = field(default_factory=list)  # output file lines, as answered
    failures: list[str] = field(default_factory=list)  # error file lines
    output_file_id: str | None = None
    error_file_id: str | None = None
    closed: bool = False  # the terminal state was reached and its files made

    @property
    def finalizing(self) -> float:
        return self.start + len(self.lines) * self.step

    def due(self, i: int) -> float:
        return self.start + (i + 1) * self.step

    def answerable(self, now: float) -> int:
        """How many lines are answered by `now` (the stop cuts them)."""
        if self.errors:
            return 0
        t = min(now, self.stop.at) if self.stop else now
        if t < self.start or (self.stop and self.stop.at < self.validated):
            return 0
        n = len(self.lines) if self.step == 0 else math.floor((t - self.start) / self.step + 1e-9)
        return max(0, min(n, len(self.lines), len(self.lines) if self.limit is None else self.limit))

    def early_stop(self) -> bool:
        """Cancelled (or expired) while validating: no line was accepted, no file is made."""
        return self.stop is not None and self.stop.at < self.validated

    def status(self, now: float, finalize_s: float) -> str:
        if self.stop and now >= self.stop.at:
            if self.stop.kind == "cancel":
                return "cancelling" if now < self.stop.done_at else "cancelled"
            return "expired"
        if now < self.validated:
            return "validating"
        if self.errors:
            return "failed"
        if self.stop or now < self.finalizing:
            return "in_progress"
        return "finalizing" if now < self.finalizing + finalize_s else "completed"


class BatchEmulator:
    """The Batch API's state beside the realtime service `em` (its tokenizer, content config, ground truth); reset
    with it (an admin reset starts a new epoch). `clock` is monotonic seconds, injectable for tests."""

    def __init__(self, em: Emulator, clock: Callable[[], float] = time.monotonic):
        self.em, self.clock = em, clock
        self._clock0, self._wall0 = clock(), float(int(time.time()))  # whole seconds: timestamps follow the clock
        self.epoch = -1
        self.now()

    @property
    def cfg(self) -> BatchConfig:
        return self.em.cfg.batch

    def scaled(self, seconds: float) -> float:
        return seconds * self.em.cfg.speed

    def wall(self, t: float) -> int:
        return int(self._wall0 + t - self._clock0)

    def _reset(self) -> None:
        self.epoch = self.em.epoch
        self.files = Files()
        self.batches: dict[str, Batch] = {}
        self.charged = 0.0
        self.rng = random.Random(f"batch:{self.em.cfg.seed}")

    @property
    def available(self) -> float:
        return self.cfg.balance - self.charged

    def now(self) -> float:
        """The clock, with the state brought up to it (lines due answered, terminal batches' files made)."""
        if self.epoch != self.em.epoch:
            self._reset()
        now = self.clock()
        due = [(b.due(i), b.seq, i, b) for b in self.batches.values() if not b.closed
               for i in range(b.done, b.answerable(now))]
        for t, _, i, b in sorted(due, key=lambda d: d[:3]):
            self._handle(b, b.lines[i], t)
            b.done = i + 1
        for b in self.batches.values():
            if not b.closed and b.status(now, self.scaled(self.cfg.finalizing_s)) in TERMINAL:
                self._close(b, now)
        return now

    # -- batches --------------------------------------------------------------------------------
    def create(self, body: Any) -> dict:
        now = self.now()
        if not isinstance(body, dict):
            raise BatchError(400, "the request body must be a JSON object")
        fid = body.get("input_file_id")
        if not isinstance(fid, str) or not fid:
            raise BatchError(400, "input_file_id is required")
        if body.get("endpoint") != ENDPOINT:
            raise BatchError(400, f"endpoint must be '{ENDPOINT}', got {body.get('endpoint')!r}")
        hours = window_hours(body.get("completion_window"))
        meta = body.get("metadata")
        if meta is not None and not (isinstance(meta, dict) and len(meta) <= 16 and all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in meta.items())):
            raise BatchError(400, "metadata must be at most 16 string pairs (keys up to 64, values up to 512 chars)")
        f = self.files.get(fid)
        if f.purpose != "batch":
            raise BatchError(400, f"file {fid} is not a batch input file (purpose {f.purpose!r})")
        lines, errors = validate_lines(f.data, self.cfg.models)
        validated = now + self.scaled(self.cfg.validating_s)
        start = validated + self.scaled(self.cfg.queue_s)
        b = Batch(len(self.batches), new_id("batch_"), fid, body["completion_window"], meta, now, validated, start,
                  self.scaled(1 / self.cfg.lines_per_s), now + self.scaled(hours * 3600), lines, errors)
        if not errors:  # two draws per batch, then one per line: a seeded run repeats
            stalls = self.rng.random() < self.cfg.expire_rate
            stall_at = self.rng.randrange(len(lines))  # part-way: at least its last line is left
            for line in lines:
                line.fault = self.rng.random() < self.cfg.line_error_rate
            if stalls:
                b.limit = stall_at
            if stalls or b.finalizing > b.expires:  # it expires at its window's end
                b.stop = Stop("expire", b.expires, b.expires)
        self.batches[b.id] = b
        return self.batch_obj(b, self.now())  # at speed 0 it is done at once

    def get(self, batch_id: str) -> Batch:
        if batch_id not in self.batches:
            raise BatchError(404, f"batch {batch_id} not found")
        return self.batches[batch_id]

    def cancel(self, batch_id: str) -> dict:
        now = self.now()
        b = self.get(batch_id)
        status = b.status(now, self.scaled(self.cfg.finalizing_s))
        if status == "cancelling":
            return self.batch_obj(b, now)
        if status not in ("validating", "in_progress", "finalizing"):
            raise BatchError(400, f"batch {batch_id} cannot be cancelled: its status is {status}")
        b.stop = Stop("cancel", now, now + self.scaled(self.cfg.cancel_s))
        return self.batch_obj(b, self.now())

    def expire(self, batch_id: str) -> dict:
        """Admin: the window runs out now (the lines answered so far are kept)."""
        now = self.now()
        b = self.get(batch_id)
        status = b.status(now, self.scaled(self.cfg.finalizing_s))
        if status not in ("validating", "in_progress"):
            raise BatchError(400, f"batch {batch_id} cannot expire: its status is {status}")
        b.stop = Stop("expire", now, now)
        return self.batch_obj(b, self.now())

    def listing(self, limit: Any, after: str | None) -> dict:
        now = self.now()
        try:
            n = int(limit) if limit is not None else 20
        except ValueError:
            n = 0
        if not 1 <= n <= 100:
            raise BatchError(400, f"limit must be an integer in [1, 100], got {limit!r}")
        newest = sorted(self.batches.values(), key=lambda b: -b.seq)
        if after is not None:
            at = next((k for k, b in enumerate(newest) if b.id == after), None)
            if at is None:
                raise BatchError(400, f"after: no batch {after}")
            newest = newest[at + 1:]
        page = [self.batch_obj(b, now) for b in newest[:n]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(newest) > n}

    def batch_obj(self, b: Batch, now: float) -> dict:
        fin = self.scaled(self.cfg.finalizing_s)
        status = b.status(now, fin)

        def reached(t: float) -> int | None:
            return self.wall(t) if now >= t else None

        stop = b.stop if b.stop and now >= b.stop.at else None
        valid = not b.errors and not b.early_stop()
        ran = valid and now >= b.validated
        return {
            "id": b.id, "object": "batch", "endpoint": ENDPOINT,
            "errors": {"object": "list", "data": b.errors} if status == "failed" else None,
            "input_file_id": b.input_file_id, "completion_window": b.completion_window, "status": status,
            "output_file_id": b.output_file_id, "error_file_id": b.error_file_id, "created_at": self.wall(b.created),
            "in_progress_at": reached(b.validated) if valid else None, "expires_at": self.wall(b.expires),
            "finalizing_at": reached(b.finalizing) if status in ("finalizing", "completed") else None,
            "completed_at": reached(b.finalizing + fin) if status == "completed" else None,
            "failed_at": reached(b.validated) if status == "failed" else None,
            "expired_at": self.wall(stop.at) if stop and stop.kind == "expire" else None,
            "cancelling_at": self.wall(stop.at) if stop and stop.kind == "cancel" else None,
            "cancelled_at": self.wall(stop.done_at) if status == "cancelled" and stop else None,
            "request_counts": {"total": len(b.lines) if ran else 0, "completed": len(b.output),
                               "failed": len(b.failures)},
            "metadata": b.metadata,
        }

    # -- lines ----------------------------------------------------------------------------------
    def _handle(self, b: Batch, line: Line, t: float) -> None:
        """Answer one line when its time has come: a 400 for a body the model cannot take, a 429 once the balance
        is spent, the drawn 500, else the model's answer, charged at the batch price."""
        try:
            if self.available <= 0:
                raise BatchError(429, "Your account's balance is exhausted: please recharge")
            if line.fault:
                raise BatchError(500, "The server had an error while processing your request", "server_error")
            assert line.body is not None  # a line without one fails validation: its batch answers nothing
            body, cost = answer(self.em, self.cfg, line.body, batch_id=b.id, custom_id=line.custom_id,
                                created=self.wall(t))
            self.charged += cost
        except BatchError as e:
            line.status = "failed"
            b.failures.append(self._result_line(line, {"status_code": e.status, "request_id": new_id("req-"),
                                                       "body": e.body()}, None))
            return
        line.status, line.generation_id = "answered", body["id"]
        b.output.append(self._result_line(line, {"status_code": 200, "request_id": new_id("req-"), "body": body},
                                          None))

    @staticmethod
    def _result_line(line: Line, response: dict | None, error: dict | None) -> str:
        return json.dumps({"id": new_id("batch_req_"), "custom_id": line.custom_id, "response": response,
                           "error": error}, ensure_ascii=False)

    def _close(self, b: Batch, now: float) -> None:
        """The terminal state: the lines left expire or are cancelled (the error file says so); the output and
        error files are made. A batch that failed validation, or was stopped while validating, runs nothing."""
        b.closed = True
        stop = b.stop if b.stop and now >= b.stop.at else None
        if stop is None:  # completed, or failed validation
            end = b.validated if b.errors else b.finalizing + self.scaled(self.cfg.finalizing_s)
            for line in b.lines:
                line.status = "failed" if b.errors else line.status
        else:
            end = stop.done_at
            expired = stop.kind == "expire"
            error = {"code": "batch_expired" if expired else "batch_cancelled",
                     "message": f"the batch {'expired' if expired else 'was cancelled'} before this request was run"}
            for line in b.lines:
                if line.status == "pending":
                    line.status = "expired" if expired else "cancelled"
                    if not b.early_stop():
                        b.failures.append(self._result_line(line, None, error))
        for name, rows in (("output", b.output), ("error", b.failures)):
            if rows:
                setattr(b, f"{name}_file_id", self.files.output(f"{b.id}_{name}.jsonl", rows, self.wall(end)).id)

    # -- admin ----------------------------------------------------------------------------------
    def lines(self) -> list[dict]:
        self.now()
        return [{"batch_id": b.id, "custom_id": line.custom_id, "line": line.number, "status": line.status,
                 "generation_id": line.generation_id} for b in self.batches.values() for line in b.lines]

    def snapshot(self) -> dict:
        now = self.now()
        fin = self.scaled(self.cfg.finalizing_s)
        lines = Counter(line.status for b in self.batches.values() for line in b.lines)
        return {"files": len(self.files), "batches": dict(Counter(b.status(now, fin) for b in self.batches.values())),
                "lines": {k: lines.get(k, 0) for k in ("answered", "failed", "expired", "cancelled", "pending")},
                "balance": self.available, "charged_usd": self.charged}
