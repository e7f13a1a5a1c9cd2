"""Answers taped and replayed: what a run sent and got (`Taped`, around any transport), served again to the engine
in virtual time (`Replayed`: the same answers after the same latencies).

A run's decisions (which request is taken next, when a dataset stops, when the run stops) are the parts' (parts.py),
fed by the answers and the time they take. Replaying a taped run's answers through the real engine in virtual time
shows that a replay decides as the run did (tests/generation/test_replay.py), which is what lets the benches measure
the engine itself on saved answers in seconds instead of a copy of its loop.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import httpx

from ...openrouter import Account, Outcome
from ...openrouter.stream import StreamState
from ..clock import Clock, LoopClock
from .attempt import Transport


def request_key(body: dict[str, Any]) -> str:
    """What a request asks, whoever it is routed to: its messages and tools (a turn, on its own history)."""
    ask = {"messages": body.get("messages"), "tools": body.get("tools")}
    return hashlib.sha256(json.dumps(ask, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Taken:
    """One request as the service saw it: its body, when it was sent, how long its answer took, the answer."""

    body: dict[str, Any]
    sent_at: float
    latency_s: float
    outcome: Outcome


class Taped:
    """A transport that passes every request on to `inner` and keeps it on `tape`, in the order they were sent (a
    request cut off before its answer is not kept: it has no answer to replay)."""

    def __init__(self, inner: Transport, clock: Clock | None = None):
        self.inner, self.clock = inner, clock or LoopClock()
        self.tape: list[Taken] = []

    async def handle_request(self, client: httpx.AsyncClient, body: dict[str, Any],
                             state: StreamState | None = None) -> Outcome:
        sent = self.clock.now()
        outcome = await self.inner.handle_request(client, body, state)
        self.tape.append(Taken(body, sent, self.clock.now() - sent, outcome))
        return outcome


class Replayed:
    """Serves a tape: the n-th request asking what a taped one asked (`request_key`) gets the n-th taped answer to
    it, after the taped latency. Keeps what it was sent (`sent`) and bills what it served (`account`). A request the
    tape never answered means the replay decided otherwise than the run: it raises, naming it."""

    def __init__(self, tape: list[Taken], clock: Clock | None = None, *, balance_usd: float = 1000.0):
        self.clock = clock or LoopClock()
        self._answers: dict[str, deque[Taken]] = defaultdict(deque)
        for taken in tape:
            self._answers[request_key(taken.body)].append(taken)
        self.sent: list[dict[str, Any]] = []
        self.billed_usd, self.balance_usd = 0.0, balance_usd

    async def handle_request(self, client: httpx.AsyncClient, body: dict[str, Any],
                             state: StreamState | None = None) -> Outcome:
        self.sent.append(body)
        answers = self._answers.get(request_key(body))
        if not answers:
            raise LookupError(f"request {len(self.sent)} was never sent by the taped run: "
                              f"{json.dumps(body.get('messages'), ensure_ascii=False)[:200]}")
        taken = answers.popleft()
        await self.clock.sleep(taken.latency_s)
        c = taken.outcome.completion
        if c is not None and c.usage.cost is not None:
            self.billed_usd += c.usage.cost
        return taken.outcome

    async def account(self, client: httpx.AsyncClient) -> Account:
        """The account as the service would show it: what the replayed answers billed."""
        return Account(self.billed_usd, self.balance_usd - self.billed_usd)

    @property
    def left(self) -> int:
        """Taped answers never asked for again."""
        return sum(len(q) for q in self._answers.values())


def taken_order(bodies: list[dict[str, Any]]) -> list[str]:
    """The order of takes, as the service saw them: each request's `request_key`."""
    return [request_key(b) for b in bodies]

