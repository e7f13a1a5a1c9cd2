"""The model's endpoint catalog: what OpenRouter lists (provider, quantization, prices, limits, health),
parsed once into `Endpoint` values that the routing policy, the budget and the engine all share."""
from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..aio import run_sync
from ..defaults import EMULATOR, is_emulator
from ..errors import InputError
from ..files import make_dir
from .cancellation import check_overrides, stream_cancellation
from .client import LOCAL_KEY, APIError, get_json, make_client, resolve_api_key

REASONING_PARAMS = {"reasoning", "include_reasoning"}


@dataclass(frozen=True)
class Price:
    """USD per million tokens, as the catalog lists them (per-token strings × 1e6)."""

    prompt_per_m: float
    completion_per_m: float

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """USD for a request (or a workload) of that many tokens."""
        return (prompt_tokens * self.prompt_per_m + completion_tokens * self.completion_per_m) / 1e6


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One provider's endpoint for the model, normalized: prices in $/M, problems noted, never raised."""

    provider: str
    tag: str
    quantization: str = "unknown"
    prompt_per_m: float | None = None
    completion_per_m: float | None = None
    context_length: int | None = None
    max_completion_tokens: int | None = None
    status: int = 0  # OpenRouter: 0 ok, negative degraded or down
    uptime_30m: float | None = None
    latency_s: float | None = None
    throughput_tps: float | None = None
    supports_reasoning: bool = True
    supports_tools: bool = True  # `tools` among its supported parameters: it can serve the agent traffic
    supported_parameters: tuple[str, ...] = ()
    stream_cancellation: bool = False  # closing its stream stops its billing (cancellation.py: the docs, overrides)
    cancellation_source: str = ""      # on what grounds ("" in a routing file older than the field: taken as no)
    notes: str = ""

    @property
    def priced(self) -> bool:
        return self.prompt_per_m is not None and self.completion_per_m is not None

    @property
    def price(self) -> Price:
        if not self.priced:
            raise InputError(f"endpoint {self.provider!r} lists no price", field="pricing")
        return Price(self.prompt_per_m, self.completion_per_m)  # type: ignore[arg-type]

    @classmethod
    def from_listing(cls, raw: dict) -> Endpoint:
        """An entry of `GET /models/{author}/{slug}/endpoints`; whether it cancels comes from OpenRouter's docs,
        which the listing does not repeat (`Catalog.normalized` applies a user's overrides)."""
        pricing = raw.get("pricing") or {}
        prompt, completion = _num(pricing.get("prompt")), _num(pricing.get("completion"))
        params = tuple(raw.get("supported_parameters") or ())
        provider = raw.get("provider_name") or raw.get("name") or "?"
        tag = raw.get("tag") or str(provider).lower().replace(" ", "-")
        cancels, cancellation_source = stream_cancellation(provider, tag)
        return cls(
            provider=provider,
            tag=tag,
            quantization=(raw.get("quantization") or "unknown").lower(),
            # $/token strings → $/M, rounded so 0.0000022 is 2.2 exactly (max_price compares against it)
            prompt_per_m=None if prompt is None else round(prompt * 1e6, 9),
            completion_per_m=None if completion is None else round(completion * 1e6, 9),
            context_length=raw.get("context_length"),
            max_completion_tokens=raw.get("max_completion_tokens"),
            status=int(_num(raw.get("status")) or 0),
            uptime_30m=_num(raw.get("uptime_last_30m")),
            latency_s=_num(raw.get("latency_last_30m")),
            throughput_tps=_num(raw.get("throughput_last_30m")),
            supports_reasoning=bool(REASONING_PARAMS & set(params)),
            supports_tools="tools" in params,
            supported_parameters=params,
            stream_cancellation=cancels,
            cancellation_source=cancellation_source,
            notes="" if prompt is not None and completion is not None else "price missing",
        )

    @classmethod
    def from_dict(cls, d: dict) -> Endpoint:
        """Back from `to_dict` (a routing file keeps a few fields; the rest take their defaults)."""
        known = {f.name for f in fields(cls)}
        kept: dict[str, Any] = {k: tuple(v) if k == "supported_parameters" else v for k, v in d.items() if k in known}
        return cls(**kept)

    def to_dict(self, *names: str) -> dict[str, Any]:
        d = asdict(self)
        d["supported_parameters"] = list(self.supported_parameters)
        return {k: d[k] for k in names} if names else d


def worst_price(endpoints: Iterable[Endpoint]) -> Price | None:
    """The highest prompt and completion prices among priced endpoints: what a request can cost at most."""
    priced = [e for e in endpoints if e.priced]
    if not priced:
        return None
    return Price(max(e.price.prompt_per_m for e in priced), max(e.price.completion_per_m for e in priced))


