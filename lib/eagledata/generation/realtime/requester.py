"""The requester: what one attempt sends, to whom, and what it may cost.

It owns an attempt's prompt ids and cost bound, the request body, the provider filter (providers judged suspect,
those that refused this prompt's answer, those cooling off after 429s, and near a cut those that bill whole answers)
and the cost of an answer; `start` sends it through the `Transport` (attempt.py) and returns its `Attempt`. The
streams in flight are `streams` (streams.py): how far each has got, and closing them.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import httpx

from ...aio import in_executor
from ...openrouter import Completion, Price, RoutingDecision, build_request
from ...openrouter.stream import StreamState
from ...text import Tokenizer, prompt_ids
from ..conversations.fidelity import FidelityJudge
from ..conversations.work import Work
from .attempt import Attempt, Transport
from .congestion import ProviderCooldown
from .streams import Streams
from .tool_results import ToolResults

INLINE_CHARS = 16_000  # a prompt of at most this many characters of text is tokenized on the event loop


def inline(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> bool:
    """Is this prompt short enough to tokenize on the event loop? Rendering and encoding it takes well under a
    millisecond, while a trip to the tokenizer's thread and back costs two turns of the loop: ~200 ms each when the
    loop is busy (issue 60: 500 streams of 4-second answers on a loaded machine, 22 of 500 slots preparing on
    average). Text only: a prompt with tools, or with content other than a string, goes to the thread."""
    if tools:
        return False
    size = 0
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str | None) or m.get("tool_calls"):
            return False
        size += len(content or "")
    return size <= INLINE_CHARS


class Requester:
    def __init__(self, transport: Transport, routing: RoutingDecision, fidelity: FidelityJudge,
                 cooldown: ProviderCooldown, tok: Tokenizer, executor: Executor, *, worst: Price, model: str,
                 max_tokens: int, temperature: float | None, backend: str, stream: bool = False,
                 at_target: str = "cut", tool_results: ToolResults | None = None):
        self.transport, self.routing, self.fidelity, self.cooldown = transport, routing, fidelity, cooldown
        self.tok, self.executor, self.worst = tok, executor, worst
        self.model, self.max_tokens, self.temperature, self.backend = model, max_tokens, temperature, backend
        self.stream, self.at_target = stream, at_target
        self.price_by_provider = {e.provider: e.price for e in routing.eligible if e.priced}
        self.streams = Streams(routing)  # the streamed attempts in flight (streams.py)
        self.tool_results = tool_results or ToolResults(None)  # a rollout's due calls executed (tool_results.py)

    async def prepare(self, work: Work) -> None:
        """The turn's prompt ids and the most one attempt of it can cost, once per work. A short prompt is tokenized
        on the event loop (`inline`); a long one, or one with tools, off it. A rollout's turn whose calls are due gets
        their results first (tool_results.py)."""
        if work.turn.due:
            work.turn = await self.tool_results.complete(work.turn)
        if work.prompt_ids is None:
            messages, tools = work.turn.messages, work.turn.conversation.tools
            if inline(messages, tools):
                work.prompt_ids = prompt_ids(self.tok, messages, tools=tools)
            else:
                work.prompt_ids = await in_executor(self.executor, prompt_ids, self.tok, messages, tools=tools)
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
            billing = {p for p in eligible if not self.streams.cancels(p)}
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
                          cancels=state is not None and self.streams.all_cancel(body.get("provider")))
        if state is not None:
            self.streams.add(attempt)
        return attempt

    def cost(self, c: Completion) -> float:
        """The server's `usage.cost`, else the tokens at the serving provider's price (else the worst)."""
        if c.usage.cost is not None:
            return c.usage.cost
        price = self.price_by_provider.get(c.provider, self.worst)
        return price.cost(c.usage.prompt_tokens, c.usage.completion_tokens)

    def observe(self, now: float, provider: str, rate_limited: bool) -> None:
        """A provider answered (or said 429): its cooldown hears of it."""
        self.cooldown.observe(now, provider, rate_limited)
