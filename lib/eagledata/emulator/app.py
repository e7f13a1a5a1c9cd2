"""The emulator's Starlette app: OpenRouter's API under /api/v1 plus /admin for tests.

All state lives in one `Emulator` object on one event loop, so counters need no locks; every delay
is an asyncio sleep, so thousands of open requests cost memory, not threads.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import struct
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import InputError
from ..text import KimiTokenizer, prompt_ids
from .catalog import Endpoint, per_token, route
from .config import FAULT_CLASSES, EmulatorConfig, parse_config
from .content import Generation, content_rng, generate, prompt_hash
from .credits import Ledger, affordable_tokens, reservation, usage_cost
from .faults import HTTP_FAULTS, draw_fault, error_body, http_fault_body, upstream_error
from .requests import ApiError, ChatRequest, parse_chat

REASONING_FORMAT = "unknown"
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
    fault: str | None
    gen: Generation | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    settled: bool = False
    epoch: int = 0     # the emulator state it belongs to (an admin reset starts a new one)
    streamed: int = 0  # output tokens sent so far on a stream


@dataclass
class Stats:
    requests: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_provider: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    quirks: Counter = field(default_factory=Counter)
    in_flight: int = 0
    in_flight_peak: int = 0


class Emulator:
    """Service state: config, credits, routing load, attempts per prompt, generations, stats."""

    def __init__(self, cfg: EmulatorConfig, tok: KimiTokenizer):
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

    # -- admission ------------------------------------------------------------------------------
    def prompt_ids(self, req: ChatRequest) -> list[int]:
        """Prompt ids by the chat template; retries of a prompt reuse the rendering (it is the hot path)."""
        key = (prompt_hash(req.messages), req.thinking)
        ids = self._prompt_cache.get(key)
        if ids is None:
            try:
                ids = prompt_ids(self.tok, req.messages, thinking=req.thinking)
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
        """Route, pick an endpoint that is neither busy nor failing, check its worst case against the balance, draw a fault."""
        n_prompt = len(p_ids)
        r = route(self.cfg.endpoints, req.prefs, need_tokens=n_prompt + (req.max_tokens or 0),
                  used_parameters=req.used_parameters)
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
        phash = prompt_hash(req.messages)
        attempt = self.attempts[phash]
        self.attempts[phash] += 1
        fault = draw_fault(self.fault_rng, self.cfg.faults.rates)
        if fault is not None:
            self.stats.faults[fault] += 1
        job = Job(f"gen-{int(time.time())}-{uuid.uuid4().hex[:20]}", chosen, req, p_ids, phash, attempt, worst, fault,
                  epoch=self.epoch)
        self.load[chosen.provider] += 1
        if fault not in HTTP_FAULTS and fault != "connection_reset":
            # Temperature 0 is (near) greedy: retries of the same prompt repeat the answer.
            attempt_key = 0 if req.temperature == 0 else attempt
            rng = content_rng(self.cfg.seed, phash, attempt_key, req.seed)
            job.gen = generate(self.tok, rng, self.cfg.content, chosen.quirks, max_tokens, thinking=req.thinking,
                               reasoning_scale=req.reasoning_scale, reasoning_cap=req.reasoning_max_tokens)
        return job

    # -- completion -----------------------------------------------------------------------------
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
        if not charged:
            return
        self.stats.by_provider[job.ep.provider] += 1
        gen = job.gen
        assert gen is not None
        if gen.quirk:
            self.stats.quirks[gen.quirk] += 1
        n_prompt, n_out = len(job.prompt_ids), len(gen.output_ids)
        self.generations[job.gen_id] = (time.monotonic() + self.cfg.generation_delay, {
            "id": job.gen_id, "upstream_id": f"chatcmpl-{job.gen_id[-12:]}", "total_cost": cost,
            "cache_discount": None, "upstream_inference_cost": None, "created_at": _iso(job.created),
            "model": self.cfg.model_version, "app_id": None, "streamed": job.req.stream, "cancelled": False,
            "provider_name": job.ep.provider, "latency": round((time.monotonic() - job.started) * 1000),
            "moderation_latency": None, "generation_time": round((time.monotonic() - job.started) * 1000),
            "finish_reason": gen.finish_reason, "native_finish_reason": gen.finish_reason,
            "tokens_prompt": n_prompt, "tokens_completion": n_out, "native_tokens_prompt": n_prompt,
            "native_tokens_completion": n_out, "native_tokens_reasoning": gen.reasoning_tokens,
            "native_tokens_cached": 0, "num_media_prompt": None, "num_media_completion": None,
            "num_search_results": None, "origin": "", "usage": cost, "is_byok": False, "api_type": "completions",
        })
        record = {"generation_id": job.gen_id, "prompt_hash": job.phash, "attempt": job.attempt,
                  "provider": job.ep.provider, "model": self.cfg.model_version, "prompt_tokens": n_prompt,
                  **({"prompt_ids": job.prompt_ids} if self.cfg.record_prompt_ids else {}),
                  **gen.to_dict(), "fault": job.fault, "cost": cost}
        self.ground_truth[job.gen_id] = record
        if self.cfg.ground_truth_file:
            with open(self.cfg.ground_truth_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def cost(self, job: Job) -> float:
        assert job.gen is not None
        return usage_cost(len(job.prompt_ids), len(job.gen.output_ids), job.ep)

    def usage(self, job: Job, empty: bool = False) -> dict:
        n_prompt = 0 if empty else len(job.prompt_ids)
        n_out = 0 if empty or job.gen is None else len(job.gen.output_ids)
        reasoning = 0 if empty or job.gen is None else job.gen.reasoning_tokens
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                "cost": 0.0 if empty else self.cost(job), "is_byok": False,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": reasoning}}

    def delays(self, job: Job) -> tuple[float, float]:
        """(time to first token, generation time) in seconds, scaled by `speed`."""
        n = len(job.gen.output_ids) if job.gen else 0
        s = self.cfg.speed
        slow = self.cfg.faults.slow_seconds if job.fault == "slow" else 0.0
        return job.ep.latency * s + slow, n / job.ep.throughput * s

    def snapshot(self) -> dict:
        st = self.stats
        return {"requests": st.requests, "outcomes": dict(st.outcomes), "by_provider": dict(st.by_provider),
                "faults": {k: st.faults.get(k, 0) for k in FAULT_CLASSES}, "quirks": dict(st.quirks),
                "charged_usd": self.ledger.total_usage, "in_flight_worst_usd": self.ledger.in_flight_worst,
                "total_credits": self.ledger.total_credits, "in_flight": st.in_flight,
                "in_flight_peak": st.in_flight_peak, "load": {k: v for k, v in self.load.items() if v}}


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# -- response bodies ----------------------------------------------------------------------------
def served_fields(job: Job) -> tuple[str | None, list[dict], str]:
    """(message.reasoning, reasoning_details, content) as this provider serves them, quirks applied."""
    gen = job.gen
    assert gen is not None
    if not job.req.thinking or job.req.exclude_reasoning or not gen.reasoning:
        return None, [], gen.content
    details = [{"type": "reasoning.text", "text": gen.reasoning, "format": REASONING_FORMAT, "index": 0}]
    if gen.quirk == "reasoning_details_only":
        return None, details, gen.content
    if gen.quirk == "inline_think":
        closed = len(gen.output_ids) > gen.reasoning_tokens
        return None, [], "<think>" + gen.reasoning + ("</think>" + gen.content if closed else "")
    return gen.reasoning, details, gen.content


def _envelope(em: Emulator, job: Job, obj: str) -> dict:
    return {"id": job.gen_id, "provider": job.ep.provider, "model": em.cfg.model_version, "object": obj,
            "created": job.created}


def completion_body(em: Emulator, job: Job) -> dict:
    gen = job.gen
    assert gen is not None
    if job.fault == "empty_content":
        message = {"role": "assistant", "content": "", "refusal": None, "reasoning": None}
        finish, usage = "stop", em.usage(job, empty=True)
    else:
        reasoning, details, content = served_fields(job)
        message = {"role": "assistant", "content": content, "refusal": None, "reasoning": reasoning,
                   "reasoning_details": details}
        finish, usage = gen.finish_reason, em.usage(job)
    body = {**_envelope(em, job, "chat.completion"),
            "choices": [{"logprobs": None, "finish_reason": finish, "native_finish_reason": finish, "index": 0,
                         "message": message}],
            "system_fingerprint": None, "usage": usage}
    if job.req.return_token_ids and job.fault != "empty_content":  # as vLLM answers `return_token_ids`
        body["prompt_token_ids"] = job.prompt_ids
        body["choices"][0]["token_ids"] = gen.output_ids
    return body


def choice_error_body(em: Emulator, job: Job) -> dict:
    err = upstream_error(502, job.ep.provider, "upstream stream closed before completion")["error"]
    return {**_envelope(em, job, "chat.completion"),
            "choices": [{"logprobs": None, "finish_reason": "error", "native_finish_reason": "error", "index": 0,
                         "message": {"role": "assistant", "content": "", "refusal": None, "reasoning": None},
                         "error": err}],
            "usage": em.usage(job, empty=True)}


def _error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.code, e.message, e.metadata), status_code=e.code, headers=e.headers)


def _sse(obj: dict) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


def _pieces(text: str, n: int) -> list[str]:
    """Split text into n nearly equal character pieces (deltas that concatenate back to it)."""
    if not text:
        return []
    n = max(1, min(n, len(text)))
    step = math.ceil(len(text) / n)
    return [text[i:i + step] for i in range(0, len(text), step)]


# -- handlers -----------------------------------------------------------------------------------
async def _abort_connection(request: Request) -> None:
    """Connection reset: RST the socket (SO_LINGER 0) so the client sees the peer reset, no response."""
    transport = request.scope.get("emulator.transport")
    if transport is None:
        raise ConnectionAbortedError("connection_reset fault without a transport")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed: the abort below is still a reset from the client's side
    transport.abort()
    for _ in range(3):  # let connection_lost run, so the server does not try to answer
        await asyncio.sleep(0)


async def chat_completions(request: Request) -> Response:
    em: Emulator = request.app.state.em
    em.stats.requests += 1
    try:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            em.check_auth(request)
            raise ApiError(400, "request body is not valid JSON", {"field": "body"}) from None
        except ClientDisconnect:  # the client died while sending: nobody to answer
            em.stats.outcomes["client_disconnect"] += 1
            return Response(status_code=499)
        em.check_auth(request, local_server=isinstance(body, dict) and body.get("return_token_ids") is True)
        req = parse_chat(body, (em.cfg.model, em.cfg.model_version))
        job = em.admit(req, em.prompt_ids(req))
    except ApiError as e:
        em.stats.outcomes[e.outcome] += 1
        return _error_response(e)
    em.stats.in_flight += 1
    em.stats.in_flight_peak = max(em.stats.in_flight_peak, em.stats.in_flight)
    if job.fault in HTTP_FAULTS or job.fault == "connection_reset":
        try:
            if job.fault == "connection_reset":
                await _abort_connection(request)
                return Response(status_code=500)  # never sent: the connection is gone
            headers = {"Retry-After": str(em.cfg.faults.retry_after)} if job.fault in ("rate_limit",
                                                                                       "upstream_rate_limit",
                                                                                       "budget") else {}
            return JSONResponse(http_fault_body(job.fault, job.ep.provider, em.cfg.model),
                                status_code=HTTP_FAULTS[job.fault], headers=headers)
        finally:
            em.settle(job, job.fault, charged=False)
            em.stats.in_flight -= 1
    if req.stream:
        return JobStream(em, job)
    try:
        ttft, gen_time = em.delays(job)
        if ttft + gen_time > 0:
            await asyncio.sleep(ttft + gen_time)
        headers = {"X-Generation-Id": job.gen_id}
        if job.fault in ("error_in_choice", "midstream_error"):
            em.settle(job, job.fault, charged=False)
            return JSONResponse(choice_error_body(em, job), headers=headers)
        if job.fault == "error_top_level":
            em.settle(job, job.fault, charged=False)
            return JSONResponse(upstream_error(502, job.ep.provider, "model produced an invalid response"),
                                headers=headers)
        if job.fault == "empty_content":
            em.settle(job, job.fault, charged=False)
            return JSONResponse(completion_body(em, job), headers=headers)
        body = completion_body(em, job)
        # A truncated body is still charged: the generation happened, the bytes were lost in transit.
        em.settle(job, job.fault or "ok", charged=True)
        if job.fault == "truncated_json":
            raw = json.dumps(body).encode()
            return Response(raw[: len(raw) // 2], media_type="application/json", headers=headers)
        return JSONResponse(body, headers=headers)
    finally:
        em.settle(job, "cancelled", charged=False)
        em.stats.in_flight -= 1


class JobStream(StreamingResponse):
    """The SSE response of one job; releases the job however the stream ends (a client that
    disconnects before the first byte included, when the generator never runs its own cleanup)."""

    def __init__(self, em: Emulator, job: Job):
        super().__init__(_stream(em, job), media_type="text/event-stream",
                         headers={"X-Generation-Id": job.gen_id, "Cache-Control": "no-cache"})
        self.em, self.job = em, job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.em.stats.in_flight -= 1
            if not self.job.settled:
                self.abandoned()

    def abandoned(self) -> None:
        """The client went away mid-stream: a provider with stream cancellation stops and bills the tokens so
        far; any other generates on and bills the whole answer when it would have ended."""
        em, job = self.em, self.job
        if job.ep.stream_cancellation or job.gen is None:
            em.settle(job, "cancelled", charged=False, partial_tokens=job.streamed if job.gen else 0)
            return
        ttft, gen_time = em.delays(job)
        left = max(0.0, job.started + ttft + gen_time - time.monotonic())
        asyncio.get_running_loop().call_later(left, em.settle, job, "abandoned", True)


async def _stream(em: Emulator, job: Job) -> AsyncIterator[str]:
    """SSE: processing comments, reasoning then content deltas, finish chunk, usage chunk, [DONE]."""
    gen = job.gen
    assert gen is not None
    ttft, gen_time = em.delays(job)
    yield ": OPENROUTER PROCESSING\n\n"
    waited = 0.0
    while waited < ttft:
        step = min(em.cfg.processing_interval, ttft - waited)
        await asyncio.sleep(step)
        waited += step
        if waited < ttft:
            yield ": OPENROUTER PROCESSING\n\n"
    base = _envelope(em, job, "chat.completion.chunk")

    def chunk(delta: dict, finish: str | None = None) -> str:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                          "native_finish_reason": finish, "logprobs": None}]})

    empty = job.fault == "empty_content"
    reasoning, details, content = (None, [], "") if empty else served_fields(job)
    r_text = reasoning if reasoning is not None else (details[0]["text"] if details else "")
    n_out = max(1, len(gen.output_ids))
    per_chunk = max(8, math.ceil(n_out / 48))
    r_share = gen.reasoning_tokens / n_out if r_text else 0.0
    deltas: list[dict] = []
    for piece in _pieces(r_text, math.ceil(n_out * r_share / per_chunk)):
        d: dict[str, Any] = {"role": "assistant", "content": "", "reasoning": piece if reasoning is not None else None}
        d["reasoning_details"] = [{"type": "reasoning.text", "text": piece, "format": REASONING_FORMAT, "index": 0}]
        deltas.append(d)
    for piece in _pieces(content, math.ceil(n_out * (1 - r_share) / per_chunk)):
        deltas.append({"role": "assistant", "content": piece, "reasoning": None})
    dt = gen_time / max(1, len(deltas))
    cut_at = len(deltas) // 2 if job.fault in ("midstream_error", "truncated_json") else None
    for i, delta in enumerate(deltas):
        if dt > 0:
            await asyncio.sleep(dt)
        job.streamed = round(n_out * i / len(deltas))
        if i == cut_at:
            if job.fault == "truncated_json":
                em.settle(job, job.fault, charged=True)
                line = chunk(delta)
                yield line[: len(line) // 2]
                return
            em.settle(job, job.fault, charged=False)
            err = {"code": "server_error", "message": "Provider disconnected unexpectedly"}
            yield _sse({**base, "error": err, "choices": [{"index": 0, "delta": {"content": ""},
                                                          "finish_reason": "error",
                                                          "native_finish_reason": "error"}]})
            return
        yield chunk(delta)
    finish = "stop" if empty else gen.finish_reason
    yield chunk({"role": "assistant", "content": ""}, finish)
    usage = em.usage(job, empty=empty)
    em.settle(job, job.fault or "ok", charged=not empty)
    yield _sse({**base, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


def _auth_only(request: Request) -> Emulator:
    em: Emulator = request.app.state.em
    em.check_auth(request)
    return em


def _api(handler):
    """Wrap a GET handler so ApiError becomes OpenRouter's error response."""
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return _error_response(e)
    return run


