"""The engine's parts without a server: datasets files, a routing decision, the parts built on them (as
`engine.Run.start` builds them, less the account and the HTTP client), answers as the service's classification
gives them, a scripted transport, and one request driven along its path (generation/README.md). Used by the
tests of the dispatcher, the requester, the recorder, the reporter and the engine (tests/generation/); the
`parts` fixture of tests/generation/conftest.py is a `PartsMaker`."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from eagledata.generation import GenerateConfig
from eagledata.generation.clock import InlineExecutor
from eagledata.generation.conversations.work import Work
from eagledata.generation.lanes import DatasetRun, open_lanes
from eagledata.generation.realtime.parts import Parts, Seams, build_parts
from eagledata.openrouter import Completion, Endpoint, Kind, Outcome, RoutingDecision
from eagledata.records import Answer, Usage
from eagledata.text import output_ids

PRICE_IN, PRICE_OUT = 0.5, 2.0  # $ per M tokens
MODEL = "moonshotai/kimi-k2.5"


def endpoint(provider: str, prompt_per_m: float | None = PRICE_IN, completion_per_m: float | None = PRICE_OUT, *,
             tag: str | None = None, stream_cancellation: bool = False) -> Endpoint:
    return Endpoint(provider=provider, tag=tag or provider.lower(), quantization="int4", prompt_per_m=prompt_per_m,
                    completion_per_m=completion_per_m, context_length=262144, stream_cancellation=stream_cancellation)


def routing(*endpoints: Endpoint, provider: dict[str, Any] | None = None) -> RoutingDecision:
    """A decision over `endpoints` (default: one provider, "Sim", at PRICE_IN / PRICE_OUT) sending `provider`."""
    return RoutingDecision(model=MODEL, provider=dict(provider or {}), eligible=list(endpoints) or [endpoint("Sim")],
                           source="test")


_routing = routing  # PartsMaker's default (its keyword `routing` hides the name)


def datasets(tmp_path: Path, sizes: dict[str, int], targets: dict[str, int] | None = None, *, asks: int = 1,
             tools: list[dict] | None = None) -> Path:
    """A datasets file over prompt files of `sizes[name]` prompts each, ids `<name>-0000`…: the user asks
    `<name> question <i>`, then with `asks` > 1 the dataset's answer and `<name> question <i> part <k>` up to
    `asks` (a conversation of that many turns); `tools`: every dataset's declarations."""
    lines = []
    for name, n in sizes.items():
        path = tmp_path / f"{name}.jsonl"
        with path.open("w") as f:
            for i in range(n):
                messages = [{"role": "user", "content": f"{name} question {i}"}]
                for k in range(2, asks + 1):
                    messages += [{"role": "assistant", "content": f"dataset answer {k - 1}"},
                                 {"role": "user", "content": f"{name} question {i} part {k}"}]
                f.write(json.dumps({"id": f"{name}-{i:04d}", "messages": messages}) + "\n")
        target = (targets or {}).get(name)
        lines.append(f"{name}:\n  prompts: {path}\n" + (f"  target_output_tokens: {target}\n" if target else "")
                     + (f"  tools: {json.dumps(tools)}\n" if tools else ""))
    out = tmp_path / "datasets.yaml"
    out.write_text("".join(lines))
    return out


