"""The precision policy and the routing decision: which endpoints may serve the model, and why the others
may not. The decision follows the listing, not a hard-coded list: an endpoint quantized below the model's
native precision is excluded because its listing says so, so a new fp4 provider is excluded with no code change.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from ..errors import InputError
from ..files import atomic_write_text
from ..paths import PARAMS_DIR, routing_file
from .catalog import Catalog, Endpoint, Price, cheapest, fetch_catalog_async, worst_price
from .precision import PRECISION_RANK, precision_rank
from .provider_object import field_path, provider_problem, yaml_line

# Native precision per model family (Kimi K2.x ship as INT4 from quantization-aware training).
NATIVE_PRECISION = {"moonshotai/kimi-k2.5": "int4", "moonshotai/kimi-k2.6": "int4",
                    "moonshotai/kimi-k2-thinking": "int4"}
DOWN_STATUS = -2  # OpenRouter endpoint status: 0 ok, negative degraded; at or below this we call it down
# What the routing file keeps of each eligible endpoint (its limits: what max_tokens is checked against).
# Whether it cancels: what a stop at a target or a Ctrl-C can save there (issue 42).
ELIGIBLE_FIELDS = ("provider", "tag", "quantization", "prompt_per_m", "completion_per_m", "context_length",
                   "max_completion_tokens", "stream_cancellation", "cancellation_source")
log = logging.getLogger("eagledata.routing")


NO_REASONING = "does not support reasoning"
# Where require_tools bites, its reason says so: a request with tools goes only to endpoints that take them anyway.
NO_TOOLS = "does not support tools (require_tools=True, needed only by datasets that declare tools)"


# -- precision policy (pure) --------------------------------------------------------------------
@dataclass
class PrecisionPolicy:
    native: str = "int4"
    unknown: Literal["keep", "exclude"] = "keep"
    require_reasoning: bool = True
    require_tools: bool = True
    ranks: dict[str, float] = field(default_factory=lambda: dict(PRECISION_RANK))

    def __post_init__(self) -> None:
        if self.native.lower() not in self.ranks:
            raise InputError(f"unknown native precision {self.native!r}; one of {sorted(self.ranks)}",
                             field="native_precision")
        if self.unknown not in ("keep", "exclude"):
            raise InputError("must be 'keep' or 'exclude'", field="unknown_policy")

    @classmethod
    def for_model(cls, model: str, native: str | None = None, **kw: Any) -> PrecisionPolicy:
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

    def judge(self, endpoint: Endpoint) -> tuple[str | None, str | None]:
        """(exclusion reasons or None, flag or None) for one endpoint."""
        q, status = endpoint.quantization, endpoint.status
        rank = None if q == "unknown" else precision_rank(q, self.ranks)
        reasons, flag = [], None
        if status <= DOWN_STATUS:
            reasons.append(f"down (status {status})")
        elif status < 0:
            flag = f"degraded (status {status})"
        if self.require_reasoning and not endpoint.supports_reasoning:
            reasons.append(NO_REASONING)
        if self.require_tools and not endpoint.supports_tools:
            reasons.append(NO_TOOLS)
        if rank is None and self.unknown == "exclude":
            reasons.append(f"quantization {q!r} not known (unknown_policy=exclude)")
        elif rank is None:
            flag = f"quantization {q!r} not known, kept by unknown_policy=keep"
        elif rank < self.ranks[self.native.lower()]:
            reasons.append(f"quantized below native {self.native} ({q})")
        return ("; ".join(reasons) or None), flag


# -- the decision -------------------------------------------------------------------------------
@dataclass
class Exclusion:
    provider: str
    tag: str
    quantization: str
    reason: str


# Each rule of `PrecisionPolicy.judge`, for the message when it leaves nothing: (is this reason its, what it
# says of one endpoint, of several, the setting behind it and the way out).
_RULES: list[tuple[Callable[[str], bool], str, str, str]] = [
    (lambda r: r == NO_TOOLS, "does not list `tools` among its supported parameters",
     "do not list `tools` among their supported parameters",
     "require_tools=True: only datasets that declare tools need them, and OpenRouter sends a request with tools "
     "only to endpoints that take them: set require_tools=False for a run without tools"),
    (lambda r: r == NO_REASONING, "does not list `reasoning` or `include_reasoning` among its supported parameters",
     "do not list `reasoning` or `include_reasoning` among their supported parameters",
     "require_reasoning=True: answers without reasoning are not the model's training data"),
    (lambda r: r.startswith("quantization ") and r.endswith("(unknown_policy=exclude)"),
     "has an unknown quantization", "have an unknown quantization",
     "unknown_policy=exclude; keep takes such endpoints, flagged"),
    (lambda r: r.startswith("quantized below native "), "is quantized below the native {native}",
     "are quantized below the native {native}", "the precision policy: not the model as released"),
    (lambda r: r.startswith("down (status "), "is down", "are down",
     f"status {DOWN_STATUS} or below; no setting changes it, try later"),
]


def nothing_eligible(decision: RoutingDecision, path: str | Path) -> InputError:
    """Why `decision` leaves no endpoint to route to, rule by rule with the setting behind each: the error of
    writing it to `path` (its provider object would ignore every endpoint, and every request would find none)."""
    listed = len(decision.excluded)
    written = f"no routing decision was written to {path}" + (
        " (the one already there is left as it was: generate and budget would still read it)"
        if Path(path).is_file() else "")
    if not listed:
        return InputError(f"the listing ({decision.source or 'no source'}) has no endpoint of {decision.model}, so "
                          f"there is nothing to route to and {written}")
    groups: dict[int | str, list[str]] = {}  # a rule's index, or a reason of no known rule (given as it is)
    for x in decision.excluded:
        for reason in x.reason.split("; "):
            rule = next((i for i, r in enumerate(_RULES) if r[0](reason)), None)
            groups.setdefault(reason if rule is None else rule, []).append(x.provider)
    parts = []
    order = sorted(groups.items(), key=lambda kv: (-len(kv[1]), isinstance(kv[0], str), str(kv[0])))
    for n, (key, who) in enumerate(order):
        count = f"{len(who)} endpoint{'s' if len(who) > 1 else ''}" if n == 0 else str(len(who))
        if isinstance(key, str):
            parts.append(f"{count} ({', '.join(who)}): {key}")
            continue
        _, one, several, why = _RULES[key]
        says = (one if len(who) == 1 else several).format(native=decision.native_precision)
        parts.append(f"{count} ({', '.join(who)}) {says} ({why})")
    return InputError(f"every endpoint of {decision.model} is excluded ({listed} listed, none eligible), so there "
                      f"is nothing to route to and {written}: " + "; ".join(parts)
                      + ". Each endpoint's reasons are in the exclusion table.")


@dataclass(kw_only=True)
class RoutingDecision:
    """What generate sends as `provider`, and why each endpoint was left out."""

    model: str
    provider: dict[str, Any] = field(default_factory=dict)
    excluded: list[Exclusion] = field(default_factory=list)
    flagged: list[dict[str, str]] = field(default_factory=list)
    eligible: list[Endpoint] = field(default_factory=list)
    native_precision: str = ""
    unknown_policy: str = ""
    source: str = ""
    decided_at: str = ""

    @property
    def eligible_providers(self) -> list[str]:
        return [e.provider for e in self.eligible]

    def worst_price(self) -> Price | None:
        """What a request can cost at most per token: the `max_price` the server enforces, else the
        priciest eligible endpoint. This is what a budget must hold for a request."""
        cap = self.provider.get("max_price")
        if cap:
            return Price(float(cap["prompt"]), float(cap["completion"]))
        return worst_price(self.eligible)

    def cheapest(self) -> Endpoint | None:
        return cheapest(self.eligible)

    def check_max_tokens(self, max_tokens: int) -> None:
        """Refuse a `max_tokens` that no eligible endpoint serves, before the first request: OpenRouter routes a
        request only to endpoints that answer that many tokens (`max_completion_tokens`) and whose context holds
        them with the prompt; above every endpoint's, every request would be refused alike. Endpoints it leaves out
        are named (a warning). Limits the decision does not know (an older routing file) are not guessed."""
        out = [e for e in self.eligible if e.max_completion_tokens is not None and max_tokens > e.max_completion_tokens]
        tight = [e for e in self.eligible if e.context_length is not None and max_tokens >= e.context_length]
        if self.eligible and len({*map(id, out), *map(id, tight)}) == len(self.eligible):
            widest = max(tight, key=lambda e: e.context_length or 0) if len(tight) == len(self.eligible) else None
            if widest is not None:
                raise InputError(f"{max_tokens} leaves no room for a prompt in any eligible endpoint's context "
                                 f"({widest.context_length:,} tokens at most, {widest.provider}): lower it",
                                 field="max_tokens")
            most = max(out, key=lambda e: e.max_completion_tokens or 0)
            raise InputError(f"{max_tokens} is more than any eligible endpoint answers (max_completion_tokens: "
                             f"{most.max_completion_tokens:,} at most, {most.provider}); OpenRouter routes a request "
                             "only to endpoints that answer that many tokens: lower it", field="max_tokens")
        left = [f"{e.provider} (max_completion_tokens {e.max_completion_tokens:,})" for e in out] + \
            [f"{e.provider} (context {e.context_length:,})" for e in tight if e not in out]
        if left:
            log.warning("max_tokens %d leaves out %s: OpenRouter routes a request only to endpoints that answer "
                        "that many tokens", max_tokens, ", ".join(left))

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "decided_at": self.decided_at, "source": self.source,
                "native_precision": self.native_precision, "unknown_policy": self.unknown_policy,
                "provider": self.provider, "excluded": [asdict(e) for e in self.excluded],
                "flagged": self.flagged, "eligible": [e.to_dict(*ELIGIBLE_FIELDS) for e in self.eligible]}

    def save(self, params_dir: str | Path = PARAMS_DIR) -> Path:
        return self.write(routing_file(self.model, params_dir))

    def write(self, path: str | Path, by: str = "providers.ipynb") -> Path:
        """The decision as a routing file; one with no eligible endpoint is refused, saying why (`nothing_eligible`)."""
        if not self.eligible:
            raise nothing_eligible(self, path)
        return atomic_write_text(path, f"# Written by {by}. `provider` is sent as is with every request.\n"
                                 + yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True))

    def with_ignored(self, provider: str, reason: str, path: str | Path | None = None) -> RoutingDecision:
        """The decision with every eligible endpoint of `provider` excluded for `reason` (pure).

        `provider` is what a record says served it, i.e. what OpenRouter reports: the listing's display name
        (`provider_name`, e.g. "DeepInfra"), matched case-insensitively; an endpoint tag (`deepinfra/int4`)
        works too. A record does not say which of a provider's endpoints served it, so all of them go; their
        tags join `provider.ignore`, as `decide` writes exclusions. A provider whose endpoints are all excluded
        already is left as it is; one the decision does not list, or one whose exclusion would leave no
        eligible endpoint, is refused (`path`: the file the decision came from, for the message)."""
        name = provider.strip().lower()

        def matches(p: str, tag: str) -> bool:
            return name in (p.lower(), tag.lower())

        hit = [e for e in self.eligible if matches(e.provider, e.tag)]
        if not hit:
            if any(matches(x.provider, x.tag) for x in self.excluded):
                return self
            known = sorted({e.provider for e in self.eligible} | {x.provider for x in self.excluded})
            raise InputError(f"provider {provider!r} is not in the routing decision for {self.model} "
                             f"(it lists {', '.join(known) or 'none'})", path, field="provider")
        rest = [e for e in self.eligible if e not in hit]
        if not rest:
            raise InputError(f"ignoring {provider!r} would leave no eligible endpoint for {self.model}", path,
                             field="provider")
        tags = [e.tag for e in hit]
        return replace(self, provider={**self.provider, "ignore": sorted({*self.provider.get("ignore", []), *tags})},
                       excluded=[*self.excluded, *(Exclusion(e.provider, e.tag, e.quantization, reason) for e in hit)],
                       eligible=rest)

    @classmethod
    def load(cls, path: str | Path) -> RoutingDecision:
        """The decision in a routing file; a provider object OpenRouter would refuse, or one naming a provider the
        file lists no endpoint of, is an InputError naming the file, the line and the field (`provider_problem`)."""
        path = Path(path)
        decision = cls._read(path)
        problem = provider_problem(decision.provider, decision.eligible, decision.excluded, decision.model)
        if problem is not None:
            name, message = problem
            raise InputError(message, path, yaml_line(path.read_text(), field_path(name)),
                             field="provider." + re.sub(r"\[\d+\]", "", name))
        return decision

    @classmethod
    def _read(cls, path: Path) -> RoutingDecision:
        try:
            d = yaml.safe_load(path.read_text())
            return cls(model=d["model"], provider=dict(d["provider"]),
                       excluded=[Exclusion(**e) for e in d.get("excluded") or []],
                       flagged=list(d.get("flagged") or []),
                       eligible=[Endpoint.from_dict(e) for e in d.get("eligible") or []],
                       native_precision=d.get("native_precision", ""), unknown_policy=d.get("unknown_policy", ""),
                       source=d.get("source", ""), decided_at=d.get("decided_at", ""))
        except OSError as e:
            raise InputError(f"cannot read routing decision: {e.strerror}", path) from None
        except yaml.YAMLError as e:
            raise InputError(f"not valid YAML: {e}", path) from None
        except (KeyError, TypeError) as e:
            raise InputError("routing decision lacks a field", path, field=str(e).strip("'")) from None


def decide(model: str, endpoints: Iterable[Endpoint], policy: PrecisionPolicy, *, source: str = "") -> RoutingDecision:
    """Apply the policy to the endpoints (pure): the provider object and the reasons."""
    excluded, flagged, eligible = [], [], []
    for e in endpoints:
        reason, flag = policy.judge(e)
        if reason:
            excluded.append(Exclusion(e.provider, e.tag, e.quantization, reason))
            continue
        if flag:
            flagged.append({"provider": e.provider, "note": flag})
        if e.notes:
            flagged.append({"provider": e.provider, "note": e.notes})
        eligible.append(e)
    provider: dict[str, Any] = {}
    if excluded:
        provider["ignore"] = sorted({e.tag for e in excluded})
    provider["quantizations"] = policy.allowed_quantizations()
    provider["sort"] = "price"
    provider["allow_fallbacks"] = True
    worst = worst_price(eligible)
    if worst is not None and all(e.priced for e in eligible):
        # Server-side guarantee that no pricier endpoint serves us: the budget reserves at these prices.
        provider["max_price"] = {"prompt": worst.prompt_per_m, "completion": worst.completion_per_m}
    return RoutingDecision(model=model, provider=provider, excluded=excluded, flagged=flagged, eligible=eligible,
                           native_precision=policy.native, unknown_policy=policy.unknown, source=source,
                           decided_at=datetime.now(UTC).isoformat(timespec="seconds"))


async def load_routing(model: str, *, params_dir: str | Path = PARAMS_DIR, base_url: str, api_key_env: str,
                       path: str | Path | None = None, snapshot: str | Path | None = None) -> RoutingDecision:
    """The routing decision file (`path`, default `<params_dir>/routing/<model>.yaml`), else a decision made now
    under the default precision policy from a saved listing (`snapshot`) or the live one at `base_url`."""
    path = Path(path) if path is not None else routing_file(model, params_dir)
    if path.is_file():
        return RoutingDecision.load(path)
    catalog = Catalog.load(snapshot, model) if snapshot else await fetch_catalog_async(base_url, model, api_key_env)
    return decide(model, catalog.normalized(), PrecisionPolicy.for_model(model),
                  source=f"derived at run time from {catalog.source}")


# -- acting on the provider fidelity audit ------------------------------------------------------------
class HasExclusions(Protocol):
    """What `ignore_in_routing` takes from an audit (`eagledata.training.audit.AuditReport`): the suspects with
    their evidence. A protocol, so this stage needs no import of the training one."""

    def exclusions(self) -> Mapping[str, str]: ...


def ignore_in_routing(report_or_providers: HasExclusions | Mapping[str, str] | Iterable[str] | str,
                      routing_path: str | Path, *, reason: str | None = None) -> RoutingDecision:
    """Write suspect providers into the routing decision file's `provider.ignore`, each with its reason; the next
    generation run then avoids them. Takes an audit report (its suspects and evidence), {provider: reason}, or
    provider names with one `reason`. The rest of the file is kept; an unknown provider is refused before the
    file is touched (`RoutingDecision.with_ignored`). Returns the decision as written."""
    if hasattr(report_or_providers, "exclusions"):
        reasons = dict(report_or_providers.exclusions())
    elif isinstance(report_or_providers, Mapping):
        reasons = {str(k): str(v) for k, v in report_or_providers.items()}
    else:
        names = [report_or_providers] if isinstance(report_or_providers, str) else list(report_or_providers)
        if reason is None:
            raise InputError("give a reason for ignoring " + ", ".join(map(str, names)), field="reason")
        reasons = {str(n): reason for n in names}
    path = Path(routing_path)
    decision = RoutingDecision.load(path)
    updated = decision
    for provider, why in reasons.items():
        updated = updated.with_ignored(provider, why, path)
    if updated is not decision:
        updated.write(path, by="providers.ipynb, provider.ignore extended by the fidelity audit")
    return updated


# -- what the decision costs ----------------------------------------------------------------------
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


def _label_places(px: float, py: float, w: float, h: float, gap: float, rings: int):
    """(ring, side, box) of every place a w × h label may take beside a point at (px, py), best first: right of
    it, then left, then each ring a step higher or lower (screen pixels)."""
    from matplotlib.transforms import Bbox

    step = 0.6 * h
    for ring in range(rings):
        for side in (1, -1):
            for dy in ((0.0,) if ring == 0 else (ring * step, -ring * step)):
                x0 = px + gap if side > 0 else px - gap - w
                yield ring, side, Bbox.from_extents(x0, py + dy - h / 2, x0 + w, py + dy + h / 2)


def place_labels(ax, points: list[tuple[float, float]], names: list[str], *, fontsize: float = 8,
                 rings: int = 40) -> list:
    """One text per point, none overlapping another label or another point, all inside the axes.

    Each label, top to bottom, takes the first free place of `_label_places`, with a leader line once it is
    away from its point. Deterministic and in screen space: call it once the axes' size and limits are final."""
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    marker = 5 * ax.figure.dpi / 72  # a marker's radius (s=70) in pixels
    screen = [tuple(ax.transData.transform(p)) for p in points]
    taken = [Bbox.from_extents(x - marker, y - marker, x + marker, y + marker) for x, y in screen]

    def free(box: Bbox) -> bool:
        return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1 and \
            not any(box.overlaps(t) for t in taken)

    texts = []
    for (x, y), (px, py), name in sorted(zip(points, screen, names), key=lambda t: (-t[1][1], t[1][0])):
        text = ax.text(x, y, name, fontsize=fontsize, va="center")
        size = text.get_window_extent(renderer)
        places = list(_label_places(px, py, size.width, size.height, 2 * marker, rings))
        ring, side, box = next((p for p in places if free(p[2])), places[0])  # nowhere free: beside the point
        text.set_ha("left" if side > 0 else "right")
        text.set_position(ax.transData.inverted().transform((box.x0 if side > 0 else box.x1, (box.y0 + box.y1) / 2)))
        if ring > 1:
            ax.annotate("", xy=(x, y), xytext=text.get_position(),
                        arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5, "shrinkA": 0, "shrinkB": 4})
        taken.append(box)
        texts.append(text)
    return texts