def _pricing(ep: Endpoint) -> dict:
    return {"prompt": per_token(ep.prompt_price), "completion": per_token(ep.completion_price),
            "request": "0", "image": "0"}


def _model_entry(em: Emulator) -> dict:
    cfg = em.cfg
    live = [e for e in cfg.endpoints if not e.down] or cfg.endpoints
    top = min(live, key=lambda e: e.prompt_price + e.completion_price)
    params = sorted({p for e in cfg.endpoints for p in e.supported_parameters})
    return {"id": cfg.model, "canonical_slug": cfg.model_version, "hugging_face_id": "moonshotai/Kimi-K2.5",
            "name": cfg.model_name, "created": 1769472000,
            "description": "Kimi K2.5: a native INT4 reasoning model (emulated).",
            "context_length": max(e.context_length for e in live),
            "architecture": {"modality": "text->text", "input_modalities": ["text"], "output_modalities": ["text"],
                             "tokenizer": "Other", "instruct_type": None},
            "pricing": {**_pricing(top), "web_search": "0", "internal_reasoning": "0"},
            "top_provider": {"context_length": top.context_length, "max_completion_tokens": top.max_completion_tokens,
                             "is_moderated": False},
            "per_request_limits": None, "supported_parameters": params, "default_parameters": {}}