class PartsMaker:
    """`make(sizes, **settings)`: the parts of a run over the datasets `sizes` (names → prompts) in `tmp_path`,
    every dataset at once (`dataset: all`), tokenizing inline, `now` 0; `close()` closes their stores."""

    def __init__(self, tmp_path: Path, tok: Any):
        self.tmp_path, self.tok = tmp_path, tok
        self.made: list[list[DatasetRun]] = []

    def __call__(self, sizes: dict[str, int], *, targets: dict[str, int] | None = None, asks: int = 1,
                 tools: list[dict] | None = None, routing: RoutingDecision | None = None,
                 transport: Any = None, **settings: Any) -> Parts:
        cfg = GenerateConfig(**{"dataset": "all", "output_dir": str(self.tmp_path / "out"), "concurrency": 4,
                                "max_tokens": 1000, "progress": False, "reserve_usd": 0.0, "retry_base_s": 1.0,
                                "retry_cap_s": 1.0, **settings,
                                "datasets_file": str(datasets(self.tmp_path, sizes, targets, asks=asks, tools=tools))})
        lanes = open_lanes(cfg)
        self.made.append(lanes)
        seams = Seams(transport=transport if transport is not None else Scripted(), executor=InlineExecutor())
        return build_parts(cfg, lanes, routing if routing is not None else _routing(), self.tok, seams, 0.0)

    def close(self) -> None:
        for lanes in self.made:
            for lane in lanes:
                lane.store.close()


def completion(tok: Any, content: str = "four words of content", *, reasoning: str = "ok so",
               finish: str = "stop", provider: str = "Sim", cost: float | None = None, prompt_tokens: int = 20,
               completion_tokens: int | None = None, reasoning_tokens: int = 3, generation_id: str = "gen-1") \
        -> Completion:
    """An answer as the service's classification gives it; `completion_tokens` defaults to the ids the record
    will hold (a faithful provider's count)."""
    if completion_tokens is None:
        completion_tokens = len(output_ids(tok, reasoning, content, finish))
    return Completion(answer=Answer(reasoning, content, finish), provider=provider, model="sim",
                      generation_id=generation_id,
                      usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                  reasoning_tokens=reasoning_tokens, cost=cost))


def answered(tok: Any, content: str = "four words of content", **kw: Any) -> Outcome:
    """An OK outcome carrying `completion(tok, content, **kw)`."""
    return Outcome(Kind.OK, "ok", 200, completion=completion(tok, content, **kw))


HOLD = "hold"  # in a script: the request stays in flight until it is cancelled


class Scripted:
    """A Transport that answers from its script in order (an Outcome, or HOLD: no answer until cancelled), and
    keeps what it was sent (`sent`: the bodies, `clients`: the client of each) and how many were cancelled."""

    def __init__(self, *script: Outcome | str):
        self.script = list(script)
        self.sent: list[dict[str, Any]] = []
        self.clients: list[Any] = []
        self.cancelled = 0

    async def handle_request(self, client: Any, body: dict[str, Any], state=None) -> Outcome:
        self.sent.append(body)
        self.clients.append(client)
        if not self.script:
            raise AssertionError(f"request {len(self.sent)} sent, none scripted")
        answer = self.script.pop(0)
        if answer == HOLD:
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        assert isinstance(answer, Outcome)
        return answer


async def attempt(p: Parts, work: Work, now: float = 0.0, *, latency_s: float = 0.0, client: Any = None) -> Outcome:
    """One request of `work` (taken) along its path, as a slot sends it: prepare, admit and send at `now`, build the
    record, settle and release `latency_s` later. Returns what the transport answered."""
    await p.requester.prepare(work)
    assert p.admit(work, now) is not None, "not admitted"
    outcome = await p.requester.start(client, work, now)
    record = None
    if outcome.kind is Kind.OK and outcome.completion is not None:
        record = await p.recorder.build(work, outcome.completion)
    p.settle(work, outcome, record, None, now + latency_s)
    p.dispatcher.release(work, now + latency_s)
    return outcome


def send(p: Parts, now: float = 0.0, answer: Outcome | None = None, *, latency_s: float = 0.0) -> Work:
    """The next work the dispatcher gives at `now`, sent once (`attempt`) through the parts' transport (a
    `Scripted` one: `answer` is added to its script)."""
    if answer is not None:
        p.requester.transport.script.append(answer)
    work = p.dispatcher.take(now)
    assert isinstance(work, Work), work
    asyncio.run(attempt(p, work, now, latency_s=latency_s))
    return work