def cheapest(endpoints: Iterable[Endpoint]) -> Endpoint | None:
    """The priced endpoint with the lowest completion (then prompt) price: where `sort: price` routes."""
    return min((e for e in endpoints if e.priced), key=lambda e: (e.completion_per_m, e.prompt_per_m), default=None)


def _num(x: Any) -> float | None:
    """A number from a number, a numeric string, or a percentile object (its p50)."""
    if isinstance(x, dict):
        x = x.get("p50")
    try:
        value = None if x is None or x == "" else float(x)
    except (TypeError, ValueError):
        return None
    return None if value is None or math.isnan(value) else value


@dataclass
class Catalog:
    """The endpoint listing of one model as fetched (raw), so a snapshot re-runs offline exactly."""

    model: str
    source: str
    fetched_at: str
    endpoints: list[dict]
    model_info: dict = field(default_factory=dict)

    def normalized(self, cancellation_overrides: Mapping[str, bool] | None = None) -> list[Endpoint]:
        """The endpoints; `cancellation_overrides` (provider or tag -> bool) must each name one of them."""
        endpoints = [Endpoint.from_listing(e) for e in self.endpoints]
        if not cancellation_overrides:
            return endpoints
        check_overrides(cancellation_overrides, [n for e in endpoints for n in (e.provider, e.tag)])
        out = []
        for e in endpoints:
            cancels, source = stream_cancellation(e.provider, e.tag, cancellation_overrides)
            out.append(replace(e, stream_cancellation=cancels, cancellation_source=source))
        return out

    def table(self, cancellation_overrides: Mapping[str, bool] | None = None):
        import pandas as pd

        return pd.DataFrame([e.to_dict() for e in self.normalized(cancellation_overrides)])

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        make_dir(path.parent, "output_dir")
        path.write_text(json.dumps(asdict(self), indent=1, ensure_ascii=False))
        return path

    @classmethod
    def load(cls, path: str | Path, model: str | None = None) -> Catalog:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
            cat = cls(d["model"], f"snapshot {path} (from {d.get('source', '?')})", d.get("fetched_at", ""),
                      list(d["endpoints"]), d.get("model_info") or {})
        except OSError as e:
            raise InputError(f"cannot read snapshot: {e.strerror}", path) from None
        except json.JSONDecodeError as e:
            raise InputError(f"snapshot is not valid JSON: {e.msg}", path, e.lineno) from None
        except (KeyError, TypeError) as e:
            raise InputError("snapshot lacks a field", path, field=str(e).strip("'")) from None
        if model and cat.model != model:
            raise InputError(f"snapshot is for {cat.model!r}, not {model!r}", path, field="model")
        return cat


async def fetch_catalog_async(base_url: str, model: str, api_key_env: str = "OPENROUTER_API_KEY") -> Catalog:
    """GET /models/{author}/{slug}/endpoints (and the /models entry); unknown model → InputError. `base_url:
    emulator` reads an emulator's catalog, started for the call (no key sent); the catalog's source says `emulator`."""
    if model.count("/") != 1:
        raise InputError("model must look like 'author/slug', e.g. moonshotai/kimi-k2.5", field="model")
    if is_emulator(base_url):
        from ..emulator_process import serving

        async with serving(base_url) as url:
            got = await _fetch(url, model, LOCAL_KEY)
        return Catalog(got.model, EMULATOR, got.fetched_at, got.endpoints, got.model_info)
    return await _fetch(base_url, model, resolve_api_key(base_url, api_key_env))


async def _fetch(base_url: str, model: str, api_key: str | None) -> Catalog:
    async with make_client(base_url, api_key) as client:
        try:
            data = (await get_json(client, f"models/{model}/endpoints"))["data"]
        except APIError as e:
            if e.status != 404:
                raise
            models = [m.get("id", "") for m in (await get_json(client, "models")).get("data", [])]
            close = difflib.get_close_matches(model, models, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InputError(f"unknown model {model!r} at {base_url}{hint}", field="model") from None
        info = {k: v for k, v in data.items() if k != "endpoints"}
        return Catalog(model, base_url, datetime.now(UTC).isoformat(timespec="seconds"),
                       list(data.get("endpoints") or []), info)


def fetch_catalog(base_url: str, model: str, api_key_env: str = "OPENROUTER_API_KEY") -> Catalog:
    return run_sync(fetch_catalog_async(base_url, model, api_key_env), "fetch_catalog_async")