@_api
async def models(request: Request) -> Response:
    em: Emulator = request.app.state.em
    return JSONResponse({"data": [_model_entry(em)]})


@_api
async def endpoints(request: Request) -> Response:
    em: Emulator = request.app.state.em
    cfg = em.cfg
    name = f"{request.path_params['author']}/{request.path_params['slug']}"
    if name not in (cfg.model, cfg.model_version):
        raise ApiError(404, f"Model {name} not found")
    eps = [{"name": f"{e.provider} | {cfg.model_version}", "model_id": cfg.model_version,
            "model_name": cfg.model_name, "context_length": e.context_length, "pricing": _pricing(e),
            "provider_name": e.provider, "tag": e.tag, "quantization": e.quantization,
            "max_completion_tokens": e.max_completion_tokens, "max_prompt_tokens": e.context_length,
            "supported_parameters": list(e.supported_parameters), "status": e.status,
            "uptime_last_30m": e.uptime, "uptime_last_1d": e.uptime, "supports_implicit_caching": False,
            "latency_last_30m": _percentiles(e.latency * 1000, rising=True),
            "throughput_last_30m": _percentiles(e.throughput, rising=False)} for e in cfg.endpoints]
    entry = _model_entry(em)
    return JSONResponse({"data": {"id": cfg.model, "name": cfg.model_name, "created": entry["created"],
                                  "description": entry["description"], "architecture": entry["architecture"],
                                  "endpoints": eps}})


