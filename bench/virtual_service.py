"""A service the benches replay the engine against, in virtual time: the engine's own code (`generation.engine.Run`:
its slots, dispatcher, pacing, ledger and recorder), a service that answers from draws instead of a server.

`Drawn` answers each request, in the order requests are sent, with the next draw of (latency, output tokens) from
its own random stream; `run_engine` runs a `GenerateConfig` against it under `clock.run_virtual`, so minutes of
answers take seconds and the same draw decides the same way every time. pacing_replay.py and money_end_sim.py use it.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from eagledata.generation import GenerateConfig, Seams
from eagledata.generation.clock import InlineExecutor, run_virtual
from eagledata.generation.engine import Run
from eagledata.openrouter import Account, Completion, Endpoint, Kind, Outcome, RoutingDecision
from eagledata.records import Answer, Usage

MODEL = "moonshotai/kimi-k2.5"
REASONING = "ok so"
LOCAL = "http://127.0.0.1:9/api/v1"  # never reached: the transport is `Drawn`


class Drawn:
    """Answers of `draw(rng)` = (latency s, output tokens), billed at $/M `price_in` / `price_out` (the prompt at
    `prompt_tokens`, not reported: a replay's prompts are not the run's, so the fidelity judge does not count them).
    Keeps when each request was sent (`sent_at`)."""

    def __init__(self, draw: Callable[[random.Random], tuple[float, int]], seed: int, tok: Any, *,
                 price_in: float, price_out: float, prompt_tokens: int = 200, balance_usd: float = 1e9):
        self.draw, self.rng = draw, random.Random(seed)
        self.price_in, self.price_out, self.prompt_tokens = price_in, price_out, prompt_tokens
        self.billed, self.balance = 0.0, balance_usd
        self.sent_at: list[float] = []
        self.overhead = len(tok.encode_ordinary(REASONING)) + 2  # the reasoning, `</think>` and `<|im_end|>`
        assert len(tok.encode_ordinary(" ".join(["word"] * 1000))) == 1000, "the content is one token a word"

    async def handle_request(self, client: Any, body: dict[str, Any], state=None) -> Outcome:
        latency, tokens = self.draw(self.rng)
        self.sent_at.append(asyncio.get_running_loop().time())
        await asyncio.sleep(latency)
        words = max(1, tokens - self.overhead)
        out = words + self.overhead
        cost = (self.prompt_tokens * self.price_in + out * self.price_out) / 1e6
        self.billed += cost
        return Outcome(Kind.OK, "ok", 200, completion=Completion(
            answer=Answer(REASONING, " ".join(["word"] * words), "stop"), provider="Replay", model=MODEL,
            generation_id=f"gen-{len(self.sent_at)}",
            usage=Usage(prompt_tokens=0, completion_tokens=out, reasoning_tokens=len(REASONING.split()), cost=cost)))

    async def account(self, client: Any) -> Account:
        return Account(self.billed, self.balance - self.billed)


def endpoint(provider: str, price_in: float, price_out: float) -> Endpoint:
    return Endpoint(provider=provider, tag=provider.lower(), quantization="int4", prompt_per_m=price_in,
                    completion_per_m=price_out, context_length=262144)


def run_engine(cfg: GenerateConfig, service: Drawn, eligible: list[Endpoint]) -> dict[str, Any]:
    """The run's summary, the engine against `service` in virtual time (`eligible`: the routing decision's
    endpoints, whose worst price bounds a request's cost)."""
    seams = Seams(transport=service, account=service.account, executor=InlineExecutor(),
                  routing=RoutingDecision(model=MODEL, provider={}, eligible=eligible, source="replay"))

    async def main() -> dict[str, Any]:
        run = await Run.start(cfg, None, api_key="replay", seams=seams)
        try:
            return await run.execute([None] * cfg.concurrency)
        finally:
            run.close()

    return run_virtual(main())


def config(**kw: Any) -> GenerateConfig:
    return GenerateConfig(**{"base_url": LOCAL, "progress": False, "reserve_usd": 0.0, **kw})
