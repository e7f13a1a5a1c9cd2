"""The requester: what one attempt sends, to whom, and what it may cost; and the transport seam it sends through.

`Transport` is the seam, as httpx's `AsyncBaseTransport.handle_async_request` is: one documented method that sends
one request body and classifies what came back. The default sends it to OpenRouter (or a local OpenAI-compatible
server); tests and benches pass their own (a spy, a fault, answers replayed in virtual time). The requester owns
everything else about an attempt: its prompt ids and cost bound, the request body, the provider filter (providers
judged suspect, those that refused this prompt's answer, those cooling off after 429s) and the cost of an answer.
`start` returns an `Attempt`, a handle the caller awaits for the `Outcome` or cancels.
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Generator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from ..openrouter import Completion, Kind, Outcome, Price, RoutingDecision, build_request, complete
from ..openrouter.fast_stream import FastStreams
from ..openrouter.stream import StreamState
from ..text import KimiTokenizer, prompt_ids
from .congestion import ProviderCooldown
from .fidelity import FidelityJudge
from .pacing import Streamed
from .work import Work

CANCELLED = "cancelled"  # the error class of an attempt cut off by the run (policy.RULES: its cost is unknown)


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


def cancelled_outcome() -> Outcome:
    return Outcome(Kind.RETRY, CANCELLED, None, "cancelled by the run")


async def in_executor(executor: Executor, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args, **kwargs))


class Requester:
    def __init__(self, transport: Transport, routing: RoutingDecision, fidelity: FidelityJudge,
                 cooldown: ProviderCooldown, tok: KimiTokenizer, executor: Executor, *, worst: Price, model: str,
                 max_tokens: int, temperature: float | None, backend: str, stream: bool = False,
                 at_target: str = "cut"):
        self.transport, self.routing, self.fidelity, self.cooldown = transport, routing, fidelity, cooldown
        self.tok, self.executor, self.worst = tok, executor, worst
        self.model, self.max_tokens, self.temperature, self.backend = model, max_tokens, temperature, backend
        self.stream, self.at_target = stream, at_target
        self.streaming: dict[Attempt, None] = {}  # the streamed attempts in flight, in the order they went out
        # the service named a streamed attempt's generation, or the attempt ended (the streams journal hears both)
        self.on_stream_named: Callable[[Attempt], None] | None = None
        self.on_stream_end: Callable[[Attempt], None] | None = None
        self.price_by_provider = {e.provider: e.price for e in routing.eligible if e.priced}
        self._cancels = {e.provider: e.stream_cancellation for e in routing.eligible}

    async def prepare(self, work: Work) -> None:
        """The turn's prompt ids (off the event loop) and the most one attempt of it can cost, once per work."""
        if work.prompt_ids is None:
            work.prompt_ids = await in_executor(self.executor, prompt_ids, self.tok, work.turn.messages,
                                                tools=work.turn.conversation.tools)
            work.bound = self.worst.cost(len(work.prompt_ids), self.max_tokens)

    def provider(self, work: Work | None, now: float) -> dict[str, Any] | None:
        """The routing decision's provider object, leaving out the providers judged suspect (for good), those that
        refused this prompt's answer (unless that leaves none), and those cooling off after 429s."""
        eligible = self.routing.eligible_providers
        out = set(self.fidelity.suspects)
        if work is not None and work.avoid and not set(eligible) <= out | work.avoid:
            out |= work.avoid
        out |= set(self.cooldown.cooling(now, [p for p in eligible if p not in out]))
        if work is not None and work.lane.near_target and self.stream and self.at_target == "cut":
            # its dataset's cut is near: an endpoint that bills whole answers would make the run wait for one
            billing = {p for p in eligible if not self._cancels.get(p, False)}
            if not set(eligible) <= out | billing:
                out |= billing
        if not out or not self.routing.provider:
            return self.routing.provider
        return {**self.routing.provider, "ignore": sorted({*self.routing.provider.get("ignore", []), *out})}

    def body(self, work: Work, now: float) -> dict[str, Any]:
        conversation = work.turn.conversation
        return build_request(self.model, work.turn.messages, max_tokens=self.max_tokens,
                             temperature=self.temperature, provider=self.provider(work, now), backend=self.backend,
                             tools=conversation.tools, parallel_tool_calls=conversation.parallel_tool_calls,
                             stream=self.stream)

    def start(self, client: httpx.AsyncClient, work: Work, now: float) -> Attempt:
        work.tries += 1
        body = self.body(work, now)
        state = StreamState() if body.get("stream") else None
        attempt = Attempt(asyncio.ensure_future(self.transport.handle_request(client, body, state)), state, work,
                          cancels=state is not None and self._all_cancel(body.get("provider")))
        if state is not None:
            self.streaming[attempt] = None
            if self.on_stream_named is not None:
                named = self.on_stream_named
                state.on_named = lambda _: named(attempt)
            attempt.when_done(lambda: self._stream_ended(attempt))
        return attempt

    def _stream_ended(self, attempt: Attempt) -> None:
        self.streaming.pop(attempt, None)
        if self.on_stream_end is not None:
            self.on_stream_end(attempt)

    def streamed(self) -> tuple[int, int]:
        """The streams in flight, and the reasoning and content characters they have delivered so far."""
        return len(self.streaming), sum(a.state.chars for a in self.streaming if a.state is not None)

    def progress(self, tokens_per_char: float) -> dict[int, Streamed]:
        """How far each stream in flight has got (pacing's view), by its flight's ticket: its characters so far at
        `tokens_per_char`, and whether closing it stops its billing."""
        return {a.work.ticket: Streamed(a.state.chars * tokens_per_char, self.stops_billing(a))
                for a in self.streaming if a.state is not None and a.work is not None and a.work.ticket is not None}

    def _all_cancel(self, provider: dict[str, Any] | None) -> bool:
        """Every endpoint a request with this provider object may reach stops billing on a closed stream."""
        allowed = set(self.routing.eligible_providers)
        if provider:
            allowed -= set(provider.get("ignore") or ())
            if provider.get("only"):
                allowed &= set(provider["only"])
        return bool(allowed) and all(self._cancels.get(p, False) for p in allowed)

    def cancel_streams_of(self, provider: str) -> int:
        """Cancel every stream in flight that `provider` is serving (known from its first chunk): the run has just
        left it out, so what it would still send would not be kept; on an endpoint with stream cancellation closing
        it stops the billing too. Each is booked and retried as any cancelled attempt. Returns how many."""
        return self._cancel(lambda a: a.state is not None and a.state.provider == provider)

    def stops_billing(self, attempt: Attempt) -> bool:
        """Closing this stream stops its billing: its endpoint has stream cancellation (the routing decision's
        `stream_cancellation`; before its first chunk names the provider: when every endpoint its provider filter
        allows has)."""
        if attempt.state is not None and attempt.state.provider:
            return self._cancels.get(attempt.state.provider, False)
        return attempt.cancels

    def cancel_streams_that_stop_billing(self, cut: str | None = None) -> int:
        """Close every stream in flight whose endpoint stops billing when it is closed: what they would still send
        is not paid for (`cut`: what they delivered is kept as a cut sample, with this reason). The others bill
        their whole answer whatever the client does, so they are left to finish and be kept. Returns how many."""
        return self._cancel(self.stops_billing, cut=cut)

    def cut_every_stream(self, reason: str) -> int:
        """Close every stream in flight, each kept as a cut sample (after a Ctrl-C: those on endpoints that bill
        whole answers are billed the rest anyway, and keeping what they delivered beats abandoning it)."""
        return self._cancel(lambda a: True, cut=reason)

    def cut_streams_of(self, lane: Any, reason: str) -> int:
        """A dataset reached its target: close its streams whose endpoint stops billing, each kept as a cut sample
        (`at_target: cut`; the others are paid in full anyway, so they finish and count). Returns how many."""
        return self._cancel(self.stops_billing, cut=reason, lane=lane)

    def _cancel(self, which: Callable[[Attempt], bool], *, cut: str | None = None, lane: Any = None) -> int:
        hit = [a for a in self.streaming if a.state is not None and which(a)
               and (lane is None or (a.work is not None and a.work.lane is lane))]
        for attempt in hit:
            attempt.cut(cut) if cut else attempt.cancel()
        return len(hit)

    def cost(self, c: Completion) -> float:
        """The server's `usage.cost`, else the tokens at the serving provider's price (else the worst)."""
        if c.usage.cost is not None:
            return c.usage.cost
        price = self.price_by_provider.get(c.provider, self.worst)
        return price.cost(c.usage.prompt_tokens, c.usage.completion_tokens)

    def observe(self, now: float, provider: str, rate_limited: bool) -> None:
        """A provider answered (or said 429): its cooldown hears of it."""
        self.cooldown.observe(now, provider, rate_limited)