def _percentiles(p50: float, *, rising: bool) -> dict:
    """p50/p75/p90/p99 around a median: latency rises in the tail, throughput falls."""
    f = (1.0, 1.3, 1.8, 3.0) if rising else (1.0, 0.85, 0.7, 0.45)
    return dict(zip(("p50", "p75", "p90", "p99"), (round(p50 * x, 2) for x in f)))


@_api
async def credits(request: Request) -> Response:
    em = _auth_only(request)
    if em.cfg.credits_forbidden:
        raise ApiError(403, "Only management keys can fetch credits")
    return JSONResponse({"data": {"total_credits": em.ledger.total_credits, "total_usage": em.ledger.total_usage}})


@_api
async def key(request: Request) -> Response:
    em = _auth_only(request)
    limit = em.cfg.key_limit if em.cfg.key_limit is not None else em.ledger.total_credits
    usage = em.ledger.total_usage
    k = request.headers["authorization"].split(" ", 1)[1].strip()
    return JSONResponse({"data": {"label": f"{k[:8]}...{k[-3:]}", "limit": limit, "limit_remaining": limit - usage,
                                  "limit_reset": None, "usage": usage, "usage_daily": usage, "is_free_tier": False,
                                  "is_provisioning_key": False}})


@_api
async def generation(request: Request) -> Response:
    em = _auth_only(request)
    gid = request.query_params.get("id")
    if not gid:
        raise ApiError(400, "'id' query parameter is required", {"field": "id"})
    found = em.generations.get(gid)
    if found is None or time.monotonic() < found[0]:
        raise ApiError(404, f"Generation {gid} not found")
    return JSONResponse({"data": found[1]})


