"""The emulator's routes: OpenRouter's API under /api/v1 plus /admin for tests, on one Starlette app.

A handler parses, asks the service (`service.Emulator`) and answers with a body from `bodies.py`; every delay
is an asyncio sleep, so thousands of open requests cost memory, not threads.
"""
from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InputError
from ..text import Tokenizer
from .batch import BatchEmulator
from .batch_routes import ROUTES as BATCH_ROUTES
from .bodies import JobStream, answer_response, error_response, fault_error_response
from .catalog import Endpoint, per_token
from .config import EmulatorConfig, parse_config
from .faults import error_body
from .requests import ApiError, parse_chat
from .service import Emulator


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
    """Validate, admit (route, credit check, fault draw), then play the job's fault-table row."""
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
        return error_response(e)
    em.stats.in_flight += 1
    em.stats.in_flight_peak = max(em.stats.in_flight_peak, em.stats.in_flight)
    if job.plays.phase == "admission":
        assert job.fault is not None  # only a drawn fault plays at admission
        try:
            if job.plays.body == "reset":
                await _abort_connection(request)
                return Response(status_code=500)  # never sent: the connection is gone
            return fault_error_response(em, job)
        finally:
            em.settle(job, job.fault, charged=False)
            em.stats.in_flight -= 1
    if req.stream:
        return JobStream(em, job)
    try:
        ttft, gen_time = em.delays(job)
        if ttft + gen_time > 0:
            await asyncio.sleep(ttft + gen_time)
        return answer_response(em, job)
    finally:
        em.settle(job, "cancelled", charged=False)
        em.stats.in_flight -= 1


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
            return error_response(e)
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
            "latency_last_30m": _percentiles(e.latency, rising=True),  # seconds, as the API reference shows
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
    return JSONResponse({**request.app.state.em.snapshot(), "batch": request.app.state.batch.snapshot()})


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


def create_app(cfg: EmulatorConfig, tok: Tokenizer, *, clock: Callable[[], float] = time.monotonic) -> Any:
    """The ASGI app for uvicorn (or an in-process ASGI client); `clock` drives the Batch API (a test's own)."""
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
        *BATCH_ROUTES,  # Moonshot's Batch API under /moonshot/v1, and its admin routes
    ])
    app.state.em = Emulator(cfg, tok)
    app.state.batch = BatchEmulator(app.state.em, clock)  # reset with `em` (it follows em.epoch)
    return _ExposeTransport(app)
