"""Fault classes: one seeded draw per request, and the error bodies the real service sends."""
from __future__ import annotations

import random
from typing import Any

from .config import FAULT_CLASSES

# Faults answered before any generation, as an HTTP error status (also for streaming requests).
HTTP_FAULTS = {
    "rate_limit": 429, "upstream_rate_limit": 429, "budget": 402, "bad_gateway": 502,
    "unavailable": 503, "timeout": 408,
}


def draw_fault(rng: random.Random, rates: dict[str, float]) -> str | None:
    """At most one class per request: walk the cumulative rates with one uniform draw."""
    u = rng.random()
    for name in FAULT_CLASSES:
        rate = rates.get(name, 0.0)
        if u < rate:
            return name
        u -= rate
    return None


def error_body(code: int, message: str, metadata: dict[str, Any] | None = None) -> dict:
    """OpenRouter's error shape."""
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    return {"error": err}


def upstream_error(code: int, provider: str, raw: str) -> dict:
    """An error passed through from the provider: OpenRouter wraps it as "Provider returned error"."""
    return error_body(code, "Provider returned error", {"raw": raw, "provider_name": provider})


def http_fault_body(name: str, provider: str, model: str) -> dict:
    """The body of a fault answered as an HTTP error status."""
    if name == "rate_limit":
        return error_body(429, f"Rate limit exceeded: {model}. Please retry shortly.",
                          {"headers": {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0"}})
    if name == "upstream_rate_limit":
        return upstream_error(429, provider, f"{model} is temporarily rate-limited upstream. "
                                             "Please retry shortly.")
    if name == "budget":
        return error_body(402, "Your in-flight requests have reserved all of your credits. "
                               "Retry after some of them complete.", {"retryable": True})
    if name == "bad_gateway":
        return upstream_error(502, provider, '{"error":"upstream connect error or disconnect/reset before headers"}')
    if name == "unavailable":
        return error_body(503, "Service temporarily unavailable", {"provider_name": provider})
    if name == "timeout":
        return error_body(408, "Request timed out. Please retry.", {"provider_name": provider})
    raise ValueError(name)