# -- admin --------------------------------------------------------------------------------------
async def admin_health(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def admin_topup(request: Request) -> Response:
    em: Emulator = request.app.state.em
    try:
        amount = (await request.json())["amount"]
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError
    except (json.JSONDecodeError, KeyError, TypeError):
        return JSONResponse(error_body(400, "body must be {\"amount\": <USD>}"), status_code=400)
    em.ledger.topup(float(amount))
    return JSONResponse({"data": {"total_credits": em.ledger.total_credits, "total_usage": em.ledger.total_usage}})


async def admin_stats(request: Request) -> Response:
    return JSONResponse(request.app.state.em.snapshot())


async def admin_ground_truth(request: Request) -> Response:
    em: Emulator = request.app.state.em
    gid = request.query_params.get("id")
    if gid is None:
        return JSONResponse({"data": list(em.ground_truth.values())})
    if gid not in em.ground_truth:
        return JSONResponse(error_body(404, f"no ground truth for {gid}"), status_code=404)
    return JSONResponse({"data": em.ground_truth[gid]})


async def admin_reset(request: Request) -> Response:
    """Fresh state; with a JSON config body, that config (validated like --config) replaces the current one."""
    em: Emulator = request.app.state.em
    raw = await request.body()
    try:
        cfg = parse_config(json.loads(raw)) if raw.strip() else em.initial_cfg
    except json.JSONDecodeError:
        return JSONResponse(error_body(400, "config body is not valid JSON"), status_code=400)
    except InputError as e:
        return JSONResponse(error_body(400, str(e), {"field": e.field}), status_code=400)
    if em.stats.in_flight:
        return JSONResponse(error_body(409, f"{em.stats.in_flight} requests in flight"), status_code=409)
    em.reset(cfg)
    return JSONResponse({"ok": True})


class _ExposeTransport:
    """ASGI wrapper that puts uvicorn's transport in the scope, so a fault can reset the connection."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope["emulator.transport"] = getattr(getattr(send, "__self__", None), "transport", None)
        await self.app(scope, receive, send)


def create_app(cfg: EmulatorConfig, tok: KimiTokenizer) -> Any:
    """The ASGI app for uvicorn (or an in-process ASGI client)."""
    app = Starlette(routes=[
        Route("/api/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/api/v1/models", models),
        Route("/api/v1/models/{author}/{slug}/endpoints", endpoints),
        Route("/api/v1/credits", credits),
        Route("/api/v1/key", key),
        Route("/api/v1/generation", generation),
        Route("/admin/health", admin_health),
        Route("/admin/topup", admin_topup, methods=["POST"]),
        Route("/admin/stats", admin_stats),
        Route("/admin/ground_truth", admin_ground_truth),
        Route("/admin/reset", admin_reset, methods=["POST"]),
    ])
    app.state.em = Emulator(cfg, tok)
    return _ExposeTransport(app)
