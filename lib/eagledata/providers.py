"""Provider research: the model's endpoint catalog, the precision policy, and the routing decision.

The decision follows the data, not a hard-coded list: an endpoint quantized below the model's native
precision is excluded because its listing says so, so a new fp4 provider is excluded with no code change.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Literal

import yaml

from .aio import run_sync
from .api import APIError, get_json, make_client, resolve_api_key
from .errors import InputError
from .files import atomic_write_text

# Native precision per model family (Kimi K2.x ship as INT4 from quantization-aware training).
NATIVE_PRECISION = {"moonshotai/kimi-k2.5": "int4", "moonshotai/kimi-k2.6": "int4",
                    "moonshotai/kimi-k2-thinking": "int4"}
# Precision order: higher is closer to full precision. Formats of the same width as the native one
# but another encoding (fp4 vs int4 QAT) are a lossy re-quantization, hence below it.
PRECISION_RANK: dict[str, float] = {
    "int2": 0, "int3": 0.5, "fp4": 1, "nvfp4": 1, "mxfp4": 1, "int4": 2, "fp6": 2.5, "int8": 3, "fp8": 3,
    "fp16": 4, "bf16": 4, "fp32": 5,
}
DOWN_STATUS = -2  # OpenRouter endpoint status: 0 ok, negative degraded; at or below this we call it down
REASONING_PARAMS = {"reasoning", "include_reasoning"}


def routing_name(model: str) -> str:
    """`moonshotai/kimi-k2.5` → `kimi-k2.5`: the file name under params/routing/."""
    return model.rstrip("/").split("/")[-1].split(":")[0]


# -- catalog ------------------------------------------------------------------------------------
def _num(x: Any) -> float | None:
    """A number from a number, a numeric string, or a percentile object (its p50)."""
    if isinstance(x, dict):
        x = x.get("p50")
    try:
        value = None if x is None or x == "" else float(x)
    except (TypeError, ValueError):
        return None
    return None if value is None or math.isnan(value) else value


def normalize_endpoint(raw: dict) -> dict[str, Any]:
    """One endpoint listing as a flat row; prices in $ per million tokens; problems noted, not raised."""
    pricing = raw.get("pricing") or {}
    prompt, completion = _num(pricing.get("prompt")), _num(pricing.get("completion"))
    params = list(raw.get("supported_parameters") or [])
    notes = []
    if prompt is None or completion is None:
        notes.append("price missing")
    provider = raw.get("provider_name") or raw.get("name") or "?"
    return {
        "provider": provider,
        "tag": raw.get("tag") or str(provider).lower().replace(" ", "-"),
        "quantization": (raw.get("quantization") or "unknown").lower(),
        # $/token strings → $/M, rounded so 0.0000022 is 2.2 exactly (max_price compares against it)
        "prompt_per_m": None if prompt is None else round(prompt * 1e6, 9),
        "completion_per_m": None if completion is None else round(completion * 1e6, 9),
        "context_length": raw.get("context_length"),
        "max_completion_tokens": raw.get("max_completion_tokens"),
        "status": int(_num(raw.get("status")) or 0),
        "uptime_30m": _num(raw.get("uptime_last_30m")),
        "latency_s": _num(raw.get("latency_last_30m")),
        "throughput_tps": _num(raw.get("throughput_last_30m")),
        "supports_reasoning": bool(REASONING_PARAMS & set(params)),
        "supported_parameters": params,
        "notes": "; ".join(notes),
    }


@dataclass
class Catalog:
    """The endpoint listing of one model as fetched (raw), so a snapshot re-runs offline exactly."""

    model: str
    source: str
    fetched_at: str
    endpoints: list[dict]
    model_info: dict = field(default_factory=dict)

    def table(self):
        import pandas as pd

        return pd.DataFrame([normalize_endpoint(e) for e in self.endpoints])

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1, ensure_ascii=False))
        return path

    @classmethod
    def load(cls, path: str | Path, model: str | None = None) -> "Catalog":
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
    """GET /models/{author}/{slug}/endpoints (and the /models entry); unknown model → InputError."""
    if model.count("/") != 1:
        raise InputError("model must look like 'author/slug', e.g. moonshotai/kimi-k2.5", field="model")
    async with make_client(base_url, resolve_api_key(base_url, api_key_env)) as client:
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
        return Catalog(model, base_url, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       list(data.get("endpoints") or []), info)


def fetch_catalog(base_url: str, model: str, api_key_env: str = "OPENROUTER_API_KEY") -> Catalog:
    return run_sync(fetch_catalog_async(base_url, model, api_key_env), "fetch_catalog_async")


# -- precision policy (pure) --------------------------------------------------------------------
def precision_rank(quantization: str, ranks: dict[str, float] = PRECISION_RANK) -> float | None:
    """Rank of a format; an unlisted one is ranked by its bit width; None when it cannot be told."""
    q = quantization.lower()
    if q in ranks:
        return ranks[q]
    m = re.search(r"(\d+)", q)
    if not m:
        return None
    bits = int(m.group(1))
    same_width = [r for name, r in ranks.items() if re.search(r"(\d+)", name) and
                  int(re.search(r"(\d+)", name).group(1)) == bits]
    return min(same_width) if same_width else (0.0 if bits < 4 else None)


@dataclass
class PrecisionPolicy:
    native: str = "int4"
    unknown: Literal["keep", "exclude"] = "keep"
    require_reasoning: bool = True
    ranks: dict[str, float] = field(default_factory=lambda: dict(PRECISION_RANK))

    def __post_init__(self) -> None:
        if self.native.lower() not in self.ranks:
            raise InputError(f"unknown native precision {self.native!r}; one of {sorted(self.ranks)}",
                             field="native_precision")
        if self.unknown not in ("keep", "exclude"):
            raise InputError("must be 'keep' or 'exclude'", field="unknown_policy")

    @classmethod
    def for_model(cls, model: str, native: str | None = None, **kw: Any) -> "PrecisionPolicy":
        native = native or NATIVE_PRECISION.get(model.lower().split(":")[0])
        if native is None:
            raise InputError(f"native precision of {model!r} is not known; pass native_precision",
                             field="native_precision")
        return cls(native=native, **kw)

    def allowed_quantizations(self) -> list[str]:
        """The `provider.quantizations` allow-list: native and above, plus unknown when kept."""
        floor = self.ranks[self.native.lower()]
        allowed = sorted((q for q, r in self.ranks.items() if r >= floor), key=lambda q: (self.ranks[q], q))
        return allowed + (["unknown"] if self.unknown == "keep" else [])

    def judge(self, row: dict) -> tuple[str | None, str | None]:
        """(exclusion reasons or None, flag or None) for one normalized endpoint row."""
        q = row["quantization"]
        rank = None if q == "unknown" else precision_rank(q, self.ranks)
        reasons, flag = [], None
        if row["status"] <= DOWN_STATUS:
            reasons.append(f"down (status {row['status']})")
        elif row["status"] < 0:
            flag = f"degraded (status {row['status']})"
        if self.require_reasoning and not row["supports_reasoning"]:
            reasons.append("does not support reasoning")
        if rank is None and self.unknown == "exclude":
            reasons.append(f"quantization {q!r} not known (unknown_policy=exclude)")
        elif rank is None:
            flag = f"quantization {q!r} not known, kept by unknown_policy=keep"
        elif rank < self.ranks[self.native.lower()]:
            reasons.append(f"quantized below native {self.native} ({q})")
        return ("; ".join(reasons) or None), flag


@dataclass
class Exclusion:
    provider: str
    tag: str
    quantization: str
    reason: str


@dataclass
class RoutingDecision:
    """What generate sends as `provider`, and why each endpoint was left out."""

    model: str
    provider: dict[str, Any]
    excluded: list[Exclusion]
    flagged: list[dict[str, str]]
    eligible: list[dict[str, Any]]
    native_precision: str
    unknown_policy: str
    source: str = ""
    decided_at: str = ""

    @property
    def eligible_providers(self) -> list[str]:
        return [e["provider"] for e in self.eligible]

    def max_price_per_m(self) -> tuple[float, float] | None:
        """Worst-case ($/M prompt, $/M completion) a request can cost: what a budget must reserve."""
        cap = self.provider.get("max_price")
        if cap:
            return float(cap["prompt"]), float(cap["completion"])
        priced = [e for e in self.eligible if e.get("prompt_per_m") is not None and e.get("completion_per_m") is not None]
        if not priced:
            return None
        return max(e["prompt_per_m"] for e in priced), max(e["completion_per_m"] for e in priced)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "decided_at": self.decided_at, "source": self.source,
                "native_precision": self.native_precision, "unknown_policy": self.unknown_policy,
                "provider": self.provider, "excluded": [asdict(e) for e in self.excluded],
                "flagged": self.flagged, "eligible": self.eligible}

    def save(self, params_dir: str | Path = "params") -> Path:
        return atomic_write_text(routing_path(self.model, params_dir),
                                 "# Written by providers.ipynb. `provider` is sent as is with every request.\n"
                                 + yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True))

    @classmethod
    def load(cls, path: str | Path) -> "RoutingDecision":
        path = Path(path)
        try:
            d = yaml.safe_load(path.read_text())
            return cls(d["model"], dict(d["provider"]), [Exclusion(**e) for e in d.get("excluded") or []],
                       list(d.get("flagged") or []), list(d.get("eligible") or []), d.get("native_precision", ""),
                       d.get("unknown_policy", ""), d.get("source", ""), d.get("decided_at", ""))
        except OSError as e:
            raise InputError(f"cannot read routing decision: {e.strerror}", path) from None
        except yaml.YAMLError as e:
            raise InputError(f"not valid YAML: {e}", path) from None
        except (KeyError, TypeError) as e:
            raise InputError("routing decision lacks a field", path, field=str(e).strip("'")) from None


def routing_path(model: str, params_dir: str | Path = "params") -> Path:
    return Path(params_dir) / "routing" / f"{routing_name(model)}.yaml"


def decide(model: str, rows: Iterable[dict], policy: PrecisionPolicy, *, source: str = "") -> RoutingDecision:
    """Apply the policy to normalized endpoint rows (pure): the provider object and the reasons."""
    excluded, flagged, eligible = [], [], []
    for row in rows:
        reason, flag = policy.judge(row)
        if reason:
            excluded.append(Exclusion(row["provider"], row["tag"], row["quantization"], reason))
            continue
        if flag:
            flagged.append({"provider": row["provider"], "note": flag})
        if row.get("notes"):
            flagged.append({"provider": row["provider"], "note": row["notes"]})
        eligible.append({"provider": row["provider"], "tag": row["tag"], "quantization": row["quantization"],
                         "prompt_per_m": _num(row["prompt_per_m"]), "completion_per_m": _num(row["completion_per_m"])})
    provider: dict[str, Any] = {}
    if excluded:
        provider["ignore"] = sorted({e.tag for e in excluded})
    provider["quantizations"] = policy.allowed_quantizations()
    provider["sort"] = "price"
    provider["allow_fallbacks"] = True
    priced = [e for e in eligible if e["prompt_per_m"] is not None and e["completion_per_m"] is not None]
    if priced and len(priced) == len(eligible):
        # Server-side guarantee that no pricier endpoint serves us: the budget reserves at these prices.
        provider["max_price"] = {"prompt": max(e["prompt_per_m"] for e in priced),
                                 "completion": max(e["completion_per_m"] for e in priced)}
    return RoutingDecision(model, provider, excluded, flagged, eligible, policy.native, policy.unknown, source,
                           datetime.now(timezone.utc).isoformat(timespec="seconds"))


# -- pricing ------------------------------------------------------------------------------------
def workload_costs(table, decision: RoutingDecision, prompt_tokens: float, output_tokens: float):
    """Cost of a planned workload on every priced endpoint, eligible or not, cheapest first."""
    df = table.dropna(subset=["prompt_per_m", "completion_per_m"]).copy()
    excluded = {e.tag for e in decision.excluded}
    df["eligible"] = ~df["tag"].isin(excluded)
    df["input_usd"] = df["prompt_per_m"] * prompt_tokens / 1e6
    df["output_usd"] = df["completion_per_m"] * output_tokens / 1e6
    df["total_usd"] = df["input_usd"] + df["output_usd"]
    cols = ["provider", "quantization", "eligible", "prompt_per_m", "completion_per_m", "input_usd", "output_usd",
            "total_usd"]
    return df.sort_values("total_usd", ignore_index=True)[cols]


@dataclass
class PriceSummary:
    cheapest_eligible: str
    cheapest_eligible_usd: float
    cheapest_eligible_completion_per_m: float
    cheapest_any: str
    cheapest_any_usd: float
    premium_usd: float  # what excluding below-native endpoints costs on this workload

    @property
    def premium_pct(self) -> float:
        return 100 * self.premium_usd / self.cheapest_any_usd if self.cheapest_any_usd else 0.0


def price_summary(costs) -> PriceSummary:
    eligible = costs[costs["eligible"]]
    if eligible.empty:
        raise InputError("no eligible endpoint has a price", field="pricing")
    best, any_best = eligible.iloc[0], costs.iloc[0]
    return PriceSummary(best["provider"], float(best["total_usd"]), float(best["completion_per_m"]),
                        any_best["provider"], float(any_best["total_usd"]),
                        float(best["total_usd"] - any_best["total_usd"]))


def plot_providers(table, decision: RoutingDecision):
    """Price vs uptime and vs throughput, coloured by quantization; excluded endpoints hollow."""
    import matplotlib.pyplot as plt

    excluded = {e.tag for e in decision.excluded}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    quants = sorted(table["quantization"].unique())
    colors = {q: plt.cm.tab10(i % 10) for i, q in enumerate(quants)}
    for ax, col, label in [(axes[0], "uptime_30m", "uptime last 30 min (%)"),
                           (axes[1], "throughput_tps", "throughput (tokens/s)")]:
        for _, row in table.iterrows():
            if row["completion_per_m"] is None or row[col] is None:
                continue
            out = row["tag"] in excluded
            ax.scatter(row[col], row["completion_per_m"], s=70, edgecolors=colors[row["quantization"]],
                       facecolors="none" if out else colors[row["quantization"]], linewidths=2)
            ax.annotate(row["provider"], (row[col], row["completion_per_m"]), fontsize=8,
                        xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("completion price ($/M tokens)")
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[q], label=q) for q in quants]
    axes[1].legend(handles=handles, title="quantization (hollow = excluded)", fontsize=8)
    fig.tight_layout()
    return fig
