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
from ..moonshot.facts import BATCH_BASE_URL, BATCH_KEY_ENV, batch_model, window_hours
from ..paths import emulator_dirs, routing_file
from ..settings import Settings, setting
from .conversations.turns import TurnsMode
from .money.admission import BudgetMode

Policy = Literal["equal", "proportional", "weights"]
PriceMode = Literal["cheapest", "worst", "mix"]
Route = Literal["realtime", "batch"]
AtTarget = Literal["cut", "finish"]


@dataclass(kw_only=True)
class GenerateConfig(Settings):
    """Every setting of a generation run: generate.ipynb's parameters cell and the command's flags are
    made from these fields (docs/FORMATS.md#generate-parameters fixes the first twenty names)."""

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
    target_output_tokens: int | dict[str, int] | None = setting(
        None, "None -> the datasets file; a number for every dataset, or {dataset: tokens} (budget.ipynb's commands)")
    max_spend_usd: float | None = setting(None, "per-run cap; None -> no cap")
    reserve_usd: float = shared("reserve_usd")
    output_dir: str = shared("output_dir", "records go to <output_dir>/datasets/<dataset>/")
    limit: int | None = shared("limit", "at most this many prompts; None -> all")
    route: Route = setting("realtime", "realtime: OpenRouter, 2000 in flight; batch: Moonshot's Batch API (first-party "
                                       "weights, 60 % of its realtime price, answers within batch_window), in rounds")
    batch_base_url: str = setting(BATCH_BASE_URL, "the Batch API (route batch); base_url emulator: the emulator's")
    batch_api_key_env: str = setting(BATCH_KEY_ENV, "route batch: the Moonshot key is read from this variable only")
    batch_model: str = setting("kimi-k2.5", "the Batch API's model (kimi-k2.5 | kimi-k2.6)")
    batch_window: str = shared("batch_window")
    batch_poll_s: float = setting(60.0, "route batch: seconds between polls of the batches in progress (emulator: "
                                        "x emulator_speed)")
    turns: TurnsMode = shared("turns")
    rollout_steps: int = setting(20, "a task (a prompt naming an environment): requests per user turn at most; a "
                                     "trajectory still calling at its cap ends there, marked capped")
    tool_call_s: float = setting(10.0, "a task's tool call: seconds it may run in its environment's worker before it "
                                       "is stopped (an error result the model is shown)")
    tool_memory_mb: int = setting(1024, "a task's environment: the worker's address space in MiB (a call past it is "
                                        "an error result)")
    tool_envs: int = setting(64, "a task's environments kept live between its steps, at most (a worker each; the "
                                 "least recently used closed past it); 0: each step rebuilt by replay from the start")
    params_dir: str = shared("params_dir")
    backend: Literal["openrouter", "local"] = setting(
        "openrouter", "local: an OpenAI-compatible server (vLLM, SGLang) that returns token ids")
    stream: bool = setting(True, "ask for SSE streams (the same records as one JSON body; a closed stream stops the "
                                 "billing where the endpoint cancels); false: one JSON body per answer; a local "
                                 "backend is always asked for one body")
    at_target: AtTarget = setting(
        "cut", "stream: true, a dataset at its target (or a Ctrl-C): cut: close its streams whose endpoint stops "
               "billing and keep what they delivered as cut samples (finish_reason cut); finish: let every answer end")
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
    batch_first_round: float = setting(
        0.9, "route batch: a dataset's first round aims at this share of its target (the length guess is not "
             "measured yet); top-up rounds then aim at the target on this run's answers")
    batch_cancel_on_stop: bool = setting(
        False, "route batch: on Ctrl-C cancel the batches in progress (their answered lines are still recorded); "
               "False: leave them running, a rerun of the same command picks them up")
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
        if not self.tool_call_s > 0:
            raise InputError(f"must be > 0, got {self.tool_call_s!r}", field="tool_call_s")
        if not (isinstance(self.tool_envs, int) and self.tool_envs >= 0):
            raise InputError(f"must be an integer >= 0, got {self.tool_envs!r}", field="tool_envs")
        if not self.emulator_speed >= 0:
            raise InputError(f"must be >= 0, got {self.emulator_speed!r}", field="emulator_speed")
        for name in ("concurrency", "max_tokens", "max_attempts", "limit", "rollout_steps", "tool_memory_mb"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"must be a positive integer, got {value!r}", field=name)
        targets = self.target_output_tokens
        for key, value in (targets.items() if isinstance(targets, dict) else [(None, targets)]):
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise InputError(f"must be a positive integer, got {value!r}",
                                 field="target_output_tokens" + (f".{key}" if key is not None else ""))
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
        for name, check in (("batch_model", batch_model), ("batch_window", window_hours)):
            try:
                check(getattr(self, name))
            except ValueError as e:
                raise InputError(str(e), field=name) from None
        if not 0 < self.batch_first_round <= 1:
            raise InputError(f"must be within (0, 1], got {self.batch_first_round!r}", field="batch_first_round")
        for name in ("prior_output_median_tokens", "account_refresh_s", "status_interval_s", "batch_poll_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"must be > 0, got {getattr(self, name)!r}", field=name)


    def target_for(self, dataset: str) -> int | None:
        """This run's output-token target for `dataset`, where the setting gives one (else the datasets file's)."""
        targets = self.target_output_tokens
        return targets.get(dataset) if isinstance(targets, dict) else targets


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
    turns: TurnsMode = shared("turns", "as generate plans to run: all (a request per user turn, on the model's own "
                              "answers) | last (a request per prompt)")
    prior_content_share: float = setting(0.25, "no finished records yet: guess an earlier answer's content (what "
                                         "later turns resend) as this share of the output guess (the rest: reasoning)")
    prior_steps_per_user_turn: float = setting(2.0, "agentic tasks without a pilot run's records: requests per user "
                                               "turn (a tool round, then the answer)")
    prior_tool_result_tokens: float = setting(150.0, "agentic tasks without a pilot run's records: what a step's tool "
                                              "results add to the next step's prompt")
    concurrency: int = shared("concurrency", "requests in flight when a run stops issuing (cost band)")
    round_to: int = setting(100_000, "targets are rounded down to this many tokens")
    scenario_targets: list[int] = setting([10_000_000, 7_000_000], "per-dataset targets priced in the scenario table")
    write: bool = setting(True, "write the chosen targets into datasets_file")
    tokenizer: str | None = shared("tokenizer")
    output_dir: str = shared("output_dir", "earlier runs' records are read from <output_dir>/datasets/")
    # the time-money plan (route_plan.py): which route makes the targets by when, for how much
    deadline_h: float | None = setting(None, "hours from now the targets must be done; None -> no deadline "
                                       "(the cheapest route)")
    deadline_basis: Literal["worst", "expected"] = setting(
        "worst", "a plan meets the deadline when this time does: worst (batch: rounds x window) | expected")
    realtime_output_tps: float | None = setting(
        None, "output tokens/s of a realtime run; None -> the reference run's 21k at 2,000 in flight, x concurrency "
              "/ 2000")
    batch_window: str = shared("batch_window", "the batch route's completion window per round (12h to 7d), as "
                                               "generate's")
    batch_round_expected_h: float = setting(
        2.0, "an assumption (Moonshot documents only the window): hours a batch round typically takes")
    batch_topups: int = setting(1, "top-up rounds the batch route is planned to need (each one round more: generate's "
                                   "first round aims at batch_first_round of the target, a top-up a little over it)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if is_emulator(self.base_url):  # an emulator study reads its own runs' records and routing
            self.output_dir, self.params_dir = emulator_dirs(self.output_dir, self.params_dir)
        if not 0 <= self.prior_content_share <= 1:
            raise InputError(f"must be within [0, 1], got {self.prior_content_share!r}", field="prior_content_share")
        try:
            window_h = window_hours(self.batch_window)
        except ValueError as e:
            raise InputError(str(e), field="batch_window") from None
        if not 0 < self.batch_round_expected_h <= window_h:
            raise InputError(f"must be > 0 and at most the window ({window_h} h), got {self.batch_round_expected_h!r}",
                             field="batch_round_expected_h")
        if self.batch_topups < 0:
            raise InputError(f"must be >= 0, got {self.batch_topups!r}", field="batch_topups")
        for name in ("deadline_h", "realtime_output_tps"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise InputError(f"must be > 0 or None, got {value!r}", field=name)

    def routing_path(self) -> Path:
        return Path(self.routing) if self.routing else routing_file(self.model, self.params_dir)