def plot_providers(table, decision: RoutingDecision):
    """Price vs uptime and vs throughput, coloured by quantization; excluded endpoints hollow. Labels never
    overlap (`place_labels`): several providers sit at nearly the same point (Venice and Together, say)."""
    import matplotlib.pyplot as plt

    excluded = {e.tag for e in decision.excluded}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    quants = sorted(table["quantization"].unique())
    colors = {q: plt.cm.tab10(i % 10) for i, q in enumerate(quants)}
    labels = []
    for ax, col, label in [(axes[0], "uptime_30m", "uptime last 30 min (%)"),
                           (axes[1], "throughput_tps", "throughput (tokens/s)")]:
        points, names = [], []
        for _, row in table.iterrows():
            if row["completion_per_m"] is None or row[col] is None:
                continue
            out = row["tag"] in excluded
            ax.scatter(row[col], row["completion_per_m"], s=70, edgecolors=colors[row["quantization"]],
                       facecolors="none" if out else colors[row["quantization"]], linewidths=2)
            points.append((row[col], row["completion_per_m"]))
            names.append(row["provider"])
        ax.set_xlabel(label)
        ax.set_ylabel("completion price ($/M tokens)")
        ax.margins(x=0.15, y=0.2)  # room for the labels inside the axes
        labels.append((ax, points, names))
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[q], label=q) for q in quants]
    axes[1].legend(handles=handles, title="quantization (hollow = excluded)", fontsize=8)
    fig.tight_layout()
    for ax, points, names in labels:  # once sizes and limits are final: the labels are placed in screen space
        ax.set_xlim(ax.get_xlim())
        ax.set_ylim(ax.get_ylim())
        place_labels(ax, points, names)
    return fig
