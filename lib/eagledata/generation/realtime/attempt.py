"""One attempt in flight and the seam it is sent through.

`Transport` is the seam, as httpx's `AsyncBaseTransport.handle_async_request` is: one documented method that sends
one request body and classifies what came back. The default (`ChatCompletions`) sends it to OpenRouter (or a local
OpenAI-compatible server); tests and benches pass their own (a spy, a fault, answers replayed in virtual time).
`Attempt` is the handle the requester's `start` returns: awaited for the `Outcome`, cancelled, or cut.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from ...openrouter import Outcome, complete
from ...openrouter.fast_stream import FastStreams
from ...openrouter.stream import NO_MARK, StreamState
from ..conversations.work import Work


class Transport(Protocol):
    async def handle_request(self, client: httpx.AsyncClient, body: dict[str, Any],
                             state: StreamState | None = None) -> Outcome:
        """Send one chat-completions `body` over `client` and classify what came back: every answer of the service,
        its errors included, is an `Outcome` (never raised); a cancelled call stops the request (what it was
        billed is the ledger's to find out). `state`, given for a body with `stream: true`: what the stream has
        delivered so far, kept up to date by a transport that reads one (others may leave it untouched)."""
        ...


@dataclass(frozen=True)
class ChatCompletions:
    """The service's chat-completions endpoint: `POST chat/completions` once (openrouter.complete), read as SSE when
    the body asks for a stream (openrouter/stream.py). `state`: a `StreamState` the caller keeps, filled chunk by
    chunk (how far the answer has got; what streamed before a cancel), the seam for cutting answers at a target.
    `stall_timeout_s`: a stream silent this long is closed and retried (the run passes generate's setting)."""

    stall_timeout_s: float | None = None  # None: the client's timeouts
    fast_streams: FastStreams | None = None  # streams read over its connections (fast_stream.py); None: over httpx

    async def handle_request(self, client: httpx.AsyncClient, body: dict[str, Any],
                             state: StreamState | None = None) -> Outcome:
        if self.fast_streams is not None and body.get("stream"):
            return await self.fast_streams.complete(client, body, state, stall_timeout_s=self.stall_timeout_s)
        return await complete(client, body, state, stall_timeout_s=self.stall_timeout_s)


class Attempt:
    """One request in flight: await it for its outcome, or `cancel()` it; `state`: what its stream has delivered so
    far (None: a JSON answer), the serving provider among it from the first chunk; `work`: what it answers;
    `journaled`: its generation id is in its dataset's streams journal (killed.py)."""

    def __init__(self, task: asyncio.Task[Outcome], state: StreamState | None = None, work: Work | None = None,
                 cancels: bool = False):
        self._task, self.state, self.work = task, state, work
        self.cancels = cancels  # every endpoint its provider filter allows stops billing on a closed stream
        self.journaled = False
        self.journal_mark = NO_MARK  # how much of its text the journal holds (StreamState.delivered_since)
        self.cut_reason: str | None = None  # the run closed it to keep what it streamed (`cut`): why

    def cut(self, reason: str) -> None:
        """Close the stream and keep what it delivered as a cut sample (slots.py), `reason` in its `meta.cut`."""
        self.cut_reason = reason
        self._task.cancel()

    def cancel(self) -> None:
        self._task.cancel()

    def when_done(self, fn: Callable[[], object]) -> None:
        self._task.add_done_callback(lambda _: fn())

    def __await__(self) -> Generator[Any, None, Outcome]:
        return self._task.__await__()
