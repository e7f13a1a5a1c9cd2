"""Thin OpenRouter HTTP plumbing shared by the stages: the key, the clients, the account, one completion."""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlparse

import httpx

from ..defaults import OPENROUTER_URL  # noqa: F401  (re-exported)
from ..errors import InputError
from .answers import Outcome, classify_exception, classify_response
from .stream import StreamState, stream_complete

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
LOCAL_KEY = "local-no-key"  # the emulator accepts any non-empty key


def is_local(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in LOCAL_HOSTS


def resolve_api_key(base_url: str, api_key_env: str = "OPENROUTER_API_KEY", backend: str = "openrouter") -> str | None:
    """The key from the environment only. Without one: a local backend (vLLM, SGLang, wherever it runs) is sent
    no key at all; the emulator on this machine gets a placeholder (it wants one, as OpenRouter does); any other
    OpenRouter URL is an error before any request."""
    key = os.environ.get(api_key_env, "")
    if key:
        return key
    if backend == "local":
        return None
    if is_local(base_url):
        return LOCAL_KEY
    raise InputError(f"no API key: set the environment variable {api_key_env} (it is never a parameter)",
                     field="api_key_env")


@dataclass
class APIError(Exception):
    """An error answer from the API, in OpenRouter's `{"error": {code, message, metadata}}` shape."""

    status: int
    code: int | str | None
    message: str
    metadata: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}"


def error_from_response(resp: httpx.Response) -> APIError:
    try:
        err = resp.json().get("error") or {}
    except ValueError:
        err = {}
    if not isinstance(err, dict):
        err = {"message": str(err)}
    return APIError(resp.status_code, err.get("code"), str(err.get("message") or resp.text[:200]),
                    err.get("metadata"))


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client (loading the CA bundle costs ~25 ms each time)."""
    return httpx.create_ssl_context()


def make_client(base_url: str, api_key: str | None, *, concurrency: int = 16,
                timeout: float = 60.0) -> httpx.AsyncClient:
    """A client whose pool fits the concurrency; the key lives only in its headers (none sent without one)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"HTTP-Referer": "https://github.com/eagledata", "X-Title": "eagledata"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", limits=limits, verify=_ssl_context(),
                             timeout=httpx.Timeout(timeout, connect=30.0), headers=headers)


class ClientPool:
    """Several small connection pools instead of one big one: httpx/httpcore scan every connection
    on each request and release, so one pool of 2,000 connections costs O(n²) CPU per wave."""

    def __init__(self, base_url: str, api_key: str | None, *, concurrency: int, timeout: float,
                 per_client: int = 16):
        n = max(1, -(-concurrency // per_client))
        size = -(-concurrency // n)
        self.clients = [make_client(base_url, api_key, concurrency=size + 2, timeout=timeout) for _ in range(n)]

    def __getitem__(self, i: int) -> httpx.AsyncClient:
        return self.clients[i % len(self.clients)]

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for c in self.clients:
            await c.aclose()


def unreachable(base_url: str, what: str, exc: Exception) -> InputError:
    """The error for a server that cannot be reached at all: names `base_url` (and, on this machine, says to start
    the emulator; without http(s)://, says that is missing)."""
    base_url = base_url.rstrip("/")
    url = urlparse(base_url)
    hint = ""
    if url.scheme not in ("http", "https"):
        hint = "; a base_url starts with http:// or https://"
    elif is_local(base_url):
        hint = f"; if it is the emulator, start it first: eagledata-emulator --port {url.port or 80}"
    return InputError(f"cannot reach {base_url} ({what}: {exc or type(exc).__name__}){hint}", field="base_url")


async def get_json(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    """GET `path` under the client's base URL; a server that cannot be reached is an InputError naming it."""
    try:
        resp = await client.get(path.lstrip("/"), params=params or None)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as e:
        raise unreachable(str(client.base_url), f"GET {path.lstrip('/')}", e) from None
    if resp.status_code != 200:
        raise error_from_response(resp)
    return resp.json()


@dataclass(frozen=True)
class Account:
    """What the key may read of the account: the key's lifetime usage and the credits left."""

    usage_usd: float | None
    balance_usd: float | None


async def read_account(client: httpx.AsyncClient) -> Account:
    """/key (usage, and limit_remaining when the key has a limit) and /credits (total − used; 403 without a
    management key). The balance is the smaller of the two that can be read."""
    key = (await get_json(client, "key"))["data"]
    usage = key.get("usage")
    balances = [] if key.get("limit_remaining") is None else [float(key["limit_remaining"])]
    try:
        d = (await get_json(client, "credits"))["data"]
        balances.append(float(d["total_credits"]) - float(d["total_usage"]))
    except APIError as e:
        if e.status not in (401, 403, 404):
            raise
    return Account(None if usage is None else float(usage), min(balances) if balances else None)


@dataclass(frozen=True)
class GenerationStats:
    """`GET generation?id=`: what the service billed one generation, and whether it was cancelled (a stream closed
    on a provider with stream cancellation: billed for what it generated until then)."""

    id: str
    total_cost: float
    cancelled: bool
    completion_tokens: int | None
    provider: str


async def read_generation(client: httpx.AsyncClient, generation_id: str) -> GenerationStats | None:
    """One generation's stats; None while the service does not know it (a 404: not finished, or lagging a few
    seconds behind its end) or has nothing readable for it."""
    resp = await client.get("generation", params={"id": generation_id})
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise error_from_response(resp)
    d = resp.json().get("data") or {}
    if not isinstance(d.get("total_cost"), (int, float)):
        return None
    tokens = d.get("native_tokens_completion")
    return GenerationStats(str(d.get("id") or generation_id), float(d["total_cost"]), bool(d.get("cancelled")),
                           int(tokens) if isinstance(tokens, int) else None, str(d.get("provider_name") or ""))


async def complete(client: httpx.AsyncClient, body: dict[str, Any], state: StreamState | None = None, *,
                   stall_timeout_s: float | None = None) -> Outcome:
    """POST chat/completions once and classify what came back (or what broke). A body with `stream: true` is read as
    SSE (openrouter/stream.py; `state`, when given, follows it chunk by chunk; `stall_timeout_s`: see
    `stream_complete`); the Outcome is the same either way. A JSON answer has the client's timeout, as a whole."""
    if body.get("stream"):
        return await stream_complete(client, body, state, stall_timeout_s=stall_timeout_s)
    try:
        resp = await client.post("chat/completions", json=body)
        return classify_response(resp.status_code, resp.headers, resp.content)
    except httpx.HTTPError as exc:
        return classify_exception(exc)
