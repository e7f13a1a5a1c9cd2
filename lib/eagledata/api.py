"""Thin OpenRouter HTTP plumbing shared by the stages: the key, the client, the error shape."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx

from .errors import InputError

OPENROUTER_URL = "https://openrouter.ai/api/v1"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
LOCAL_KEY = "local-no-key"  # the emulator accepts any non-empty key


def is_local(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in LOCAL_HOSTS


def resolve_api_key(base_url: str, api_key_env: str = "OPENROUTER_API_KEY") -> str:
    """The key from the environment only; a local server (the emulator) needs none."""
    key = os.environ.get(api_key_env, "")
    if key:
        return key
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


def make_client(base_url: str, api_key: str, *, concurrency: int = 16, timeout: float = 60.0) -> httpx.AsyncClient:
    """A client whose pool fits the concurrency; the key lives only in its headers."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", limits=limits,
                             timeout=httpx.Timeout(timeout, connect=30.0),
                             headers={"Authorization": f"Bearer {api_key}",
                                      "HTTP-Referer": "https://github.com/eagledata", "X-Title": "eagledata"})


async def get_json(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    resp = await client.get(path.lstrip("/"), params=params or None)
    if resp.status_code != 200:
        raise error_from_response(resp)
    return resp.json()
