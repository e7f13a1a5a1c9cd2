"""The emulator's service state: one `Emulator` holds config, credits, routing load, attempts per prompt,
generations and stats, and admits, prices and settles each request (`Job`).

All state lives on one event loop, so counters need no locks. Nothing here builds an HTTP response
(`bodies.py`) or knows a route (`routes.py`).
"""
from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError
from starlette.requests import Request

from ..errors import InputError
from ..text import IM_END, Tokenizer, prompt_ids
from .catalog import Endpoint, route
from .config import EmulatorConfig
from .content import Generation, content_rng, generate, prompt_hash
from .credits import Ledger, affordable_tokens, reservation, usage_cost
from .faults import FAULT_CLASSES, Fault, draw_fault, fault_of
from .requests import ApiError, ChatRequest
from .toolcalls import CALL_QUIRKS, DatasetCalls, call_id, plan

PROMPT_CACHE = 4096  # rendered prompts kept (oldest dropped first)


@dataclass
class Job:
    """One admitted request: where it runs, what it holds, what it will answer."""

    gen_id: str
    ep: Endpoint
    req: ChatRequest
    prompt_ids: list[int]
    phash: str
    attempt: int
    worst: float  # its worst case, checked against the balance at admission
    fault: str | None  # the drawn fault class (a `faults.FAULTS` key), None for a clean answer
    gen: Generation | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    settled: bool = False
    epoch: int = 0     # the emulator state it belongs to (an admin reset starts a new one)
    streamed: int = 0  # output tokens sent so far on a stream
    calls: list[dict] = field(default_factory=list)  # the tool calls as this provider serves them (OpenAI shape)

    @property
    def plays(self) -> Fault:
        """The fault-table row this job answers by (`faults.NO_FAULT` for a clean answer)."""
        return fault_of(self.fault)


@dataclass
class Stats:
    requests: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_provider: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    quirks: Counter = field(default_factory=Counter)
    tool_rounds: Counter = field(default_factory=Counter)  # rounds the datasets answered: followed, own (the plan)
    in_flight: int = 0
    in_flight_peak: int = 0


