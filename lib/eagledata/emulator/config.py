"""Emulator configuration: a YAML/JSON mapping validated into dataclasses, errors naming the field."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from .catalog import QUIRKS, TOOL_CALL_IDS, Endpoint, default_endpoints
from .faults import FAULT_CLASSES
from .toolcalls import SLIPS, CallStyle


@dataclass
class Faults:
    """Per-class probabilities (one draw per request, classes: `faults.FAULTS`), seeded by the config seed."""

    rates: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FAULT_CLASSES, 0.0))
    retry_after: int = 1  # seconds, in Retry-After headers
    slow_seconds: float = 30.0  # extra delay of a "slow" response (not scaled by speed)


@dataclass
class ContentDist:
    """What the model writes: lognormal lengths in tokens (reasoning often thousands, content hundreds), and how
    often its answer quotes its own closing tag."""

    reasoning_median: float = 1500.0
    reasoning_sigma: float = 0.8
    content_median: float = 300.0
    content_sigma: float = 0.7
    max_total: int = 32_000  # cap on a natural (unconstrained) answer
    # The share of answers whose content holds a literal `</think>` as text (the model writing about its own tags):
    # the model's text, so every provider serves it, whatever its quirks. 0 draws nothing (seeded runs unchanged).
    literal_close: float = 0.0


@dataclass
class BatchConfig:
    """Moonshot's Batch API (`batch.py`, under /moonshot/v1): its account, limits, pace and faults. Every duration
    is the real service's seconds, multiplied by the config's `speed` like every other delay."""

    balance: float = 100.0  # USD on the Moonshot account (apart from the OpenRouter credits)
    prompt_price: float = 0.36  # USD per million prompt tokens: 40 % off the $0.60 realtime price
    completion_price: float = 1.80  # USD per million completion tokens: 40 % off $3.00
    max_file_bytes: int = 100 * 1024 * 1024  # an upload's size limit (100 MB)
    max_files: int = 1000  # uploaded batch files the organization may hold
    models: list[str] = field(default_factory=lambda: ["kimi-k2.5", "kimi-k2.6"])  # what the Batch API serves
    validating_s: float = 30.0  # validating, before in_progress (or failed)
    queue_s: float = 600.0  # in_progress before the first line is answered
    lines_per_s: float = 2.0  # each batch's pace through its lines
    finalizing_s: float = 30.0  # finalizing, before completed
    cancel_s: float = 30.0  # cancelling, before cancelled
    line_error_rate: float = 0.0  # share of lines answered with a 500 body (the error file)
    expire_rate: float = 0.0  # share of batches that stall part-way and expire at their window's end


BATCH_KEYS = {f.name for f in fields(BatchConfig)}


@dataclass
class EmulatorConfig:
    seed: int = 0
    api_key: str | None = None  # when set, only this Bearer key is accepted
    balance: float = 100.0  # USD of credits
    key_limit: float | None = None  # /key limit; None → the balance
    credits_forbidden: bool = False  # /credits answers 403 as for a non-management key
    speed: float = 1.0  # multiplies every delay; 0 = no delay
    model: str = "moonshotai/kimi-k2.5"
    model_version: str = "moonshotai/kimi-k2.5-0127"
    model_name: str = "MoonshotAI: Kimi K2.5"
    tokenizer: str | None = None  # directory; None → $EAGLEDATA_TOKENIZER_DIR, else the bundled Kimi K2.5 files
    generation_delay: float = 0.5  # seconds /generation answers 404 after completion (not scaled)
    processing_interval: float = 1.0  # seconds between ": OPENROUTER PROCESSING" comments
    ground_truth_file: str | None = None  # JSONL to append ground truth to
    record_prompt_ids: bool = False
    # {code, message}: every chat request is answered with this error, as a provider rule the listing cannot show
    # (a deployment that takes no temperature above 1, say) makes the service refuse every request alike
    reject: dict[str, Any] | None = None
    content: ContentDist = field(default_factory=ContentDist)
    faults: Faults = field(default_factory=Faults)
    endpoints: list[Endpoint] = field(default_factory=default_endpoints)
    # Prompt files whose agent conversations the model regenerates: at each tool round it calls what the dataset's
    # answer called with this chance, else its own plan (toolcalls.py). 0.8 is a guess at how often a model repeats
    # another agent's tool choice for the same task and results, not a measurement; 0 gives the plan alone.
    tool_datasets: list[str] = field(default_factory=list)
    tool_follow_rate: float = 0.8
    # How its calls read beyond the plan (toolcalls.CallStyle): arguments from the conversation and earlier results,
    # slips (unknown names, bad JSON, a required argument missing, a wrong type). Off by default (seeded runs as
    # before); the agentic demo and the rollout tests set it: `{context_share: 0.7, slips: {unknown_name: 0.02, ...}}`.
    tool_style: CallStyle = field(default_factory=CallStyle)
    batch: BatchConfig = field(default_factory=BatchConfig)


TOP_KEYS = {f.name for f in fields(EmulatorConfig)} | {"replace_endpoints"}
ENDPOINT_KEYS = {f.name for f in fields(Endpoint)}


def _num(value: Any, name: str, *, lo: float | None = None, hi: float | None = None,
         integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise InputError(f"must be {'an integer' if integer else 'a number'}, got {value!r}", field=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise InputError(f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}", field=name)
    return value


def _typed(value: Any, kind: type, name: str) -> Any:
    if not isinstance(value, kind):
        raise InputError(f"has the wrong type ({type(value).__name__})", field=name)
    return value


def _mapping(value: Any, name: str, allowed: set[str]) -> dict:
    _typed(value, dict, name)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InputError(f"unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})",
                         field=f"{name}.{unknown[0]}" if name else unknown[0])
    return value


def _endpoint(raw: Any, name: str, base: Endpoint | None) -> Endpoint:
    _mapping(raw, name, ENDPOINT_KEYS)
    if base is None:
        for req in ("provider", "slug", "quantization", "prompt_price", "completion_price"):
            if req not in raw:
                raise InputError("is required for a new endpoint", field=f"{name}.{req}")
    ep = replace(base) if base else Endpoint(raw["provider"], raw["slug"], raw["quantization"],
                                             raw["prompt_price"], raw["completion_price"])
    for key, value in raw.items():
        where = f"{name}.{key}"
        if key == "provider" and base is not None:
            continue  # matched case-insensitively: keep the catalog's display name
        if key in ("provider", "slug", "quantization"):
            value = _typed(value, str, where)
            if not value.strip():
                raise InputError("must not be empty", field=where)
        elif key in ("prompt_price", "completion_price", "latency", "throughput"):
            _num(value, where, lo=0)
            if key == "throughput" and value <= 0:
                raise InputError("must be > 0", field=where)
        elif key == "uptime":
            _num(value, where, lo=0, hi=100)
        elif key in ("context_length", "max_completion_tokens", "capacity"):
            _num(value, where, lo=1, integer=True)
        elif key == "status":
            _num(value, where, integer=True)
        elif key == "error_rate":
            _num(value, where, lo=0, hi=1)
        elif key in ("stream_cancellation", "usage_counts_im_end"):
            _typed(value, bool, where)
        elif key == "tool_call_ids":
            if value not in TOOL_CALL_IDS:
                raise InputError(f"must be one of {', '.join(TOOL_CALL_IDS)}", field=where)
        elif key == "data_collection":
            if value not in ("allow", "deny"):
                raise InputError("must be 'allow' or 'deny'", field=where)
        elif key == "supported_parameters":
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise InputError("must be a list of parameter names", field=where)
            value = tuple(value)
        elif key == "quirks":
            _mapping(value, where, set(QUIRKS))
            for q, rate in value.items():
                _num(rate, f"{where}.{q}", lo=0, hi=1)
            value = replace(ep.quirks, **value)
        setattr(ep, key, value)
    return ep


def _batch(raw: Any) -> BatchConfig:
    b = _mapping(raw, "batch", BATCH_KEYS)
    out = BatchConfig()
    for key, value in b.items():
        where = f"batch.{key}"
        if key in ("max_file_bytes", "max_files"):
            value = _num(value, where, lo=1, integer=True)
        elif key == "models":
            if not isinstance(value, list) or not value or not all(isinstance(m, str) and m.strip() for m in value):
                raise InputError("must be a non-empty list of model names", field=where)
            value = list(value)
        elif key in ("line_error_rate", "expire_rate"):
            value = float(_num(value, where, lo=0, hi=1))
        else:
            value = float(_num(value, where, lo=0))
            if key == "lines_per_s" and value <= 0:
                raise InputError("must be > 0", field=where)
        setattr(out, key, value)
    return out


def parse_config(raw: dict | None = None) -> EmulatorConfig:
    """Validate a config mapping. `endpoints` entries override the default endpoint of the same
    provider name, or add a new one; `replace_endpoints: true` drops the default catalog first."""
    raw = dict(raw or {})
    _mapping(raw, "", TOP_KEYS)
    cfg = EmulatorConfig()
    if "seed" in raw:
        cfg.seed = _num(raw["seed"], "seed", integer=True)
    for key in ("balance", "speed", "generation_delay"):
        if key in raw:
            setattr(cfg, key, float(_num(raw[key], key, lo=0)))
    if "processing_interval" in raw:
        cfg.processing_interval = float(_num(raw["processing_interval"], "processing_interval", lo=0.01))
    if raw.get("key_limit") is not None:
        cfg.key_limit = float(_num(raw["key_limit"], "key_limit", lo=0))
    for key in ("api_key", "tokenizer", "ground_truth_file"):
        if raw.get(key) is not None:
            setattr(cfg, key, _typed(raw[key], str, key))
    if cfg.api_key is not None and not cfg.api_key.strip():
        raise InputError("must be a non-empty key or null", field="api_key")
    for key in ("model", "model_version", "model_name"):
        if key in raw:
            setattr(cfg, key, _typed(raw[key], str, key))
    if cfg.model.count("/") != 1:
        raise InputError("must look like 'author/slug'", field="model")
    if "tool_follow_rate" in raw:
        cfg.tool_follow_rate = float(_num(raw["tool_follow_rate"], "tool_follow_rate", lo=0, hi=1))
    if raw.get("tool_style") is not None:
        st = _mapping(raw["tool_style"], "tool_style", {"context_share", "slips"})
        share = float(_num(st.get("context_share", 0.0), "tool_style.context_share", lo=0, hi=1))
        slips = _mapping(st.get("slips") or {}, "tool_style.slips", set(SLIPS))
        rates = tuple((k, float(_num(slips[k], f"tool_style.slips.{k}", lo=0, hi=1))) for k in SLIPS if k in slips)
        if sum(r for _, r in rates) > 1:
            raise InputError("the slips' rates add up to more than 1", field="tool_style.slips")
        cfg.tool_style = CallStyle(share, rates)
    if raw.get("tool_datasets") is not None:
        paths = raw["tool_datasets"]
        if not isinstance(paths, list) or not all(isinstance(x, str) and x.strip() for x in paths):
            raise InputError("must be a list of prompt file paths", field="tool_datasets")
        missing = [x for x in paths if not Path(x).is_file()]
        if missing:
            raise InputError(f"prompt file not found: {missing[0]}", field="tool_datasets")
        cfg.tool_datasets = list(paths)
    if raw.get("reject") is not None:
        r = _mapping(raw["reject"], "reject", {"code", "message"})
        code = _num(r.get("code", 400), "reject.code", lo=400, hi=599, integer=True)
        if not isinstance(r.get("message"), str) or not r["message"].strip():
            raise InputError("must be a non-empty string", field="reject.message")
        cfg.reject = {"code": code, "message": r["message"]}
    for key in ("credits_forbidden", "record_prompt_ids"):
        if key in raw:
            setattr(cfg, key, _typed(raw[key], bool, key))
    if "content" in raw:
        c = _mapping(raw["content"], "content", {f.name for f in fields(ContentDist)})
        for key, value in c.items():
            _num(value, f"content.{key}", lo=0, hi=1 if key == "literal_close" else None, integer=key == "max_total")
            setattr(cfg.content, key, value)
    if "faults" in raw:
        f = _mapping(raw["faults"], "faults", set(FAULT_CLASSES) | {"retry_after", "slow_seconds"})
        for key, value in f.items():
            if key == "retry_after":
                cfg.faults.retry_after = _num(value, "faults.retry_after", lo=0, integer=True)
            elif key == "slow_seconds":
                cfg.faults.slow_seconds = float(_num(value, "faults.slow_seconds", lo=0))
            else:
                cfg.faults.rates[key] = float(_num(value, f"faults.{key}", lo=0, hi=1))
        if sum(cfg.faults.rates.values()) > 1 + 1e-9:
            raise InputError("fault rates add up to more than 1", field="faults")
    if "batch" in raw:
        cfg.batch = _batch(raw["batch"])
    if "replace_endpoints" in raw and _typed(raw["replace_endpoints"], bool, "replace_endpoints"):
        cfg.endpoints = []
    if "endpoints" in raw:
        _typed(raw["endpoints"], list, "endpoints")
        for i, entry in enumerate(raw["endpoints"]):
            name = f"endpoints[{i}]"
            _typed(entry, dict, name)
            given = entry.get("provider")
            base = next((e for e in cfg.endpoints
                         if isinstance(given, str) and e.provider.lower() == given.lower()), None)
            ep = _endpoint(entry, name, base)
            if base is None:
                cfg.endpoints.append(ep)
            else:
                cfg.endpoints[cfg.endpoints.index(base)] = ep
    if not cfg.endpoints:
        raise InputError("the catalog has no endpoints", field="endpoints")
    return cfg


def load_config(path: str | Path | None) -> EmulatorConfig:
    """Read a YAML or JSON config file (JSON is YAML); errors name the file and the field."""
    if path is None:
        return parse_config({})
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read config: {e.strerror}", path) from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise InputError(f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}", path) from None
    if raw is not None and not isinstance(raw, dict):
        raise InputError("the config must be a mapping", path)
    try:
        return parse_config(raw)
    except InputError as e:
        err = InputError(str(e), path)
        err.field = e.field
        raise err from None
