"""What OpenRouter's `provider` object accepts (its provider-routing docs), checked before the first request (pure):
an unknown field or value is a 400 for every request, a name that is no endpoint of the model routes nowhere. Also
where in a routing file's YAML a field stands, so the error names its line."""
from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import yaml

from .precision import PRECISION_RANK


class Listed(Protocol):
    """An endpoint the decision lists (catalog.Endpoint, routing.Exclusion): what `only`/`order`/`ignore` name."""

    @property
    def provider(self) -> str: ...
    @property
    def tag(self) -> str: ...


class Excluded(Listed, Protocol):
    @property
    def reason(self) -> str: ...


SORTS = ("price", "throughput", "latency")
PROVIDER_FIELDS = ("order", "only", "ignore", "allow_fallbacks", "require_parameters", "data_collection", "zdr",
                   "enforce_distillable_text", "quantizations", "sort", "max_price", "preferred_min_throughput",
                   "preferred_max_latency")
MAX_PRICE_FIELDS = ("prompt", "completion", "request", "image", "audio")
FLAGS = ("allow_fallbacks", "require_parameters", "zdr", "enforce_distillable_text")
PERCENTILES = ("p50", "p75", "p90", "p99")


def _named(name: str, endpoint: Listed) -> bool:
    """Whether `name` (in only, order, ignore) names the endpoint: its provider's display name, its slug, or its
    tag (`deepinfra/int4`), case-insensitively, as OpenRouter matches them."""
    n, tag = name.strip().lower(), endpoint.tag.lower()
    return n in (endpoint.provider.lower(), tag, tag.split("/")[0])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _one_of(value: Any, allowed: Sequence[str]) -> str:
    return f"{value!r} is not one of {', '.join(allowed)}"


def provider_problem(provider: Mapping[str, Any], eligible: Sequence[Listed], excluded: Sequence[Excluded] = (),
                     model: str = "the model") -> tuple[str, str] | None:
    """The first mistake of a provider object as (its field, what is wrong), or None (pure). OpenRouter refuses an
    unknown field or value with a 400 for every request, and a provider name that is no endpoint of the model routes
    nowhere (`only`) or does nothing (`ignore`), so each is refused before the first request instead. Names are
    checked against the endpoints the decision lists (eligible or excluded), when it lists any."""
    listed: list[Listed] = [*eligible, *excluded]
    for key, value in provider.items():
        if key not in PROVIDER_FIELDS:
            close = difflib.get_close_matches(str(key), PROVIDER_FIELDS, n=1)
            return str(key), ("not a field of OpenRouter's provider object" + (f"; did you mean {close[0]!r}?" if close
                              else f" ({', '.join(PROVIDER_FIELDS)})"))
        if key in ("only", "order", "ignore"):
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                return key, "must be a list of provider slugs (e.g. [deepinfra, moonshotai])"
            for i, name in enumerate(value):
                if listed and not any(_named(name, e) for e in listed):
                    names = ", ".join(sorted({e.provider for e in listed}))
                    return f"{key}[{i}]", f"{name!r} is no endpoint of {model} (the decision lists {names})"
        elif key == "sort":
            by = value.get("by") if isinstance(value, dict) else value
            if by not in SORTS:
                return ("sort.by" if isinstance(value, dict) else "sort"), _one_of(by, SORTS)
        elif key == "quantizations":
            if not isinstance(value, list):
                return key, "must be a list of quantizations (e.g. [int4, fp8])"
            for i, q in enumerate(value):
                if not isinstance(q, str) or (q.lower() not in PRECISION_RANK and q.lower() != "unknown"):
                    return f"{key}[{i}]", (f"{q!r} is not a quantization OpenRouter lists "
                                           f"({', '.join([*PRECISION_RANK, 'unknown'])})")
        elif key in FLAGS:
            if not isinstance(value, bool):
                return key, f"must be true or false, got {value!r}"
        elif key == "data_collection":
            if value not in ("allow", "deny"):
                return key, _one_of(value, ("allow", "deny"))
        elif key == "max_price":
            if not isinstance(value, dict):
                return key, "must be a mapping of USD per million tokens (prompt, completion, …)"
            for k, v in value.items():
                if k not in MAX_PRICE_FIELDS:
                    return f"{key}.{k}", f"not a field of max_price ({', '.join(MAX_PRICE_FIELDS)})"
                if not _number(v):
                    return f"{key}.{k}", f"must be a number >= 0, got {v!r}"
        elif key in ("preferred_min_throughput", "preferred_max_latency"):
            spread = value if isinstance(value, dict) else {"": value}
            for k, v in spread.items():
                if (k and k not in PERCENTILES) or not _number(v):
                    return key, f"must be a number >= 0 or a mapping of {', '.join(PERCENTILES)} to numbers"
    if listed and eligible:
        left = [e for e in eligible if not any(_named(n, e) for n in provider.get("ignore") or ())]
        if provider.get("only"):
            left = [e for e in left if any(_named(n, e) for n in provider["only"])]
        if not left:
            out = [f"{x.tag} is excluded: {x.reason}" for x in excluded if any(_named(n, x) for n in
                                                                               provider.get("only") or ())]
            return ("only" if provider.get("only") else "ignore"), (
                "leaves no eligible endpoint" + (f" ({'; '.join(out)})" if out else "") + ": every request would "
                "find none")
    return None


def yaml_line(text: str, keys: Sequence[str | int]) -> int | None:
    """The line (1-based) of a YAML document's node at `keys` (mapping keys, list indices), or of the deepest one
    found on the way; None when the text does not compose."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in keys:
        if isinstance(node, yaml.MappingNode) and isinstance(key, str):
            found = next(((k, v) for k, v in node.value if k.value == key), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


def field_path(field_name: str) -> list[str | int]:
    """`only[0]` / `max_price.completion` → the keys to its YAML node under `provider`."""
    keys: list[str | int] = ["provider"]
    for part in field_name.split("."):
        name, _, index = part.partition("[")
        keys.append(name)
        if index:
            keys.append(int(index.rstrip("]")))
    return keys
