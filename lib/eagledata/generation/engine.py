"""The generation engine: datasets' prompts → records, 2000 in flight, resumable, never over budget.

One run serves one dataset or several on one pool of slots, one admission, one account and one congestion
controller; each dataset keeps its own checkpoint store, target and summary. Workers (one coroutine per
concurrency slot, none per prompt) pull the next prompt as they free up, from the dataset furthest behind its
target (pacing.py), so memory stays flat however many prompts wait and the budget plan's shares hold. What a slot
takes is a `Turn` (turns.py): a prompt's conversation is a chain of requests, each turn answered on the target's
own earlier answers, and a finished turn's next one goes ahead of new conversations. A request
starts only when admission (admission.py) says its cost fits the money left; retries wait in a heap until due so
a Retry-After never blocks a slot; only a window of mostly 429s lowers the number in flight (congestion.py). What
each outcome means is a table (policy.py); the books follow the account (account.py), and one run at a time
spends on an account (spender.py). Every finished prompt is appended once to its dataset's store; a kill at any
instant loses at most the requests in flight, which the next run issues again.
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import math
import signal
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Literal

import httpx

from ..aio import run_sync
from ..defaults import shared
from ..errors import InputError
from ..paths import dataset_files
from ..openrouter import (ClientPool, Completion, Kind, Outcome, Price, RoutingDecision,
                          build_request, complete, load_routing, read_account, resolve_api_key)
from ..openrouter.answers import REASONING_MISSING
from ..settings import Settings, setting
from ..text import KimiTokenizer, load_tokenizer, prompt_ids
from .account import AccountReading, Books
from .admission import Admission, AgeModel, BudgetMode
from .budget import OutputLengths
from .congestion import Congestion, ProviderCooldown
from .datasets import select_datasets
from .fidelity import FidelityJudge
from .pacing import Pacing
from .policy import ERROR_PREFIX, Rule, StopReason, error_stop, fatal_stop, retry_delay, rule
from .panel import make_progress
from .progress import (DatasetSnapshot, ProgressView, RunSnapshot, RunStats, dataset_summary, merge_provider_health,
                       merge_timelines, run_figures, run_summary)
from .prompts import Prompt, PromptScan, scan_prompts
from .recording import build_record
from .spender import SpenderLock
from .store import Store
from .turns import Conversation, Turn, TurnsMode, later_turn_ids

log = logging.getLogger("eagledata.generate")

ViewFactory = Callable[[RunSnapshot], ProgressView]  # what shows a run, from its first snapshot
TICK_S = 0.5  # progress, re-estimating the requests in flight, closing congestion windows
PRIOR_PROMPT_TOKENS = 500  # the prompt side of the cost prior (small next to the answer)
NO_ENDPOINT_BREAKER = 50  # this many no-endpoint answers in a row, none succeeding: routing is wrong


@dataclass(kw_only=True)
class GenerateConfig(Settings):
    """Every setting of a generation run: generate.ipynb's parameters cell and the command's flags are
    made from these fields (docs/FORMATS.md#generate-parameters fixes the first fourteen names)."""

    dataset: str | list[str] = setting(
        "demo-a", "a name in datasets_file, a list of names, or all: one run, one pool, one budget",
        cli_required=True, cli_many=True)
    datasets_file: str = shared("datasets_file")
    base_url: str = shared("base_url")
    api_key_env: str = shared("api_key_env", "the key is read from this variable only (none needed for a local backend)")
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
    max_attempts: int = setting(8, "per prompt, then failures.jsonl")
    retry_base_s: float = setting(1.0, "backoff: base * 2^attempt, full jitter, capped")
    retry_cap_s: float = setting(60.0, "longest backoff")
    request_timeout_s: float = setting(900.0, "client-side timeout of one request")
    drain_timeout_s: float = setting(60.0, "after a stop signal or an internal error, in-flight requests get this long")
    straggler_wait_s: float | None = setting(
        120.0, "every target met, or the money's end: answers still in flight get this long (billed either way), "
               "then the run ends; None -> all")
    budget_mode: BudgetMode = setting(
        "portfolio", "portfolio: commit expected cost + a tail margin; strict: every request's worst case")
    overshoot_probability: float = setting(1e-6, "portfolio: chance the requests in flight overshoot the limit")
    prior_output_median_tokens: float = shared("prior_output_median_tokens", "cost prior before any answer (no earlier records)")
    prior_output_sigma: float = shared("prior_output_sigma")
    account_refresh_s: float = setting(10.0, "seconds between account readings (/key usage, /credits)")
    account_lag_s: float = setting(5.0, "how far the account's usage may lag behind its answers")
    provider_cooldown_s: float = setting(30.0, "a provider answering mostly 429s is left out this long")
    progress: bool = setting(True, "a live panel in JupyterLab (throughput, spend, datasets, providers), else a "
                                   "status line through logging")
    status_interval_s: float = shared("status_interval_s")

    def __post_init__(self) -> None:
        """Types are checked by `Settings`; these are the ranges."""
        super().__post_init__()
        for name in ("concurrency", "max_tokens", "max_attempts", "target_output_tokens", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"must be a positive integer, got {value!r}", field=name)
        if self.max_spend_usd is not None and not self.max_spend_usd > 0:
            raise InputError(f"must be > 0 or None, got {self.max_spend_usd!r}", field="max_spend_usd")
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


CompleteFn = Callable[[httpx.AsyncClient, dict], Awaitable[Outcome]]


@dataclass(order=True)
class _Item:  # a turn on its way: due time and sequence order the retry heap
    due: float
    seq: int
    turn: Turn = field(compare=False)
    lane: "DatasetRun" = field(compare=False)
    source: Literal["new", "next", "retry"] = field(default="new", compare=False)  # where `_take` found it
    attempts: int = field(default=0, compare=False)       # those that count against max_attempts
    tries: int = field(default=0, compare=False)          # every request sent
    rate_limited: int = field(default=0, compare=False)   # 429s in a row
    prompt_ids: list[int] | None = field(default=None, compare=False)
    bound: float = field(default=0.0, compare=False)      # the most one attempt can cost
    last_error: dict | None = field(default=None, compare=False)
    started: bool = field(default=False, compare=False)   # this attempt was sent (pacing counts it in flight)
    sent_at: float = field(default=0.0, compare=False)    # when this attempt was sent (its latency)
    requeue: bool = field(default=False, compare=False)   # to the retry heap once its worker lets go of it
    avoid: set[str] = field(default_factory=set, compare=False)  # providers that refused this prompt's answer


@dataclass(eq=False)
class DatasetRun:
    """One dataset inside a run: its checkpoint, its prompts still to send, the next turns of its started
    conversations, its retries and its counters."""

    name: str
    store: Store
    scan: PromptScan
    target: int | None
    turns: TurnsMode = "all"
    planned_usd: float | None = None  # the budget plan's $ for its target (None: no plan, or another target)
    prompts: Iterator[Prompt] = field(init=False)
    exhausted: bool = False
    ready: deque[Turn] = field(default_factory=deque)     # next turns, answered at once, ahead of new conversations
    retries: list[_Item] = field(default_factory=list)   # heap by due time
    holding: int = 0
    stop_reason: str = ""
    target_met_s: float | None = None                    # when its recorded tokens reached the target
    stats: RunStats = field(default_factory=RunStats)
    fidelity: FidelityJudge = field(init=False)  # this dataset's answers, all runs (the run's judge decides)

    def __post_init__(self) -> None:
        self.prompts = iter(self.scan)
        self.done_before = self.store.conversations_finished
        self.tokens_before = self.store.output_tokens
        self.summary_before = self.store.read_summary()  # an earlier run's: its fidelity books carry over
        # One `turns` setting per dataset: continuing with the other would make one conversation's turns both ways.
        before = ((self.summary_before or {}).get("run") or {}).get("turns")
        if self.store.recorded and before is not None and before != self.turns:
            raise InputError(f"this dataset's records were made with turns: {before}; continue with the same "
                             f"setting (or another output_dir)", self.store.files.summary, field="turns")
        self.fidelity = FidelityJudge.carried([self.summary_before] if self.summary_before else [], decides=False)

    @property
    def target_met(self) -> bool:
        return self.target is not None and self.store.output_tokens >= self.target

    @property
    def idle(self) -> bool:
        """Nothing to send: every prompt finished, or the target met."""
        return not self.scan.pending or self.target_met

    @property
    def all_finished(self) -> bool:
        """Every conversation of this run is finished (recorded to its end or failed): `completed` is true. (Taken
        is not finished: a prompt given back unstarted, when the money ran out, is still to do.)"""
        return self.store.conversations_finished - self.done_before >= len(self.scan.pending)

    def take(self, now: float, seq: int, may_start: Callable[[], bool], may_continue: Callable[[], bool]) \
            -> _Item | None:
        """The next request of this dataset: a retry that is due, else the next turn of a started conversation, else
        the first turn of the next conversation; retries and new conversations while pacing lets the dataset take
        more, next turns while it lets conversations go on (pacing.Lane.may_continue)."""
        if self.retries and self.retries[0].due <= now and may_start():
            item = heapq.heappop(self.retries)
            item.source = "retry"
            return item
        if self.ready and may_continue():
            return _Item(0.0, seq, self.ready.popleft(), self, source="next")
        if not self.exhausted and may_start():
            prompt = next(self.prompts, None)
            if prompt is None:
                self.exhausted = True
                return None
            return _Item(0.0, seq, self.first_turn(Conversation.of(prompt, self.turns)), self)
        return None

    def first_turn(self, conversation: Conversation) -> Turn:
        """A conversation's first request in this run: its first turn, or the one after the turns an earlier run
        recorded (from their recorded answers)."""
        history = self.store.history(conversation.id) if conversation.id in self.store.chains else []
        numbers = [r.turn for r in history]
        if numbers != list(range(conversation.first, conversation.first + len(history))) \
                or len(history) >= len(conversation.asks):
            raise InputError(f"conversation {conversation.id!r}: turns {numbers} are recorded, but its prompt has "
                             f"{len(conversation.asks)} (was the prompt file changed?)", self.store.files.records)
        return conversation.turn([r.answer for r in history])

    @property
    def finished(self) -> bool:
        return bool(self.stop_reason)


def cost_prior(costs: list[float], worst: Price, cfg: GenerateConfig) -> list[float]:
    """What an answer may cost before this run has seen any: the datasets' earlier records, else the budget
    model's log-normal guess of output lengths at the worst eligible price."""
    if len(costs) >= 30:
        return costs
    return [worst.cost(PRIOR_PROMPT_TOKENS, n) for n in prior_lengths(cfg)]


def prior_lengths(cfg: GenerateConfig) -> list[int]:
    """The budget model's guess of output lengths (before a dataset has records of its own)."""
    return list(OutputLengths.lognormal(cfg.prior_output_median_tokens, cfg.prior_output_sigma, cfg.max_tokens,
                                        n=20_000).samples)


class Run:
    """One generation run over one or several datasets sharing one pool of slots, one admission and one
    account. Use `await Run.start(cfg, clients)` then `await run.execute(clients)`."""

    def __init__(self, cfg: GenerateConfig, tok: KimiTokenizer, lanes: list[DatasetRun], routing: RoutingDecision,
                 *, complete_fn: CompleteFn = complete):
        self.cfg, self.tok, self.routing = cfg, tok, routing
        self.lanes = {lane.name: lane for lane in lanes}
        self.single = isinstance(cfg.dataset, str) and cfg.dataset != "all"
        self.complete = complete_fn
        # Nothing left to send (every prompt finished, or every target met): the run answers from the
        # checkpoints without a request, the account included, so a finished report can run again anywhere.
        self.idle = all(lane.idle for lane in lanes)
        for lane in lanes:
            if lane.idle:
                lane.stop_reason = StopReason.TARGET_REACHED if lane.target_met else StopReason.COMPLETED
        self.paid = cfg.backend == "openrouter"
        worst = routing.worst_price() if self.paid else Price(0.0, 0.0)
        if worst is None:
            raise InputError("the routing decision has no price to reserve against", field="routing")
        self.worst = worst
        costs = [c for lane in lanes for c in lane.store.costs]
        self.admission = Admission(AgeModel(cost_prior(costs, worst, cfg) if self.paid else [0.0]),
                                   mode=cfg.budget_mode, overshoot_probability=cfg.overshoot_probability)
        guess = prior_lengths(cfg)
        self.pacing = Pacing(Pacing.lane(
            lane.name, target=lane.target, prompts=lane.scan.total, recorded=lane.store.output_tokens,
            finished=lane.store.conversations_finished, prior_tokens=lane.store.lengths if len(lane.store.lengths) >= 30 else guess)
            for lane in lanes)
        self.books = Books(lag_s=cfg.account_lag_s)
        self.congestion = Congestion(cfg.concurrency)
        self.cooldown = ProviderCooldown(cooldown_s=cfg.provider_cooldown_s)
        # per-provider verdicts over the whole run (fidelity.py), from the datasets' earlier books: a provider judged
        # suspect before is left out from the first request
        self.fidelity = FidelityJudge.carried(lane.summary_before for lane in lanes if lane.summary_before)
        self.price_by_provider = {e.provider: e.price for e in routing.eligible if e.priced}
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="eagledata-tok")
        self.cond = asyncio.Condition()
        self.seq = itertools.count()
        self.holding = 0          # items in workers' hands (tokenizing, waiting for money, in flight)
        self.stopping = False
        self.stop_reason = ""
        self._signalled = self._abandoning = self._draining = False
        self._drainer: asyncio.Future | None = None
        self._workers: list[asyncio.Future] = []
        self.error: Exception | None = None  # the internal error that stopped the run (summaries say it)
        self._want_reading = False
        self._read_attempt_at = -math.inf
        self._stragglers_since: float | None = None
        self.fatal: Outcome | None = None
        self.money_left: dict[str, Any] | None = None  # why and with how much money issuing stopped
        self.no_endpoint_streak = 0
        self.timeline: list[list[float]] = []  # the run's own samples (each dataset keeps its own)
        self.t0 = time.monotonic()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.balance_start: float | None = None
        self.progress: ProgressView | None = None
        self.spender: SpenderLock | None = None

    # -- setup -----------------------------------------------------------------------------------
    @classmethod
    async def start(cls, cfg: GenerateConfig, client: httpx.AsyncClient, *, api_key: str | None = None,
                    complete_fn: CompleteFn = complete) -> "Run":
        """Open every dataset's store and validate every prompt before any request; take the account's
        spender lock and its first reading when there is something to send."""
        specs = select_datasets(cfg.datasets_file, cfg.dataset)
        names = [spec.name for spec in specs]
        lanes: list[DatasetRun] = []
        run: Run | None = None
        try:
            for spec in specs:
                name = spec.name
                if not spec.prompts.is_file():
                    raise InputError("prompts file not found", spec.prompts, field=f"{name}.prompts")
                store = Store.open(dataset_files(name, cfg.output_dir))
                try:
                    scan = scan_prompts(spec.prompts, store.finished, cfg.limit,  # every bad line named first
                                        turn_ids=functools.partial(later_turn_ids, turns=cfg.turns), tools=spec.tools)
                    lanes.append(DatasetRun(name, store, scan, cfg.target_output_tokens or spec.target_output_tokens,
                                            cfg.turns, None if cfg.target_output_tokens else spec.planned_usd))
                except BaseException:
                    store.close()
                    raise
            tok = load_tokenizer(cfg.tokenizer)
            routing = RoutingDecision(model=cfg.model) if cfg.backend == "local" else await load_routing(
                cfg.model, params_dir=cfg.params_dir, base_url=cfg.base_url, api_key_env=cfg.api_key_env)
            run = cls(cfg, tok, lanes, routing, complete_fn=complete_fn)
            if run.paid and not run.idle:
                run.spender = SpenderLock.acquire(cfg.base_url, api_key, describe={
                    "datasets": names, "output_dir": str(Path(cfg.output_dir).resolve())})
                await run._read_account(client, strict=True)
                run.balance_start = run.books.last.balance_usd if run.books.last else None
        except BaseException:
            if run is not None:
                run.close()
            else:
                for lane in lanes:
                    lane.store.close()
            raise
        return run

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.store.close()
        if self.spender is not None:
            self.spender.close()

    async def _read_account(self, client: httpx.AsyncClient, *, strict: bool = False) -> None:
        """Book an account reading; a failed refresh keeps the last one (the first must succeed)."""
        at, spent = time.monotonic(), self.books.spent()
        self._read_attempt_at = at
        try:
            account = await read_account(client)
        except Exception:
            if strict:
                raise
            return
        self.books.read(AccountReading(at, account.usage_usd, account.balance_usd), spent)

    # -- scheduling -----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """HTTP requests under way, over every dataset."""
        return sum(lane.stats.in_flight for lane in self.lanes.values())

    def totals(self) -> RunStats:
        """The run's counters: its datasets' added up, with the run's timeline."""
        return RunStats.combined([lane.stats for lane in self.lanes.values()], self.timeline)

    def stop(self, reason: str) -> None:
        if not self.stopping:
            self.stopping, self.stop_reason = True, reason

    def _settle_lanes(self) -> None:
        """Mark the datasets that are done: target recorded, or every prompt finished, nothing in hand.
        Caller holds the lock."""
        now = time.monotonic() - self.t0
        for lane in self.lanes.values():
            if lane.target_met_s is None and lane.target_met:
                lane.target_met_s = now
            if lane.finished or lane.holding:
                continue
            if lane.target_met_s is not None:
                lane.stop_reason = StopReason.TARGET_REACHED
            elif lane.all_finished:
                lane.stop_reason = StopReason.COMPLETED
                if (leak := self.pacing.unsettled(lane.name)) is not None:
                    lane.stop_reason = self._books_wrong(leak)
            elif not self.stopping and lane.exhausted and not lane.retries and not lane.ready:
                left = len(lane.scan.pending) - (lane.store.conversations_finished - lane.done_before)
                lane.stop_reason = self._books_wrong(f"{lane.name}: {left} conversations neither finished nor in hand")
        if all(lane.finished for lane in self.lanes.values()):
            reasons = {lane.stop_reason for lane in self.lanes.values()}
            errors = sorted(r for r in reasons if r.startswith(ERROR_PREFIX))
            self.stop(errors[0] if errors else StopReason.TARGET_REACHED if reasons == {StopReason.TARGET_REACHED}
                      else StopReason.COMPLETED)

    @staticmethod
    def _books_wrong(what: str) -> str:
        """The engine's own counts disagree (a bug): the dataset stops saying so, never hangs or drifts on."""
        reason = error_stop(RuntimeError(what))
        log.error("generation: %s", reason)
        return reason

    def _only_stragglers(self) -> bool:
        """Everything still in hand is an answer to a dataset already at its target, and nothing else is left."""
        return all(lane.target_met_s is not None or lane.finished for lane in self.lanes.values())

    async def _take(self) -> _Item | None:
        async with self.cond:
            while True:
                if self.stopping:
                    return None
                timeout = None
                if self.holding < self.congestion.allowed:
                    now = time.monotonic()
                    active = [n for n, lane in self.lanes.items() if not lane.finished and lane.target_met_s is None]
                    for name in self.pacing.ranked(active):
                        lane = self.lanes[name]
                        paced = self.pacing.lanes[name]
                        item = lane.take(now, next(self.seq), paced.open, paced.may_continue)
                        if item is not None:
                            item.started = False
                            self.holding += 1
                            lane.holding += 1
                            self.pacing.hold(name, later=item.turn.later if item.source == "new" else 0,
                                             promised=item.source == "next")
                            return item
                        if lane.retries and lane.retries[0].due > now:  # one due already waits for its dataset
                            due = lane.retries[0].due - now            # to open: a change, which notifies
                            timeout = due if timeout is None else min(timeout, due)
                    self._settle_lanes()
                    if self.stopping:
                        self.cond.notify_all()
                        return None
                try:
                    await asyncio.wait_for(self.cond.wait(), timeout)
                except asyncio.TimeoutError:
                    pass

    async def _release(self, item: _Item) -> None:
        """The worker lets go of `item`. A retry enters the heap only here: pushed earlier, another worker could
        take it (and reset `started`) before this one let go, and pacing would count it given back twice (its
        count of taken requests went negative and the square root of a negative variance killed a run)."""
        async with self.cond:
            self.holding -= 1
            item.lane.holding -= 1
            if not item.started:  # given back: this conversation goes no further in this run
                self.pacing.release(item.lane.name)
                self.pacing.forgo(item.lane.name, item.turn.later)
            if item.requeue:
                item.requeue = False
                heapq.heappush(item.lane.retries, item)
            self._settle_lanes()
            if self.stopping:
                self.cond.notify_all()
            else:
                self.cond.notify(1)

    def _money_stop(self, limit: float) -> str:
        cap = self.cfg.max_spend_usd
        return StopReason.MAX_SPEND_REACHED if cap is not None and limit >= cap else StopReason.BALANCE_RESERVE_REACHED

    async def _admit(self, item: _Item) -> int | None:
        """Start the request if its cost fits the budget (see admission.py); a ticket, or None when the
        money is gone (or the run is stopping)."""
        async with self.cond:
            while True:
                if self.stopping:
                    return None
                limit, spent = self.books.limit(self.cfg.max_spend_usd, self.cfg.reserve_usd), self.books.spent()
                if self.admission.fits(item.bound, spent, limit):
                    return self.admission.start(time.monotonic(), item.bound)
                # It does not fit. Provisional bookings (unreadable answers at their bound) hold money the account
                # may not have charged: ask for the reading that settles them as soon as it can (the ticker reads
                # once the newest is older than the account's lag), and never stop on figures that still hold them.
                due = self.books.pending_reconciliation()
                if due is not None and self._read_attempt_at < due:
                    self._want_reading = True
                elif (why := self.admission.stop_rule(item.bound, spent, limit, self.cfg.concurrency)) is not None:
                    self.money_left = {"usd": round(max(0.0, limit - spent), 6), "limit_usd": round(limit, 6),
                                       "in_flight": len(self.admission.flights), "why": why}
                    self.stop(self._money_stop(limit))
                    self.cond.notify_all()
                    return None
                await self.cond.wait()

    async def _in_pool(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def _provider(self, item: _Item | None = None) -> dict[str, Any] | None:
        """The routing decision's provider object, leaving out the providers judged suspect (for good), those that
        refused this prompt's answer (unless that leaves none), and those cooling off after 429s."""
        eligible = self.routing.eligible_providers
        out = set(self.fidelity.suspects)
        if item is not None and item.avoid and not set(eligible) <= out | item.avoid:
            out |= item.avoid
        out |= set(self.cooldown.cooling(time.monotonic(), [p for p in eligible if p not in out]))
        if not out or not self.routing.provider:
            return self.routing.provider
        return {**self.routing.provider, "ignore": sorted({*self.routing.provider.get("ignore", []), *out})}

    def _judged(self, provider: str, suspect: bool) -> None:
        """A provider just turned suspect: say so; when no eligible provider is left, stop (caller holds the lock)."""
        if not suspect:
            return
        evidence = self.fidelity.providers[provider].evidence
        log.warning("provider %s left out of the rest of the run: suspect, %s", provider, evidence)
        eligible = set(self.routing.eligible_providers)
        if self.paid and eligible and eligible <= set(self.fidelity.suspects):
            self.stop(StopReason.NO_FAITHFUL_PROVIDERS)
            self.cond.notify_all()

    # -- one request ------------------------------------------------------------------------------
    async def worker(self, client: httpx.AsyncClient) -> None:
        """One concurrency slot: its own connection from `client` (a shard of the pool). A bug here (a policy's
        arithmetic, a slot's code) stops the run cleanly instead of killing it: see `_failed`."""
        try:
            while (item := await self._take()) is not None:
                try:
                    await self._work(client, item)
                finally:
                    await self._release(item)
        except Exception as e:
            await self._failed(e)

    async def _failed(self, error: Exception) -> None:
        """A bug stopped one slot (or the ticker): stop issuing, as a first Ctrl-C does: the answers in flight are
        recorded as they come (up to `drain_timeout_s`), the prompt in the slot's hands stays unfinished (the
        next run sends it), every summary is written, and the stop reason names the error."""
        if self.error is None:
            self.error = error
            log.error("generation: stopping the run on an internal error (every prompt stays recorded, failed or "
                      "resumable)", exc_info=error)
        else:
            log.error("generation: another slot stopped on %s: %s", type(error).__name__, error)
        self.stop(error_stop(error))
        self._drain()
        async with self.cond:
            self.cond.notify_all()

    async def _work(self, client: httpx.AsyncClient, item: _Item) -> None:
        if item.prompt_ids is None:
            item.prompt_ids = await self._in_pool(prompt_ids, self.tok, item.turn.messages,
                                                  tools=item.turn.conversation.tools)
            item.bound = self.worst.cost(len(item.prompt_ids), self.cfg.max_tokens)
        ticket = await self._admit(item)
        if ticket is None:
            return  # unfinished: the next run issues it again
        async with self.cond:
            item.sent_at = time.monotonic()
            pace = self.pacing.start(item.lane.name, item.sent_at)
            item.started = True
        conversation = item.turn.conversation
        body = build_request(self.cfg.model, item.turn.messages, max_tokens=self.cfg.max_tokens,
                             temperature=self.cfg.temperature, provider=self._provider(item), backend=self.cfg.backend,
                             tools=conversation.tools, parallel_tool_calls=conversation.parallel_tool_calls)
        item.lane.stats.in_flight += 1
        try:
            outcome = await self.complete(client, body)
        except BaseException:
            async with self.cond:  # cancelled or a bug: the attempt ended with nothing recorded
                self.pacing.end(pace, time.monotonic(), 0, finished=False)
            raise
        finally:
            item.lane.stats.in_flight -= 1
        item.tries += 1
        if outcome.kind is Kind.OK:
            await self._record(item, outcome, ticket, pace)
        else:
            await self._not_ok(item, outcome, ticket, pace)

    def _cost(self, c: Completion) -> float:
        """The server's `usage.cost`, else the tokens at the serving provider's price (else the worst)."""
        if c.usage.cost is not None:
            return c.usage.cost
        price = self.price_by_provider.get(c.provider, self.worst)
        return price.cost(c.usage.prompt_tokens, c.usage.completion_tokens)

    def _settle(self, item: _Item, ticket: int, outcome: Outcome, cost: float | None) -> Rule:
        """Book what the attempt cost (see policy.RULES) and feed the estimators; returns the outcome's rule.
        Caller holds the lock."""
        r = rule(outcome)
        now = time.monotonic()
        if r.cost == "known" and cost is not None:
            self.books.book(now, cost)
        elif r.cost == "unknown" and self.paid:
            cost = None
            self.books.book(now, item.bound, provisional=True)
        else:
            cost = 0.0
        item.lane.stats.booked_usd += item.bound if cost is None and self.paid else cost
        self.admission.end(ticket, now, cost)
        self.congestion.observe(now, r.rate_limited)
        provider = outcome.completion.provider if outcome.completion is not None else outcome.provider
        self.cooldown.observe(now, provider, r.rate_limited)
        item.lane.stats.attempt(provider, ok=outcome.completion is not None, rate_limited=r.rate_limited,
                                latency_s=now - item.sent_at)
        return r

    async def _record(self, item: _Item, outcome: Outcome, ticket: int, pace: int) -> None:
        c = outcome.completion
        assert c is not None
        cost = self._cost(c)
        try:
            record = await self._in_pool(build_record, self.tok, turn=item.turn, dataset=item.lane.name,
                                         prompt_ids=item.prompt_ids, completion=c,
                                         attempts=item.tries, sampling={"temperature": self.cfg.temperature})
        except UnicodeEncodeError:
            spoiled = Outcome(Kind.RETRY, "untokenizable", 200, "answer text is not valid Unicode (lone surrogate)",
                              provider=c.provider)
            return await self._not_ok(item, spoiled, ticket, pace, cost)
        async with self.cond:
            self._settle(item, ticket, outcome, cost)
            store = item.lane.store
            written = item.turn.id not in store.done  # a stop signal cannot make us write twice
            answer = record.answer
            ends = item.turn.ends(answer)
            if written:
                store.add_record(record, cost)
            if written and not ends:
                item.lane.ready.append(item.turn.next(answer))
            else:  # its last turn, or a cut one (which ends its conversation early)
                self.pacing.forgo(item.lane.name, item.turn.later)
            self.pacing.end(pace, time.monotonic(), record.output_tokens if written else 0, finished=written and ends)
            item.lane.stats.add_record(record, c.usage, cost)
            item.lane.fidelity.answer(c.provider, record.meta["fidelity"], record.finish_reason)
            self._judged(c.provider, self.fidelity.answer(c.provider, record.meta["fidelity"], record.finish_reason))
            self.no_endpoint_streak = 0
            self.cond.notify(2)

    async def _not_ok(self, item: _Item, outcome: Outcome, ticket: int, pace: int, cost: float | None = None) -> None:
        cls = outcome.error_class
        lane = item.lane
        if cost is None and outcome.completion is not None:  # a refused answer: read, and paid for
            cost = self._cost(outcome.completion)
        async with self.cond:
            r = self._settle(item, ticket, outcome, cost)
            if cls == REASONING_MISSING:  # retried on another provider, counted against this one
                item.avoid.add(outcome.provider)
                lane.fidelity.refusal(outcome.provider)
                self._judged(outcome.provider, self.fidelity.refusal(outcome.provider))
            finished = False
            lane.stats.errors[cls] += 1
            item.last_error = outcome.error_dict()
            item.attempts += r.counts
            item.rate_limited = item.rate_limited + 1 if r.rate_limited else 0
            if outcome.kind is Kind.RETRY:
                if cls == "no_endpoint":
                    self.no_endpoint_streak += 1
                    if self.no_endpoint_streak >= NO_ENDPOINT_BREAKER:
                        self.fatal = outcome
                        self.stop(StopReason.NO_ENDPOINTS)
                if item.attempts >= self.cfg.max_attempts:
                    self._fail(item, {**item.last_error, "gave_up_after": "max_attempts"})
                    finished = True
                else:
                    item.due = time.monotonic() + retry_delay(outcome, item.attempts, item.rate_limited,
                                                              base_s=self.cfg.retry_base_s, cap_s=self.cfg.retry_cap_s)
                    item.seq = next(self.seq)
                    item.requeue = True  # `_release` puts it on the heap
                    lane.stats.counts["retried"] += 1
            elif outcome.kind is Kind.FAILED:
                self._fail(item, item.last_error)
                finished = True
            elif outcome.kind is Kind.OUT_OF_MONEY:
                self.stop(StopReason.OUT_OF_CREDITS)
            else:  # FATAL
                self.fatal = outcome
                self.stop(fatal_stop(cls))
            self.pacing.end(pace, time.monotonic(), 0, finished=finished)
            if self.stopping:
                self.cond.notify_all()
            else:
                self.cond.notify(2)

    def _fail(self, item: _Item, error: dict) -> None:
        turn = item.turn
        chain = {"conversation_id": turn.conversation.id, "turn": turn.number} if turn.conversation.chained else {}
        item.lane.store.add_failure(turn.id, error, item.tries, **chain)
        self.pacing.forgo(item.lane.name, turn.later)  # a turn that fails for good ends its conversation
        item.lane.stats.counts["failed"] += 1

    # -- the run ----------------------------------------------------------------------------------
    async def _ticker(self, client: httpx.AsyncClient, workers: list[asyncio.Future]) -> None:
        try:
            await self._tick_forever(client, workers)
        except Exception as e:  # the estimators, the books, the progress view: a bug stops the run cleanly
            await self._failed(e)

    async def _tick_forever(self, client: httpx.AsyncClient, workers: list[asyncio.Future]) -> None:
        last_account = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            due = self.books.pending_reconciliation()
            wanted = self._want_reading and due is not None and now >= due
            if self.paid and (now - last_account >= self.cfg.account_refresh_s or wanted):
                last_account, self._want_reading = now, False
                await self._read_account(client)
            async with self.cond:  # periodic wake-up: no waiter can sleep through a state change
                now = time.monotonic()
                self.admission.refresh(now)
                self.pacing.refresh(now)
                self.congestion.tick(now)
                self._sample()
                self._watch_stragglers(now, workers)
                self.cond.notify_all()

    def _watch_stragglers(self, now: float, workers: list[asyncio.Future]) -> None:
        """Issuing is over — every target met, or the money's end — and answers are still in flight: they get
        `straggler_wait_s` (they are billed either way and kept when they come), then the run ends without them."""
        money = self.stop_reason in (StopReason.MAX_SPEND_REACHED, StopReason.BALANCE_RESERVE_REACHED)
        over = money if self.stopping else self._only_stragglers()
        if not over or not self.holding or self.cfg.straggler_wait_s is None or self._abandoning:
            self._stragglers_since = None
            return
        if self._stragglers_since is None:
            self._stragglers_since = now
        elif now - self._stragglers_since >= self.cfg.straggler_wait_s:
            self._abandoning = True
            for lane in self.lanes.values():
                lane.stats.abandoned = lane.holding
            self.stop(StopReason.TARGET_REACHED)  # a money stop keeps its reason: the first stop wins
            for w in workers:
                w.cancel()

    def _sample(self, final: bool = False) -> None:
        """A point of the timelines. The final one holds what the summaries hold: the account's delta (not the
        books, which keep abandoned stragglers at their bound until the account says what they cost)."""
        now = time.monotonic() - self.t0
        spent = self._spent(final)
        self.totals().sample(now, spent, self.in_flight, self.congestion.allowed)
        for lane in self.lanes.values():  # one dataset alone: the run's reconciled spend, as before
            lane.stats.sample(now, spent if self.single else self._lane_spent(lane, final), lane.stats.in_flight,
                              self.congestion.allowed)
        if self.progress is not None and not final:
            self.progress.update(self._snapshot())

    def _lane_spent(self, lane: DatasetRun, final: bool) -> float:
        """One dataset's money in a run over several: what its answers were booked at, and at the end its share
        of the account's delta, apportioned by that."""
        charged = self.books.charged_usd
        if not final or charged is None:
            return lane.stats.booked_usd
        total = sum(other.stats.booked_usd for other in self.lanes.values())
        return charged * lane.stats.booked_usd / total if total else 0.0

    def _spent(self, final: bool) -> float:
        """The run's money: its books, and at the end what the summary reports, the account's delta."""
        if final and self.books.charged_usd is not None:
            return self.books.charged_usd
        return self.books.spent()

    def _snapshot(self, final: bool = False) -> RunSnapshot:
        """Where the run stands."""
        spent = self._spent(final)
        limit = self.books.limit(self.cfg.max_spend_usd, self.cfg.reserve_usd) if self.paid else float("inf")
        usable = self.books.limit(None, self.cfg.reserve_usd) if self.paid else float("inf")
        t = time.monotonic() - self.t0
        return RunSnapshot(t=t, in_flight=self.in_flight, limit=self.congestion.allowed, spent=spent,
                           cap=self.cfg.max_spend_usd, money_limit=limit, foreign=self.books.foreign_usd,
                           suspects=self.fidelity.suspect_headlines(), usable=usable,
                           verdicts={name: p.verdict for name, p in self.fidelity.providers.items()},
                           planned_usd_per_m=self._planned_per_m(),
                           stop_reason=(self.stop_reason or StopReason.COMPLETED) if final else None,
                           stats=self.totals(), datasets=[DatasetSnapshot(
                               name=lane.name, done=lane.store.conversations_finished,
                               total_prompts=lane.scan.total, tokens=lane.store.output_tokens, target=lane.target,
                               in_flight=lane.stats.in_flight, stats=lane.stats, done_before=lane.done_before,
                               tokens_before=lane.tokens_before) for lane in self.lanes.values()])

    async def execute(self, clients: ClientPool, view: ViewFactory | None = None) -> dict[str, Any]:
        """Run to the end; every dataset's summary.json is written, and the run's summary returned (for one
        dataset named alone, that dataset's summary). `view` makes what shows the run (else `cfg.progress` picks
        the live panel or status lines)."""
        if view is not None:
            self.progress = view(self._snapshot())
        elif self.cfg.progress:
            self.progress = make_progress(self._snapshot(), interval_s=self.cfg.status_interval_s)
        workers = [asyncio.ensure_future(self.worker(clients[i])) for i in range(self.cfg.concurrency)]
        ticker = asyncio.ensure_future(self._ticker(clients[0], workers))
        restore = _install_signal_handlers(self._on_signal)
        self._workers = workers
        cancelled: asyncio.CancelledError | None = None
        try:
            await asyncio.gather(*workers, return_exceptions=False)
        except asyncio.CancelledError as e:  # the drain ran out, a second signal, the stragglers abandoned, or ours
            self.stop(StopReason.INTERRUPTED)
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            if not (self._draining or self._abandoning):
                cancelled = e  # the caller cancelled us: raised once the summaries are written
        finally:
            restore()
            ticker.cancel()
            if self._drainer is not None:
                self._drainer.cancel()
            if self.paid and not self.idle:  # the account after the last answer: what the run was charged
                await self._read_account(clients[0])
            for lane in self.lanes.values():
                if not lane.finished:
                    lane.stop_reason = self.stop_reason or StopReason.COMPLETED
            self._sample(final=True)
            self.pool.shutdown(wait=True)
            for lane in self.lanes.values():
                lane.store.sync()
        summary = None
        try:
            summaries = {}
            for lane in self.lanes.values():
                summaries[lane.name] = self._dataset_summary(lane)
                lane.store.write_summary(summaries[lane.name])
            summary = summaries[self.cfg.dataset] if self.single else self._run_summary(summaries)
        finally:
            if self.progress is not None:  # the last frame: the report's figure, drawn from the summary
                self.progress.close(self._snapshot(final=True), summary)
        if cancelled is not None:
            raise cancelled
        return summary

    def _on_signal(self) -> None:
        """First signal: stop issuing, let in-flight requests finish (up to drain_timeout_s).
        Second signal, or the drain running out: abandon what is in flight."""
        if self._signalled:
            for w in self._workers:
                w.cancel()
            return
        self._signalled = True
        self.stop(StopReason.INTERRUPTED)
        self._drain()

    def _drain(self) -> None:
        """Stop issuing and give the requests in flight `drain_timeout_s` to come back, then abandon them."""
        if self._draining:
            return
        self._draining = True

        async def drain() -> None:
            async with self.cond:
                self.cond.notify_all()
            await asyncio.sleep(self.cfg.drain_timeout_s)
            for w in self._workers:
                w.cancel()

        self._drainer = asyncio.ensure_future(drain())

    # -- summaries --------------------------------------------------------------------------------
    def _run_settings(self) -> dict[str, Any]:
        cheapest = self.routing.cheapest()
        return {"max_spend_usd": self.cfg.max_spend_usd, "reserve_usd": self.cfg.reserve_usd,
                "balance_start_usd": self.balance_start, "budget_mode": self.cfg.budget_mode,
                "concurrency": self.cfg.concurrency, "max_tokens": self.cfg.max_tokens, "turns": self.cfg.turns,
                "cheapest_eligible_usd_per_m_output": cheapest.completion_per_m if cheapest else None,
                "planned_usd_per_m_output": self._planned_per_m()}

    def _planned_per_m(self) -> float | None:
        """The budget plan's $ per million output tokens over this run's targets: the spend line it expects (None
        when a dataset with a target has no plan)."""
        planned = [(lane.planned_usd, lane.target) for lane in self.lanes.values() if lane.target is not None]
        if not planned or any(usd is None for usd, _ in planned):
            return None
        return round(1e6 * sum(usd for usd, _ in planned) / sum(t for _, t in planned), 4)

    def _common(self, wall: float) -> dict[str, Any]:
        return {"model": self.cfg.model, "base_url": self.cfg.base_url, "backend": self.cfg.backend,
                "started_at": self.started_at, "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "wall_s": round(wall, 3)}

    def _dataset_summary(self, lane: DatasetRun) -> dict[str, Any]:
        """summary.json of one dataset. In a run over several, its money is its share of the account's delta,
        apportioned by what its answers were booked at (`run.shared_with` names the others)."""
        wall = time.monotonic() - self.t0
        charged = self.books.charged_usd
        if charged is not None and not self.single:
            charged = self._lane_spent(lane, final=True)
        summary = {**dataset_summary(
            lane.name, lane.store, lane.stats, common=self._common(wall), stop_reason=lane.stop_reason,
            fatal=self.fatal.error_dict() if self.fatal else None, prompts=lane.scan.total, target=lane.target,
            figures=run_figures(lane.stats, wall_s=wall, charged=charged,
                                spent=self.books.spent() if self.single else lane.stats.booked_usd),
            settings=self._run_settings(), done_before=lane.done_before, target_met_s=lane.target_met_s,
            extra={**self._money_extra(),
                   "concurrency_changes": self._concurrency_changes(),
                   **({"shared_with": [n for n in self.lanes if n != lane.name]} if not self.single else {})},
            routing={"provider": self.routing.provider, "source": self.routing.source}),
            "fidelity": lane.fidelity.summary(verdicts=self.fidelity)}
        return self._carried(summary, [lane.summary_before or {}])

    def _carried(self, summary: dict[str, Any], before: list[dict[str, Any]]) -> dict[str, Any]:
        """An idle run (nothing to send: a finished report run again) keeps the timeline and provider health of
        the run that did the work, so the report, and the panel's last frame, show that run, not an empty one."""
        if not self.idle:
            return summary
        summary["timeline"] = merge_timelines([b.get("timeline") or [] for b in before])
        summary["run"]["provider_health"] = merge_provider_health(
            [(b.get("run") or {}).get("provider_health") or {} for b in before])
        return summary

    def _money_extra(self) -> dict[str, Any]:
        return {"foreign_usd": round(self.books.foreign_usd, 8), "money_left": self.money_left}

    def _concurrency_changes(self) -> list:
        return [[round(t - self.t0, 1), round(share, 3), round(limit)]
                for t, share, limit in self.congestion.history if limit < self.cfg.concurrency][-200:]

    def _run_summary(self, summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        totals = self.totals()
        summary = {**run_summary(list(self.lanes), summaries, totals, common=self._common(wall),
                                 stop_reason=self.stop_reason or StopReason.COMPLETED,
                                 fatal=self.fatal.error_dict() if self.fatal else None,
                                 figures=run_figures(totals, wall_s=wall, charged=self.books.charged_usd,
                                                     spent=self.books.spent()),
                                 settings=self._run_settings(),
                                 extra={**self._money_extra(), "concurrency_changes": self._concurrency_changes()},
                                 routing={"provider": self.routing.provider, "source": self.routing.source}),
                   "fidelity": self.fidelity.summary()}
        return self._carried(summary, list(summaries.values()))


def _install_signal_handlers(callback: Callable[[], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM → callback on the loop (main thread only); returns the undo."""
    loop = asyncio.get_running_loop()
    installed = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, callback)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)
            if previous.get(sig) is not None:
                signal.signal(sig, previous[sig])

    return restore


async def run_generation(cfg: GenerateConfig, *, complete_fn: CompleteFn = complete,
                         view: ViewFactory | None = None) -> dict[str, Any]:
    """Generate one dataset, or several in one pool on one budget; returns the summary (one dataset named alone:
    its summary.json; otherwise the run's, with each dataset's inside). Every input error is raised before the
    first completion request; a fatal API error (bad key, no endpoints) is raised after the summaries are
    written. `complete_fn` sends one request, `view` shows the run (tests and benches pass their own)."""
    key = resolve_api_key(cfg.base_url, cfg.api_key_env, cfg.backend)
    async with ClientPool(cfg.base_url, key, concurrency=cfg.concurrency, timeout=cfg.request_timeout_s) as clients:
        run = await Run.start(cfg, clients[0], api_key=key, complete_fn=complete_fn)
        try:
            summary = await run.execute(clients, view)
        finally:
            run.close()
    if run.fatal is not None:
        raise RuntimeError(f"generation stopped: {summary['stop_reason']}: {run.fatal.message}")
    return summary


def generate(cfg: GenerateConfig) -> dict[str, Any]:
    return run_sync(run_generation(cfg), "run_generation")
