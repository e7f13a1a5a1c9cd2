"""A service the benches replay the engine against, in virtual time: the engine's own code
(`generation.realtime.engine.Run`:
its slots, dispatcher, pacing, ledger and recorder), a service that answers from draws instead of a server.

`Drawn` answers each request, in the order requests are sent, with the next draw of (latency, output tokens) from
its own random stream; `run_engine` runs a `GenerateConfig` against it under `clock.run_virtual`, so minutes of
answers take seconds and the same draw decides the same way every time. pacing_replay.py and money_end_sim.py use it.

A request that asks for a stream (`stream: true`) is answered as one: the first token after `TTFT_SHARE` of its
latency, then its text in `CHUNKS` pieces at an even pace, from an endpoint drawn among `endpoints` (weights, the
request's `provider.ignore` respected); a stream closed early is billed as far as it got on an endpoint with stream
cancellation, else whole (`wasted`: what was billed beyond what the run kept), and what it cost is told by its
generation id (`generation`, the generation endpoint's seam) at once.
"""
from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eagledata.generation import GenerateConfig, Seams
from eagledata.generation.clock import InlineExecutor, run_virtual
from eagledata.generation.realtime.engine import Run
from eagledata.openrouter import Account, Completion, Endpoint, Kind, Outcome, RoutingDecision
from eagledata.openrouter.client import GenerationStats
from eagledata.records import Answer, Usage

MODEL = "moonshotai/kimi-k2.5"
REASONING = "ok so"
LOCAL = "http://127.0.0.1:9/api/v1"  # never reached: the transport is `Drawn`
TTFT_SHARE = 0.08  # a stream's first token comes after this share of its answer's time
CHUNKS = 20        # a streamed answer's text comes in this many pieces (fewer for a short one)


@dataclass(frozen=True)
class Served:
    """An endpoint a streamed request may be routed to: its share of requests, and whether a closed stream stops
    its billing."""

    provider: str
    weight: float
    cancels: bool


class Drawn:
    """Answers of `draw(rng)` = (latency s, output tokens), billed at $/M `price_in` / `price_out` (the prompt at
    `prompt_tokens`, not reported: a replay's prompts are not the run's, so the fidelity judge does not count them).
    Keeps when each request was sent (`sent_at`)."""

    def __init__(self, draw: Callable[[random.Random], tuple[float, int]], seed: int, tok: Any, *,
                 price_in: float, price_out: float, prompt_tokens: int = 200, balance_usd: float = 1e9,
                 endpoints: Sequence[Served] = (Served("Replay", 1.0, True),)):
        self.draw, self.rng = draw, random.Random(seed)
        self.endpoints, self.routes = list(endpoints), random.Random(seed + 7_919)  # routing: its own stream
        self.wasted, self.cut_tokens, self.streams = 0.0, 0, 0
        self.price_in, self.price_out, self.prompt_tokens = price_in, price_out, prompt_tokens
        self.billed, self.balance = 0.0, balance_usd
        self.closed: dict[str, GenerationStats] = {}  # the streams closed early, by generation id
        self.sent_at: list[float] = []
        self.overhead = len(tok.encode_ordinary(REASONING)) + 2  # the reasoning, `</think>` and `<|im_end|>`
        assert len(tok.encode_ordinary(" ".join(["word"] * 1000))) == 1000, "the content is one token a word"

    async def handle_request(self, client: Any, body: dict[str, Any], state=None) -> Outcome:
        latency, tokens = self.draw(self.rng)
        self.sent_at.append(asyncio.get_running_loop().time())
        gid = f"gen-{len(self.sent_at)}"
        words = max(1, tokens - self.overhead)
        out = words + self.overhead
        provider = "Replay"
        if state is None or not body.get("stream"):
            await asyncio.sleep(latency)
        else:
            served = self._route(body)
            provider = served.provider
            sent = await self._stream(state, gid, served, latency, words)
            if sent is not None:  # closed early
                billed = sent if served.cancels else out
                cost = (self.prompt_tokens * self.price_in + billed * self.price_out) / 1e6
                self.billed += cost
                self.closed[gid] = GenerationStats(gid, cost, served.cancels, billed, provider)
                self.wasted += max(0, billed - sent) * self.price_out / 1e6
                raise asyncio.CancelledError
        cost = (self.prompt_tokens * self.price_in + out * self.price_out) / 1e6
        self.billed += cost
        return Outcome(Kind.OK, "ok", 200, completion=Completion(
            answer=Answer(REASONING, " ".join(["word"] * words), "stop"), provider=provider, model=MODEL,
            generation_id=gid,
            usage=Usage(prompt_tokens=0, completion_tokens=out, reasoning_tokens=len(REASONING.split()), cost=cost)))

    def _route(self, body: dict[str, Any]) -> Served:
        ignore = set((body.get("provider") or {}).get("ignore") or ())
        allowed = [e for e in self.endpoints if e.provider not in ignore] or self.endpoints
        return self.routes.choices(allowed, [e.weight for e in allowed])[0]

    async def _stream(self, state: Any, gid: str, served: Served, latency: float, words: int) -> int | None:
        """Fill `state` as the answer streams; None when it ran to its end, else the tokens sent before it was
        closed (a cut keeps them; the run's cut sample is built from `state`, as from a real stream)."""
        self.streams += 1
        ttft = TTFT_SHARE * latency
        pieces = max(1, min(CHUNKS, words))
        step = (latency - ttft) / pieces
        sent = 0
        try:
            await asyncio.sleep(ttft)
            state.chunk({"id": gid, "provider": served.provider, "model": MODEL,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning": REASONING}}]})
            sent = self.overhead - 2
            for i in range(pieces):
                n = words * (i + 1) // pieces - words * i // pieces
                state.chunk({"id": gid, "choices": [{"index": 0, "delta": {"content": " word" * n if i else
                                                                          "word" + " word" * (n - 1)}}]})
                sent += n
                await asyncio.sleep(step)
        except asyncio.CancelledError:
            self.cut_tokens += sent
            return sent
        return None

    async def generation(self, client: Any, generation_id: str) -> GenerationStats | None:
        return self.closed.get(generation_id)

    async def account(self, client: Any) -> Account:
        return Account(self.billed, self.balance - self.billed)


def endpoint(provider: str, price_in: float, price_out: float, *, stream_cancellation: bool = False) -> Endpoint:
    return Endpoint(provider=provider, tag=provider.lower(), quantization="int4", prompt_per_m=price_in,
                    completion_per_m=price_out, context_length=262144, stream_cancellation=stream_cancellation)


def run_engine(cfg: GenerateConfig, service: Drawn, eligible: list[Endpoint]) -> dict[str, Any]:
    """The run's summary, the engine against `service` in virtual time (`eligible`: the routing decision's
    endpoints, whose worst price bounds a request's cost)."""
    seams = Seams(transport=service, account=service.account, generations=service.generation,
                  executor=InlineExecutor(),
                  routing=RoutingDecision(model=MODEL, provider={"sort": "price"}, eligible=eligible, source="replay"))

    async def main() -> dict[str, Any]:
        # each service is its own account: a key of its own, so that replays at once (test workers) never share the
        # spender lock of one made-up account
        run = await Run.start(cfg, None, api_key=f"replay-{uuid.uuid4().hex}", seams=seams)
        try:
            return await run.execute([None] * cfg.concurrency)
        finally:
            run.close()

    return run_virtual(main())


def config(**kw: Any) -> GenerateConfig:
    return GenerateConfig(**{"base_url": LOCAL, "progress": False, "reserve_usd": 0.0, **kw})
