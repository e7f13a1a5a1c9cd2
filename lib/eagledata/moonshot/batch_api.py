"""Moonshot's Batch API over one httpx client: upload a JSONL file, create a batch, poll it, download its results,
cancel it, read the account's balance (platform.kimi.ai "Batch API", OpenAI-compatible shapes).

`MoonshotBatches` is the batch route's dialect (generation/batch/service.py's `BatchService`): a second batch service
(OpenRouter's, when it serves Kimi) is another class with the same methods. It takes its client, as everything here
that talks to a server does: the key lives in that client's headers only. Control calls that meet a transient answer
(429, 5xx, a dropped connection) are retried with the project's one backoff rule; any other error is raised as a
`BatchApiError` naming the call.
"""
from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..errors import InputError
from ..retry import retry_delay_s
from .facts import BATCH_BASE_URL, BATCH_KEY_ENV, FIXED_SAMPLING, MAX_FILE_BYTES, PROVIDER, BatchModel, batch_model

ENDPOINT = "/v1/chat/completions"
TERMINAL = ("completed", "failed", "expired", "cancelled")
TRANSIENT = (408, 409, 429, 500, 502, 503, 504)
CONTROL_ATTEMPTS = 6  # a control call meeting transient answers: this many tries (backoff 1 s .. 30 s)


class BatchApiError(RuntimeError):
    """The Batch API refused a call (HTTP status and its message), or kept failing it."""

    def __init__(self, call: str, status: int | None, message: str):
        super().__init__(f"Moonshot Batch API: {call}: " + (f"HTTP {status}: " if status else "") + message)
        self.call, self.status, self.message = call, status, message


@dataclass(frozen=True)
class BatchInfo:
    """A batch as `GET /batches/{id}` describes it."""

    id: str
    status: str
    input_file_id: str = ""
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)  # validation errors of a failed batch
    created_at: float | None = None
    expires_at: float | None = None  # unix seconds: the window's end, as the service counts it

    @classmethod
    def from_api(cls, d: Mapping[str, Any]) -> BatchInfo:
        counts = d.get("request_counts") or {}
        errors = d.get("errors") or {}
        return cls(id=str(d["id"]), status=str(d.get("status") or ""), input_file_id=str(d.get("input_file_id") or ""),
                   output_file_id=d.get("output_file_id") or None, error_file_id=d.get("error_file_id") or None,
                   total=int(counts.get("total") or 0), completed=int(counts.get("completed") or 0),
                   failed=int(counts.get("failed") or 0), metadata=dict(d.get("metadata") or {}),
                   errors=list(errors.get("data") or []) if isinstance(errors, dict) else list(errors),
                   created_at=d.get("created_at"), expires_at=d.get("expires_at"))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class LineResult:
    """One line of an output or error file: the HTTP status and body its request got, or the error that kept it from
    being run (`batch_expired`, `batch_cancelled`)."""

    custom_id: str
    status_code: int | None
    body: dict[str, Any] | None
    error: dict[str, Any] | None

    @classmethod
    def from_line(cls, d: Mapping[str, Any]) -> LineResult:
        response = d.get("response") or {}
        body = response.get("body")
        return cls(custom_id=str(d.get("custom_id")), status_code=response.get("status_code"),
                   body=body if isinstance(body, dict) else None, error=d.get("error") or None)


def batch_body(model: str, messages: Sequence[dict], *, max_tokens: int, tools: Sequence[dict] | None = None,
               parallel_tool_calls: bool = False) -> dict[str, Any]:
    """A line's chat-completions body in Moonshot's dialect: thinking on, no sampling fields (kimi-k2.5/k2.6 refuse
    them in a batch), and an earlier tool-loop answer's reasoning as `reasoning_content` (Moonshot's name; the
    OpenRouter names are not sent)."""
    body: dict[str, Any] = {"model": model, "messages": [moonshot_message(m) for m in messages],
                            "max_tokens": max_tokens, "thinking": {"type": "enabled"}}
    if tools:
        body["tools"] = list(tools)
        body["parallel_tool_calls"] = parallel_tool_calls
    assert not set(FIXED_SAMPLING) & set(body)
    return body


def moonshot_message(m: Mapping[str, Any]) -> dict[str, Any]:
    """A message as Moonshot takes it: `reasoning` → `reasoning_content`, `reasoning_details` left out."""
    if m.get("role") != "assistant" or not ("reasoning" in m or "reasoning_details" in m):
        return dict(m)
    out = {k: v for k, v in m.items() if k not in ("reasoning", "reasoning_details")}
    if m.get("reasoning"):
        out["reasoning_content"] = m["reasoning"]
    return out


