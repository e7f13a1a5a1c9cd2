"""The generation stage's notebook settings: generate.ipynb's (`GenerateConfig`) and budget.ipynb's (`BudgetConfig`).

The rule (lib/eagledata/README.md): a notebook's settings class lives in `config.py` of the package that owns its
stage; its parameters cell and its command's flags are made from these fields, and the domain modules take the
values they need as arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..defaults import is_emulator, shared
from ..errors import InputError
from ..paths import emulator_dirs, routing_file
from ..settings import Settings, setting
from .admission import BudgetMode
from .turns import TurnsMode

Policy = Literal["equal", "proportional", "weights"]
PriceMode = Literal["cheapest", "worst", "mix"]


@dataclass(kw_only=True)
class GenerateConfig(Settings):
    """Every setting of a generation run: generate.ipynb's parameters cell and the command's flags are
    made from these fields (docs/FORMATS.md#generate-parameters fixes the first fourteen names)."""

    dataset: str | list[str] = setting(
        "demo-a", "a name in datasets_file, a list of names, or all: one run, one pool, one budget",
        cli_required=True, cli_many=True)
    datasets_file: str = shared("datasets_file")
    base_url: str = shared("base_url")
    api_key_env: str = shared("api_key_env",
                              "the key is read from this variable only (none needed for a local backend)")
    model: str = shared("model")
    tokenizer: str | None = shared("tokenizer")
    concurrency: int = shared("concurrency")
    max_tokens: int = shared("max_tokens")
    temperature: float | None = setting(1.0, "None -> the server's default")
    target_output_tokens: int | None = setting(None, "None -> the datasets file")
    max_spend_usd: float | None = setting(None, "per-run cap; None -> no cap")
    reserve_usd: float = shared("reserve_usd")
    output_dir: str = shared("output_dir", "records go to <output_dir>/datasets/<dataset>/")
    limit: int | None = shared("limit", "at most this many prompts; None -> all")
    turns: TurnsMode = shared("turns")
    params_dir: str = shared("params_dir")
    backend: Literal["openrouter", "local"] = setting(
        "openrouter", "local: an OpenAI-compatible server (vLLM, SGLang) that returns token ids")
    stream: bool = setting(False, "ask for SSE streams (the same records as one JSON body; off until issue 42 "
                                  "measures its throughput); a local backend is always asked for one body")
    max_attempts: int = setting(8, "per prompt, then failures.jsonl")
    retry_failed: bool = setting(False, "send again the prompts failures.jsonl holds (kept in failures.retried.jsonl)")
    retry_base_s: float = setting(1.0, "backoff: base * 2^attempt, full jitter, capped")
    retry_cap_s: float = setting(60.0, "longest backoff")
    request_timeout_s: float = setting(900.0, "client-side timeout of one request (a stream: stall_timeout_s)")
    stall_timeout_s: float = setting(
        120.0, "a stream that sends no byte this long (OpenRouter's keepalive comments count) is closed and retried")
    drain_timeout_s: float = setting(60.0, "after a stop signal or an internal error, in-flight requests get this long")
    straggler_wait_s: float | None = setting(
        120.0, "every target met, or the money's end: answers still in flight get this long (billed either way), "
               "then the run ends; None -> all")
    budget_mode: BudgetMode = setting(
        "portfolio", "portfolio: commit expected cost + a tail margin; strict: every request's worst case")
    overshoot_probability: float = setting(1e-6, "portfolio: chance the requests in flight overshoot the limit")
    prior_output_median_tokens: float = shared("prior_output_median_tokens",
                                               "cost prior before any answer (no earlier records)")
    prior_output_sigma: float = shared("prior_output_sigma")
    account_refresh_s: float = setting(10.0, "seconds between account readings (/key usage, /credits)")
    account_lag_s: float = setting(5.0, "how far the account's usage may lag behind its answers")
    provider_cooldown_s: float = setting(30.0, "a provider answering mostly 429s is left out this long")
    progress: bool = setting(True, "a live panel in JupyterLab (throughput, spend, datasets, providers), else a "
                                   "status line through logging")
    status_interval_s: float = shared("status_interval_s")
    emulator_speed: float = shared("emulator_speed")

    def __post_init__(self) -> None:
        """Types are checked by `Settings`; these are the ranges. An emulator run's default folders are moved under
        outputs/emulator/ (paths.emulator_dirs): its records and routing never where a real run reads them."""
        super().__post_init__()
        if is_emulator(self.base_url):
            self.output_dir, self.params_dir = emulator_dirs(self.output_dir, self.params_dir)
        if not self.emulator_speed >= 0:
            raise InputError(f"must be >= 0, got {self.emulator_speed!r}", field="emulator_speed")
        for name in ("concurrency", "max_tokens", "max_attempts", "target_output_tokens", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"must be a positive integer, got {value!r}", field=name)
        if self.temperature is not None and not 0 <= self.temperature <= 2:  # OpenRouter's range: a 400 otherwise
            raise InputError(f"must be within [0, 2] or None, got {self.temperature!r}", field="temperature")
        if self.max_spend_usd is not None and not self.max_spend_usd > 0:
            raise InputError(f"must be > 0 or None, got {self.max_spend_usd!r}", field="max_spend_usd")
        for name in ("request_timeout_s", "stall_timeout_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"must be > 0, got {getattr(self, name)!r}", field=name)
        if not self.reserve_usd >= 0:
            raise InputError(f"must be >= 0, got {self.reserve_usd!r}", field="reserve_usd")
        if not 0 < self.overshoot_probability < 1:
            raise InputError(f"must be in (0, 1), got {self.overshoot_probability!r}", field="overshoot_probability")
        names = [self.dataset] if isinstance(self.dataset, str) else self.dataset
        if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise InputError(f"must be a name, a list of distinct names, or 'all'; got {self.dataset!r}",
                             field="dataset")
        if isinstance(self.dataset, list) and "all" in self.dataset:
            raise InputError("'all' stands alone, not inside a list", field="dataset")
        if self.straggler_wait_s is not None and self.straggler_wait_s < 0:
            raise InputError(f"must be >= 0 or None, got {self.straggler_wait_s!r}", field="straggler_wait_s")
        for name in ("prior_output_median_tokens", "account_refresh_s", "status_interval_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"must be > 0, got {getattr(self, name)!r}", field=name)


@dataclass(kw_only=True)
class BudgetConfig(Settings):
    """Every setting of budget.ipynb (its parameters cell is made from these fields)."""

    datasets_file: str = shared("datasets_file")
    budget_usd: float = setting(100.0, "account balance to plan with")
    reserve_usd: float = shared("reserve_usd", "never planned: covers in-flight overshoot and price drift")
    model: str = shared("model")
    routing: str | None = setting(None, "routing decision (providers.ipynb); None -> <params_dir>/routing/<model>.yaml")
    params_dir: str = shared("params_dir")
    snapshot: str | None = shared("snapshot", "no routing decision: price from this endpoints snapshot, else base_url")
    base_url: str = shared("base_url", "no routing decision nor snapshot: the catalog is read here (emulator: one "
                                       "started for it; output_dir and params_dir then under outputs/emulator/)")
    api_key_env: str = shared("api_key_env")
    price_mode: PriceMode = setting("cheapest", "cheapest | worst | mix (eligible endpoints)")
    price_mix: dict[str, float] | None = setting(None, "provider -> weight, used with the mix price mode")
    policy: Policy = setting("equal", "equal | proportional (to requests) | weights")
    weights: dict[str, float] | None = setting(None, "dataset -> weight, used with the weights policy")
    prior_output_median_tokens: float = shared("prior_output_median_tokens")
    prior_output_sigma: float = shared("prior_output_sigma")
    max_tokens: int = shared("max_tokens", "generation cap per request (caps the guess)")
    turns: TurnsMode = shared("turns", "as generate plans to run: all (a request per user turn, on the target's own "
                              "answers) | last (a request per prompt)")
    prior_content_share: float = setting(0.25, "no finished records yet: guess an earlier answer's content (what "
                                         "later turns resend) as this share of the output guess (the rest: reasoning)")
    concurrency: int = shared("concurrency", "requests in flight when a run stops issuing (cost band)")
    round_to: int = setting(100_000, "targets are rounded down to this many tokens")
    scenario_targets: list[int] = setting([10_000_000, 7_000_000], "per-dataset targets priced in the scenario table")
    write: bool = setting(True, "write the chosen targets into datasets_file")
    tokenizer: str | None = shared("tokenizer")
    output_dir: str = shared("output_dir", "earlier runs' records are read from <output_dir>/datasets/")

    def __post_init__(self) -> None:
        super().__post_init__()
        if is_emulator(self.base_url):  # an emulator study reads its own runs' records and routing
            self.output_dir, self.params_dir = emulator_dirs(self.output_dir, self.params_dir)
        if not 0 <= self.prior_content_share <= 1:
            raise InputError(f"must be within [0, 1], got {self.prior_content_share!r}", field="prior_content_share")

    def routing_path(self) -> Path:
        return Path(self.routing) if self.routing else routing_file(self.model, self.params_dir)