class Emulator:
    """Service state: config, credits, routing load, attempts per prompt, generations, stats."""

    def __init__(self, cfg: EmulatorConfig, tok: Tokenizer):
        self.tok = tok
        self.initial_cfg = cfg  # what /admin/reset without a body returns to
        self.reset(cfg)

    def reset(self, cfg: EmulatorConfig) -> None:
        self.epoch = getattr(self, "epoch", 0) + 1
        self.cfg = cfg
        self.ledger = Ledger(cfg.balance)
        self.fault_rng = random.Random(cfg.seed)
        self.route_rng = random.Random(cfg.seed + 1)
        self.attempts: Counter = Counter()
        self.load: Counter = Counter()
        self.generations: dict[str, tuple[float, dict]] = {}  # id → (visible from, /generation data)
        self.ground_truth: dict[str, dict] = {}
        self.stats = Stats()
        self._prompt_cache: dict[tuple[str, bool], list[int]] = {}
        if getattr(self, "_dataset_paths", None) != cfg.tool_datasets:  # read once, not at every reset
            self.dataset_calls = DatasetCalls.load(cfg.tool_datasets)
            self._dataset_paths = list(cfg.tool_datasets)

    # -- admission ------------------------------------------------------------------------------
    @staticmethod
    def request_hash(req: ChatRequest) -> str:
        """The conversation's hash (attempts, determinism); declared tools are part of the prompt when sent."""
        return prompt_hash(req.messages if req.tools is None else [{"tools": list(req.tools)}, *req.messages])

    def prompt_ids(self, req: ChatRequest) -> list[int]:
        """Prompt ids by the chat template, tools and messages as sent; retries of a prompt reuse the rendering
        (it is the hot path)."""
        key = (self.request_hash(req), req.thinking)
        ids = self._prompt_cache.get(key)
        if ids is None:
            try:
                ids = prompt_ids(self.tok, req.messages, thinking=req.thinking,
                                 tools=None if req.tools is None else list(req.tools))
            except (TemplateError, InputError) as e:
                raise ApiError(400, f"messages could not be rendered by the chat template: {e}") from None
            if len(self._prompt_cache) >= PROMPT_CACHE:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))
            self._prompt_cache[key] = ids
        return ids

    def check_auth(self, request: Request, *, local_server: bool = False) -> None:
        """OpenRouter wants a key. A request in the local servers' dialect (`return_token_ids`) is answered as
        vLLM/SGLang started without `--api-key` answer it: no key needed, unless `api_key` is configured."""
        header = request.headers.get("authorization", "")
        if not header and local_server and self.cfg.api_key is None:
            return
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "No auth credentials found")
        if self.cfg.api_key is not None and key.strip() != self.cfg.api_key:
            raise ApiError(401, "User not found.")

    def admit(self, req: ChatRequest, p_ids: list[int]) -> Job:
        """Route, pick an endpoint that is neither busy nor failing, check its worst case against the balance, draw
        a fault."""
        if self.cfg.reject is not None:  # a rule of every deployment: refused before routing, nothing generated
            raise ApiError(self.cfg.reject["code"], self.cfg.reject["message"], outcome="rejected")
        n_prompt = len(p_ids)
        r = route(self.cfg.endpoints, req.prefs, need_tokens=n_prompt + (req.max_tokens or 0),
                  used_parameters=req.used_parameters, tools=req.tools is not None)
        if not r.endpoints:
            if r.reason == "that can fit the requested context":
                longest = max((e.context_length for e in self.cfg.endpoints if not e.down), default=0)
                out = req.max_tokens or 0
                raise ApiError(400, f"This endpoint's maximum context length is {longest} tokens. However, you "
                                    f"requested about {n_prompt + out} tokens ({n_prompt} of text input, {out} "
                                    "in the output). Please reduce the length of either one, or use the "
                                    "\"middle-out\" transform to compress your prompt automatically.",
                               {"prompt_tokens": n_prompt, "max_tokens": out, "context_length": longest})
            raise ApiError(404, f"No endpoints found {r.reason} for {self.cfg.model}.",
                           outcome="no_endpoint")
        candidates = r.endpoints if req.prefs.allow_fallbacks else r.endpoints[:1]
        chosen, busy = None, False
        for ep in candidates:
            if self.load[ep.provider] >= ep.capacity:
                busy = True
                continue
            if ep.error_rate and self.route_rng.random() < ep.error_rate:
                self.stats.outcomes[f"fallback_from_{ep.slug}"] += 1
                continue
            chosen = ep
            break
        if chosen is None:
            ep = candidates[-1]
            if busy:
                raise ApiError(429, "Provider returned error",
                               {"raw": f"{ep.provider} is at capacity; rate limited", "provider_name": ep.provider},
                               {"Retry-After": str(self.cfg.faults.retry_after)}, outcome="busy")
            raise ApiError(502, "Provider returned error", {"raw": "upstream error", "provider_name": ep.provider},
                           outcome="provider_error")
        max_tokens = min(req.max_tokens or chosen.max_completion_tokens, chosen.max_completion_tokens,
                         chosen.context_length - n_prompt)
        worst = reservation(n_prompt, max_tokens, chosen)
        if not self.ledger.try_start(worst):
            can = affordable_tokens(self.ledger.available, n_prompt, chosen)
            raise ApiError(402, f"This request requires more credits, or fewer max_tokens. You requested up to "
                                f"{max_tokens} tokens, but can only afford {can}. To increase, visit "
                                "https://openrouter.ai/settings/credits and add more credits",
                           {"requested_tokens": max_tokens, "affordable_tokens": can}, outcome="insufficient_credits")
        phash = self.request_hash(req)
        attempt = self.attempts[phash]
        self.attempts[phash] += 1
        fault = draw_fault(self.fault_rng, self.cfg.faults.rates)
        if fault is not None:
            self.stats.faults[fault] += 1
        job = Job(f"gen-{int(time.time())}-{uuid.uuid4().hex[:20]}", chosen, req, p_ids, phash, attempt, worst, fault,
                  epoch=self.epoch)
        self.load[chosen.provider] += 1
        if job.plays.phase == "answer":  # an admission fault answers at once: nothing is generated
            # Temperature 0 is (near) greedy: retries of the same prompt repeat the answer.
            attempt_key = 0 if req.temperature == 0 else attempt
            rng = content_rng(self.cfg.seed, phash, attempt_key, req.seed)
            calls = None if req.tools is None else plan(req.messages, req.tools, req.parallel_tool_calls,
                                                        req.tool_choice, self.follow(req))
            job.gen = generate(self.tok, rng, self.cfg.content, chosen.quirks, max_tokens, thinking=req.thinking,
                               reasoning_scale=req.reasoning_scale, reasoning_cap=req.reasoning_max_tokens,
                               calls=calls)
            if job.gen.tool_calls:
                job.calls = served_calls(job.gen, chosen, rng, local_server=req.return_token_ids)
        return job

    def follow(self, req: ChatRequest) -> tuple[str, ...] | None:
        """The dataset's calls when this round follows the dataset's answer (`tool_follow_rate`), else None."""
        drawn = self.dataset_calls.follows(req.messages, self.cfg.tool_follow_rate, self.cfg.seed)
        if drawn is None:
            return None
        self.stats.tool_rounds["followed" if drawn[0] else "own"] += 1
        return drawn[1] if drawn[0] else None

    # -- completion -----------------------------------------------------------------------------
    def _generation(self, job: Job, cost: float, n_out: int, *, cancelled: bool = False) -> None:
        """`GET /generation?id=`'s stats of a billed generation (after `generation_delay`); a stream closed on a
        provider with stream cancellation is reported `cancelled`, its tokens and cost those generated until then."""
        gen = job.gen
        assert gen is not None
        n_prompt = len(job.prompt_ids)
        finish = None if cancelled else gen.finish_reason
        self.generations[job.gen_id] = (time.monotonic() + self.cfg.generation_delay, {
            "id": job.gen_id, "upstream_id": f"chatcmpl-{job.gen_id[-12:]}", "total_cost": cost,
            "cache_discount": None, "upstream_inference_cost": None, "created_at": _iso(job.created),
            "model": self.cfg.model_version, "app_id": None, "streamed": job.req.stream, "cancelled": cancelled,
            "provider_name": job.ep.provider, "latency": round((time.monotonic() - job.started) * 1000),
            "moderation_latency": None, "generation_time": round((time.monotonic() - job.started) * 1000),
            "finish_reason": finish, "native_finish_reason": finish,
            "tokens_prompt": n_prompt, "tokens_completion": n_out, "native_tokens_prompt": n_prompt,
            "native_tokens_completion": n_out,
            "native_tokens_reasoning": min(n_out, gen.reasoning_tokens) if cancelled else gen.reasoning_tokens,
            "native_tokens_cached": 0, "num_media_prompt": None, "num_media_completion": None,
            "num_search_results": None, "origin": "", "usage": cost, "is_byok": False, "api_type": "completions",
        })

    def settle(self, job: Job, outcome: str, charged: bool, *, partial_tokens: int | None = None) -> None:
        """End the job once; charge usage.cost and record the generation when charged
        (`partial_tokens`: a cancelled stream, billed for the prompt and the tokens generated so far)."""
        if job.settled or job.epoch != self.epoch:
            return
        job.settled = True
        self.load[job.ep.provider] -= 1
        if partial_tokens is not None:
            cost = usage_cost(len(job.prompt_ids), partial_tokens, job.ep)
        else:
            cost = self.cost(job) if charged else 0.0
        self.ledger.settle(job.worst, cost)
        self.stats.outcomes[outcome] += 1
        if partial_tokens is not None and job.gen is not None:  # a closed stream the provider stopped: billed so far
            self._generation(job, cost, partial_tokens, cancelled=True)
            self._truth(job, cost, cancelled=True, streamed_tokens=partial_tokens)  # its whole answer, and how far
        if not charged:
            return
        self.stats.by_provider[job.ep.provider] += 1
        gen = job.gen
        assert gen is not None
        if gen.quirk:
            self.stats.quirks[gen.quirk] += 1
        n_out = self.counted(job)
        self._generation(job, cost, n_out)
        self._truth(job, cost)

    def _truth(self, job: Job, cost: float, **extra: Any) -> None:
        """The ground truth of a billed generation: its exact ids (a cancelled stream's whole answer, with how many
        of its tokens it streamed), by generation id; appended to `ground_truth_file` when set."""
        assert job.gen is not None
        record = {"generation_id": job.gen_id, "prompt_hash": job.phash, "attempt": job.attempt,
                  "provider": job.ep.provider, "model": self.cfg.model_version, "prompt_tokens": len(job.prompt_ids),
                  **({"prompt_ids": job.prompt_ids} if self.cfg.record_prompt_ids else {}),
                  **job.gen.to_dict(), "fault": job.fault, "cost": cost, **extra}
        self.ground_truth[job.gen_id] = record
        if self.cfg.ground_truth_file:
            with open(self.cfg.ground_truth_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    @staticmethod
    def counted(job: Job) -> int:
        """The output tokens the endpoint reports (and bills): the ids, less a final `<|im_end|>` it does not count."""
        assert job.gen is not None
        ids = job.gen.output_ids
        return len(ids) - (not job.ep.usage_counts_im_end and bool(ids) and ids[-1] == IM_END)

    def cost(self, job: Job) -> float:
        return usage_cost(len(job.prompt_ids), self.counted(job), job.ep)

    def usage(self, job: Job, empty: bool = False) -> dict:
        n_prompt = 0 if empty else len(job.prompt_ids)
        n_out = 0 if empty or job.gen is None else self.counted(job)
        reasoning = 0 if empty or job.gen is None else job.gen.reasoning_tokens
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                "cost": 0.0 if empty else self.cost(job), "is_byok": False,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": reasoning}}

    def delays(self, job: Job) -> tuple[float, float]:
        """(time to first token, generation time) in seconds, scaled by `speed` (a delayed fault's extra is not)."""
        n = len(job.gen.output_ids) if job.gen else 0
        s = self.cfg.speed
        slow = self.cfg.faults.slow_seconds if job.plays.delayed else 0.0
        return job.ep.latency * s + slow, n / job.ep.throughput * s

    def snapshot(self) -> dict:
        st = self.stats
        return {"requests": st.requests, "outcomes": dict(st.outcomes), "by_provider": dict(st.by_provider),
                "faults": {k: st.faults.get(k, 0) for k in FAULT_CLASSES}, "quirks": dict(st.quirks),
                "tool_rounds": dict(st.tool_rounds),
                "charged_usd": self.ledger.total_usage, "in_flight_worst_usd": self.ledger.in_flight_worst,
                "total_credits": self.ledger.total_credits, "in_flight": st.in_flight,
                "in_flight_peak": st.in_flight_peak, "load": {k: v for k, v in self.load.items() if v}}


def served_calls(gen: Generation, ep: Endpoint, rng: random.Random, *, local_server: bool = False) -> list[dict]:
    """The answer's calls as `ep` serves them: its kind of id (`tool_call_ids`), arguments re-dumped under the
    `arguments_reserialized` quirk; the ground truth keeps the model's. A local server (the `return_token_ids`
    dialect: vLLM's kimi_k2 tool parser) passes the model's own ids and arguments through."""
    out = []
    serve = None if local_server else CALL_QUIRKS.get(gen.quirk or "")
    for c in gen.tool_calls:
        args = serve(c.arguments) if serve else c.arguments
        out.append({"id": call_id(rng) if ep.tool_call_ids == "call" and not local_server else c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": args}})
    return out


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