def batch_line(custom_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": dict(body)}


def jsonl(lines: Sequence[Mapping[str, Any]]) -> bytes:
    """An input file's bytes: one line per request, UTF-8."""
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


def resolve_batch_key(api_key_env: str = BATCH_KEY_ENV) -> str:
    key = os.environ.get(api_key_env, "")
    if not key:
        raise InputError(f"no Moonshot API key: set the environment variable {api_key_env} (it is never a "
                         "parameter)", field="batch_api_key_env")
    return key


def make_batch_client(base_url: str = BATCH_BASE_URL, api_key: str = "", *, timeout: float = 120.0,
                      transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """A client for the Batch API: the key only in its headers; uploads and downloads may be large (timeout)."""
    return httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", headers={"Authorization": f"Bearer {api_key}"},
                             timeout=httpx.Timeout(timeout, connect=30.0), transport=transport)


class MoonshotBatches:
    """The Batch API of one account (`client`: base URL and key set). Every method is one documented call (or a
    list walked page by page)."""

    name = "moonshot"
    provider = PROVIDER

    def __init__(self, client: httpx.AsyncClient, model: str, *, sleep: Any = asyncio.sleep,
                 max_file_bytes: int = MAX_FILE_BYTES):
        self.client, self.model, self.sleep, self.max_file_bytes = client, model, sleep, max_file_bytes
        self.price: BatchModel = batch_model(model)

    def body(self, messages: Sequence[dict], *, max_tokens: int, tools: Sequence[dict] | None = None,
             parallel_tool_calls: bool = False) -> dict[str, Any]:
        return batch_body(self.model, messages, max_tokens=max_tokens, tools=tools,
                          parallel_tool_calls=parallel_tool_calls)

    async def _call(self, call: str, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(CONTROL_ATTEMPTS):
            try:
                resp = await self.client.request(method, path, **kw)
            except httpx.TransportError as e:
                if attempt == CONTROL_ATTEMPTS - 1:
                    raise BatchApiError(call, None, f"{type(e).__name__}: {e}") from e
                await self.sleep(retry_delay_s(None, attempt, 0, base_s=1.0, cap_s=30.0))
                continue
            if resp.status_code < 400:
                return resp
            if resp.status_code not in TRANSIENT or attempt == CONTROL_ATTEMPTS - 1:
                raise BatchApiError(call, resp.status_code, _message(resp))
            ra = resp.headers.get("retry-after")
            await self.sleep(retry_delay_s(float(ra) if ra and ra.replace(".", "", 1).isdigit() else None, attempt,
                                           int(resp.status_code == 429), base_s=1.0, cap_s=30.0))
        raise AssertionError("unreachable")

    async def upload(self, filename: str, data: bytes) -> str:
        """`POST /files` (purpose batch) of a JSONL file's bytes (`jsonl`) → the file's id."""
        resp = await self._call("upload", "POST", "files", data={"purpose": "batch"},
                                files={"file": (filename, data, "application/jsonl")})
        return str(resp.json()["id"])

    async def files(self) -> list[dict[str, Any]]:
        """The account's files (to adopt an upload whose id a killed run never journaled)."""
        return list((await self._call("list files", "GET", "files")).json().get("data") or [])

    async def delete_file(self, file_id: str) -> None:
        await self._call("delete file", "DELETE", f"files/{file_id}")

    async def create(self, input_file_id: str, window: str, metadata: Mapping[str, str]) -> BatchInfo:
        resp = await self._call("create batch", "POST", "batches", json={
            "input_file_id": input_file_id, "endpoint": ENDPOINT, "completion_window": window,
            "metadata": dict(metadata)})
        return BatchInfo.from_api(resp.json())

    async def get(self, batch_id: str) -> BatchInfo:
        return BatchInfo.from_api((await self._call("get batch", "GET", f"batches/{batch_id}")).json())

    async def batches(self, *, page: int = 100) -> list[BatchInfo]:
        """Every batch of the account, newest first (to adopt one a killed run created but never journaled)."""
        out: list[BatchInfo] = []
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page, **({"after": after} if after else {})}
            d = (await self._call("list batches", "GET", "batches", params=params)).json()
            out += [BatchInfo.from_api(b) for b in d.get("data") or []]
            if not d.get("has_more") or not d.get("data"):
                return out
            after = d.get("last_id") or out[-1].id

    async def cancel(self, batch_id: str) -> BatchInfo:
        return BatchInfo.from_api((await self._call("cancel batch", "POST", f"batches/{batch_id}/cancel")).json())

    async def results(self, file_id: str) -> list[LineResult]:
        """An output or error file's lines."""
        resp = await self._call("download results", "GET", f"files/{file_id}/content")
        out = []
        for n, raw in enumerate(resp.text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                out.append(LineResult.from_line(json.loads(raw)))
            except (ValueError, TypeError, AttributeError) as e:
                raise BatchApiError("download results", None, f"file {file_id} line {n} is not a result line: "
                                    f"{e}") from None
        return out

    async def balance(self) -> float:
        """`GET /users/me/balance` → the available balance (USD)."""
        d = (await self._call("balance", "GET", "users/me/balance")).json()
        return float((d.get("data") or {})["available_balance"])


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error") or {}
        return str(err.get("message") if isinstance(err, dict) else err)[:300]
    except ValueError:
        return resp.text[:300]
