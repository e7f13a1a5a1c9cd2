"""The generation engine: a dataset's prompts → records, 2000 in flight, resumable, never over budget.

Workers (one coroutine per concurrency slot, none per prompt) pull the next prompt from the file as
they free up, so memory stays flat however many prompts wait. A request starts only when admission
(admission.py) says its cost fits the money left; retries wait in a heap until due so a Retry-After
never blocks a slot; only a window of mostly 429s lowers the number in flight (congestion.py). What
each outcome means is a table (policy.py); the books follow the account (account.py). Every finished
prompt is appended once to the checkpoint store; a kill at any instant loses at most the requests in
flight, which the next run issues again.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Literal

import httpx

from ..aio import run_sync
from ..errors import InputError
from ..layout import dataset_files
from ..openrouter import (ClientPool, Completion, Kind, Outcome, Price, RoutingDecision,
                          build_request, complete, load_routing, read_account, resolve_api_key)
from ..records import Record
from ..defaults import shared
from ..settings import Settings, setting
from ..text import KimiTokenizer, agreement, load_tokenizer, output_ids, prompt_ids
from .account import AccountReading, Books
from .admission import Admission, BudgetMode, CostModel
from .budget import OutputLengths
from .congestion import Congestion, ProviderCooldown
from .datasets import get_dataset
from .policy import Rule, retry_delay, rule
from .progress import TIMELINE_COLUMNS, ProgressView, RunStats, Snapshot, make_progress, run_figures
from .prompts import Prompt, PromptScan, scan_prompts
from .store import Store

TICK_S = 0.5  # progress, re-estimating the requests in flight, closing congestion windows
PRIOR_PROMPT_TOKENS = 500  # the prompt side of the cost prior (small next to the answer)
TAIL_IN_FLIGHT, TAIL_MONEY = 0.01, 0.02  # stop issuing below 1% of concurrency with under 2% of the money left
NO_ENDPOINT_BREAKER = 50  # this many no-endpoint answers in a row, none succeeding: routing is wrong


@dataclass(kw_only=True)
class GenerateConfig(Settings):
    """Every setting of a generation run: generate.ipynb's parameters cell and the command's flags are
    made from these fields (docs/FORMATS.md#generate-parameters fixes the first fourteen names)."""

    dataset: str = setting("demo-a", "a name in datasets_file", cli_required=True)
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
    params_dir: str = shared("params_dir")
    backend: Literal["openrouter", "local"] = setting(
        "openrouter", "local: an OpenAI-compatible server (vLLM, SGLang) that returns token ids")
    max_attempts: int = setting(8, "per prompt, then failures.jsonl")
    retry_base_s: float = setting(1.0, "backoff: base * 2^attempt, full jitter, capped")
    retry_cap_s: float = setting(60.0, "longest backoff")
    request_timeout_s: float = setting(900.0, "client-side timeout of one request")
    drain_timeout_s: float = setting(60.0, "after a stop signal, in-flight requests get this long")
    budget_mode: BudgetMode = setting(
        "portfolio", "portfolio: commit expected cost + a tail margin; strict: every request's worst case")
    overshoot_probability: float = setting(1e-6, "portfolio: chance the requests in flight overshoot the limit")
    prior_output_median_tokens: float = shared("prior_output_median_tokens", "cost prior before any answer (no earlier records)")
    prior_output_sigma: float = shared("prior_output_sigma")
    account_refresh_s: float = setting(10.0, "seconds between account readings (/key usage, /credits)")
    account_lag_s: float = setting(5.0, "how far the account's usage may lag behind its answers")
    provider_cooldown_s: float = setting(30.0, "a provider answering mostly 429s is left out this long")
    progress: bool = setting(True, "a widget bar in JupyterLab, else a status line through logging")
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
        for name in ("prior_output_median_tokens", "account_refresh_s", "status_interval_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"must be > 0, got {getattr(self, name)!r}", field=name)


CompleteFn = Callable[[httpx.AsyncClient, dict], Awaitable[Outcome]]


@dataclass(order=True)
class _Item:  # a prompt on its way: due time and sequence order the retry heap
    due: float
    seq: int
    prompt: Prompt = field(compare=False)
    attempts: int = field(default=0, compare=False)       # those that count against max_attempts
    tries: int = field(default=0, compare=False)          # every request sent
    rate_limited: int = field(default=0, compare=False)   # 429s in a row
    prompt_ids: list[int] | None = field(default=None, compare=False)
    bound: float = field(default=0.0, compare=False)      # the most one attempt can cost
    last_error: dict | None = field(default=None, compare=False)


def cost_prior(store: Store, worst: Price, cfg: GenerateConfig) -> list[float]:
    """What an answer may cost before this run has seen any: the dataset's earlier records, else the budget
    model's log-normal guess of output lengths at the worst eligible price."""
    if len(store.costs) >= 30:
        return store.costs
    lengths = OutputLengths.lognormal(cfg.prior_output_median_tokens, cfg.prior_output_sigma, cfg.max_tokens,
                                      n=20_000)
    return [worst.cost(PRIOR_PROMPT_TOKENS, n) for n in lengths.samples]


class Run:
    """One generation run over one dataset. Use `await Run.start(cfg, client)` then `await run.execute(clients)`."""

    def __init__(self, cfg: GenerateConfig, tok: KimiTokenizer, store: Store, routing: RoutingDecision,
                 scan: PromptScan, target: int | None, *, complete_fn: CompleteFn = complete):
        self.cfg, self.tok, self.store, self.routing = cfg, tok, store, routing
        self.complete = complete_fn
        self.total_prompts, self.target = scan.total, target
        # Nothing left to send (every prompt finished, or the token target met): the run answers from the
        # checkpoint without a request, the account included, so a finished report can run again anywhere.
        self.idle = not scan.pending or (target is not None and store.output_tokens >= target)
        self.paid = cfg.backend == "openrouter"
        worst = routing.worst_price() if self.paid else Price(0.0, 0.0)
        if worst is None:
            raise InputError("the routing decision has no price to reserve against", field="routing")
        self.worst = worst
        self.admission = Admission(CostModel(cost_prior(store, worst, cfg) if self.paid else [0.0]),
                                   mode=cfg.budget_mode, overshoot_probability=cfg.overshoot_probability)
        self.books = Books(lag_s=cfg.account_lag_s)
        self.congestion = Congestion(cfg.concurrency)
        self.cooldown = ProviderCooldown(cooldown_s=cfg.provider_cooldown_s)
        self.price_by_provider = {e.provider: e.price for e in routing.eligible if e.priced}
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="eagledata-tok")
        self.cond = asyncio.Condition()
        self.retries: list[_Item] = []
        self.seq = itertools.count()
        self.new_prompts = iter(scan)
        self.prompts_exhausted = False
        self.holding = 0          # items in workers' hands (tokenizing, waiting for money, in flight)
        self.in_flight = 0        # HTTP requests under way
        self.stopping = False
        self.stop_reason = ""
        self._signalled = False
        self.fatal: Outcome | None = None
        self.no_endpoint_streak = 0
        self.stats = RunStats()
        self.done_before = len(store.done)
        self.t0 = time.monotonic()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.balance_start: float | None = None
        self.progress: ProgressView | None = None

    # -- setup -----------------------------------------------------------------------------------
    @classmethod
    async def start(cls, cfg: GenerateConfig, client: httpx.AsyncClient, *,
                    complete_fn: CompleteFn = complete) -> "Run":
        spec = get_dataset(cfg.datasets_file, cfg.dataset)
        if not spec.prompts.is_file():
            raise InputError("prompts file not found", spec.prompts, field=f"{cfg.dataset}.prompts")
        store = Store.open(dataset_files(cfg.dataset, cfg.output_dir))
        try:
            scan = scan_prompts(spec.prompts, store.done, cfg.limit)  # every bad line named before any request
            tok = load_tokenizer(cfg.tokenizer)
            routing = RoutingDecision(model=cfg.model) if cfg.backend == "local" else await load_routing(
                cfg.model, params_dir=cfg.params_dir, base_url=cfg.base_url, api_key_env=cfg.api_key_env)
            run = cls(cfg, tok, store, routing, scan, cfg.target_output_tokens or spec.target_output_tokens,
                      complete_fn=complete_fn)
            if run.paid and not run.idle:
                await run._read_account(client, strict=True)
                run.balance_start = run.books.last.balance_usd if run.books.last else None
        except BaseException:
            store.close()
            raise
        return run

    async def _read_account(self, client: httpx.AsyncClient, *, strict: bool = False) -> None:
        """Book an account reading; a failed refresh keeps the last one (the first must succeed)."""
        at, spent = time.monotonic(), self.books.spent()
        try:
            account = await read_account(client)
        except Exception:
            if strict:
                raise
            return
        self.books.read(AccountReading(at, account.usage_usd, account.balance_usd), spent)

    # -- scheduling -----------------------------------------------------------------------------
    def _estimate_tokens(self) -> float:
        """Expected output tokens of one request: measured mean once there is one, else half the cap."""
        n = self.store.recorded
        if n >= 10:
            return self.store.output_tokens / n
        return self.cfg.max_tokens / 2

    def _target_reached(self) -> bool:
        if self.target is None:
            return False
        return self.store.output_tokens + self.holding * self._estimate_tokens() >= self.target

    def stop(self, reason: str) -> None:
        if not self.stopping:
            self.stopping, self.stop_reason = True, reason

    async def _take(self) -> _Item | None:
        async with self.cond:
            while True:
                if self.stopping:
                    return None
                timeout = None
                if self.holding >= self.congestion.allowed:
                    pass  # wait for a slot
                elif self.target is not None and self._target_reached():
                    if self.holding == 0:
                        self.stop("target_reached")
                        self.cond.notify_all()
                        return None
                else:
                    now = time.monotonic()
                    if self.retries and self.retries[0].due <= now:
                        self.holding += 1
                        return heapq.heappop(self.retries)
                    if not self.prompts_exhausted:
                        prompt = next(self.new_prompts, None)
                        if prompt is not None:
                            self.holding += 1
                            return _Item(0.0, next(self.seq), prompt)
                        self.prompts_exhausted = True
                    if self.retries:
                        timeout = self.retries[0].due - now
                    elif self.holding == 0:
                        self.stop("completed")
                        self.cond.notify_all()
                        return None
                try:
                    await asyncio.wait_for(self.cond.wait(), timeout)
                except asyncio.TimeoutError:
                    pass

    async def _release(self) -> None:
        async with self.cond:
            self.holding -= 1
            self.cond.notify(1)

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
                dregs = (len(self.admission.flights) < TAIL_IN_FLIGHT * self.cfg.concurrency
                         and limit - spent < TAIL_MONEY * limit)
                # Nothing in flight will free money: it is gone. Or only dregs are left, which would keep a
                # handful of requests in flight, each a possible straggler of minutes: stop issuing.
                if not self.admission.flights or dregs:
                    cap = self.cfg.max_spend_usd
                    self.stop("max_spend_reached" if cap is not None and limit >= cap else "balance_reserve_reached")
                    self.cond.notify_all()
                    return None
                await self.cond.wait()

    async def _in_pool(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _provider(self) -> dict[str, Any] | None:
        """The routing decision's provider object, leaving out providers cooling off after 429s."""
        hot = self.cooldown.cooling(time.monotonic(), self.routing.eligible_providers)
        if not hot or not self.routing.provider:
            return self.routing.provider
        return {**self.routing.provider, "ignore": sorted({*self.routing.provider.get("ignore", []), *hot})}

    # -- one request ------------------------------------------------------------------------------
    async def worker(self, client: httpx.AsyncClient) -> None:
        """One concurrency slot: its own connection from `client` (a shard of the pool)."""
        while (item := await self._take()) is not None:
            try:
                await self._work(client, item)
            finally:
                await self._release()

    async def _work(self, client: httpx.AsyncClient, item: _Item) -> None:
        if item.prompt_ids is None:
            item.prompt_ids = await self._in_pool(prompt_ids, self.tok, item.prompt.messages)
            item.bound = self.worst.cost(len(item.prompt_ids), self.cfg.max_tokens)
        ticket = await self._admit(item)
        if ticket is None:
            return  # unfinished: the next run issues it again
        body = build_request(self.cfg.model, item.prompt.messages, max_tokens=self.cfg.max_tokens,
                             temperature=self.cfg.temperature, provider=self._provider(), backend=self.cfg.backend)
        self.in_flight += 1
        try:
            outcome = await self.complete(client, body)
        finally:
            self.in_flight -= 1
        item.tries += 1
        if outcome.kind is Kind.OK:
            await self._record(item, outcome, ticket)
        else:
            await self._not_ok(item, outcome, ticket)

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
        self.admission.end(ticket, now, cost)
        self.congestion.observe(now, r.rate_limited)
        provider = outcome.completion.provider if outcome.completion is not None else outcome.provider
        self.cooldown.observe(now, provider, r.rate_limited)
        return r

    def _build_record(self, item: _Item, c: Completion) -> Record:
        a = c.answer
        # A lone surrogate (legal in JSON, not in UTF-8) has no exact ids: refuse it rather than record
        # ids that decode to other text. Raises UnicodeEncodeError.
        a.reasoning.encode("utf-8"), a.content.encode("utf-8")
        ids = output_ids(self.tok, a.reasoning, a.content, a.finish_reason)
        meta: dict[str, Any] = {"attempts": item.tries}
        if c.reasoning_inline:
            meta["reasoning_inline"] = True
        p_ids = item.prompt_ids
        if c.output_token_ids is not None:  # a local backend told us the true ids: store those
            meta["ids_source"] = "server"
            meta["retokenized_agreement"] = agreement(ids, c.output_token_ids)
            ids = list(c.output_token_ids)
            if c.prompt_token_ids is not None:
                meta["prompt_ids_match"] = list(c.prompt_token_ids) == p_ids
                p_ids = list(c.prompt_token_ids)
        return Record(id=item.prompt.id, dataset=self.cfg.dataset, messages=item.prompt.messages,
                      reasoning=a.reasoning, content=a.content, finish_reason=a.finish_reason, model=c.model,
                      provider=c.provider, generation_id=c.generation_id, usage=c.usage, prompt_ids=p_ids,
                      output_ids=ids, meta=meta)

    async def _record(self, item: _Item, outcome: Outcome, ticket: int) -> None:
        c = outcome.completion
        assert c is not None
        cost = self._cost(c)
        try:
            record = await self._in_pool(self._build_record, item, c)
        except UnicodeEncodeError:
            spoiled = Outcome(Kind.RETRY, "untokenizable", 200, "answer text is not valid Unicode (lone surrogate)",
                              provider=c.provider)
            return await self._not_ok(item, spoiled, ticket, cost)
        async with self.cond:
            self._settle(item, ticket, outcome, cost)
            if item.prompt.id not in self.store.done:  # a stop signal cannot make us write twice
                self.store.add_record(record, cost)
            self.stats.add_record(record, c.usage, cost)
            self.no_endpoint_streak = 0
            self.cond.notify(2)

    async def _not_ok(self, item: _Item, outcome: Outcome, ticket: int, cost: float | None = None) -> None:
        cls = outcome.error_class
        async with self.cond:
            r = self._settle(item, ticket, outcome, cost)
            self.stats.errors[cls] += 1
            item.last_error = outcome.error_dict()
            item.attempts += r.counts
            item.rate_limited = item.rate_limited + 1 if r.rate_limited else 0
            if outcome.kind is Kind.RETRY:
                if cls == "no_endpoint":
                    self.no_endpoint_streak += 1
                    if self.no_endpoint_streak >= NO_ENDPOINT_BREAKER:
                        self.fatal = outcome
                        self.stop("no_endpoints")
                if item.attempts >= self.cfg.max_attempts:
                    self.store.add_failure(item.prompt.id, {**item.last_error, "gave_up_after": "max_attempts"},
                                           item.tries)
                    self.stats.counts["failed"] += 1
                else:
                    item.due = time.monotonic() + retry_delay(outcome, item.attempts, item.rate_limited,
                                                              base_s=self.cfg.retry_base_s, cap_s=self.cfg.retry_cap_s)
                    item.seq = next(self.seq)
                    heapq.heappush(self.retries, item)
                    self.stats.counts["retried"] += 1
            elif outcome.kind is Kind.FAILED:
                self.store.add_failure(item.prompt.id, item.last_error, item.tries)
                self.stats.counts["failed"] += 1
            elif outcome.kind is Kind.OUT_OF_MONEY:
                self.stop("out_of_credits")
            else:  # FATAL
                self.fatal = outcome
                self.stop(f"fatal_{cls}")
            if self.stopping:
                self.cond.notify_all()
            else:
                self.cond.notify(2)

    # -- the run ----------------------------------------------------------------------------------
    async def _ticker(self, client: httpx.AsyncClient) -> None:
        last_account = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            if self.paid and now - last_account >= self.cfg.account_refresh_s:
                last_account = now
                await self._read_account(client)
            async with self.cond:  # periodic wake-up: no waiter can sleep through a state change
                self.admission.refresh(time.monotonic())
                self.congestion.tick(time.monotonic())
                self._sample()
                self.cond.notify_all()

    def _snapshot(self, final: bool = False) -> Snapshot:
        """Where the run stands. The final one reports what the summary reports: the account's delta."""
        spent = self.books.spent()
        if final and self.books.charged_usd is not None:
            spent = self.books.charged_usd
        limit = self.books.limit(self.cfg.max_spend_usd, self.cfg.reserve_usd) if self.paid else float("inf")
        return Snapshot(t=time.monotonic() - self.t0, done=self.store.recorded + self.store.failed,
                        total_prompts=self.total_prompts, tokens=self.store.output_tokens, in_flight=self.in_flight,
                        limit=self.congestion.allowed, spent=spent, cap=self.cfg.max_spend_usd, money_limit=limit)

    def _sample(self) -> None:
        snap = self._snapshot()
        self.stats.sample(snap.t, snap.spent, snap.in_flight, snap.limit)
        if self.progress is not None:
            self.progress.update(snap, self.stats)

    async def execute(self, clients: ClientPool) -> dict[str, Any]:
        if self.cfg.progress:
            self.progress = make_progress(self.cfg.dataset, interval_s=self.cfg.status_interval_s,
                                          total_prompts=self.total_prompts, done=len(self.store.done),
                                          target=self.target, tokens=self.store.output_tokens)
        workers = [asyncio.ensure_future(self.worker(clients[i])) for i in range(self.cfg.concurrency)]
        ticker = asyncio.ensure_future(self._ticker(clients[0]))
        restore = _install_signal_handlers(lambda: self._on_signal(workers))
        error: BaseException | None = None
        try:
            await asyncio.gather(*workers, return_exceptions=False)
        except (asyncio.CancelledError, Exception) as e:  # a bug in one slot must not leave 1,999 running
            self.stop("interrupted" if isinstance(e, asyncio.CancelledError) else f"error: {type(e).__name__}: {e}")
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            if not (isinstance(e, asyncio.CancelledError) and self._signalled):
                error = e
        finally:
            restore()
            ticker.cancel()
            if self.paid and not self.idle:  # the account after the last answer: what the run was charged
                await self._read_account(clients[0])
            self._sample()
            if self.progress is not None:
                self.progress.close(self._snapshot(final=True), self.stats)
            self.pool.shutdown(wait=True)
            self.store.sync()
        summary = self.summary()
        self.store.write_summary(summary)
        if error is not None:
            raise error
        return summary

    def _on_signal(self, workers: list[asyncio.Future]) -> None:
        """First signal: stop issuing, let in-flight requests finish (up to drain_timeout_s).
        Second signal, or the drain running out: abandon what is in flight."""
        if self._signalled:
            for w in workers:
                w.cancel()
            return
        self._signalled = True
        self.stop("interrupted")

        async def drain() -> None:
            async with self.cond:
                self.cond.notify_all()
            await asyncio.sleep(self.cfg.drain_timeout_s)
            for w in workers:
                w.cancel()

        asyncio.ensure_future(drain())

    def summary(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        remaining = self.total_prompts - len(self.store.done)
        cheapest = self.routing.cheapest()
        s = self.stats
        return {
            "dataset": self.cfg.dataset, "model": self.cfg.model, "base_url": self.cfg.base_url,
            "backend": self.cfg.backend, "started_at": self.started_at,
            "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "wall_s": round(wall, 3),
            "stop_reason": self.stop_reason or "completed",
            "fatal_error": self.fatal.error_dict() if self.fatal else None,
            # dataset totals (all runs), read by budget.ipynb's planned-vs-actual
            "output_tokens": self.store.output_tokens, "spend_usd": round(self.store.spend_usd, 8),
            "records": self.store.recorded, "failures": self.store.failed, "prompts": self.total_prompts,
            "remaining": remaining, "target_output_tokens": self.target,
            # this run
            "run": {
                "recorded": s.counts["recorded"], "failed": s.counts["failed"], "retried": s.counts["retried"],
                "output_tokens": s.output_tokens, "prompt_tokens": s.prompt_tokens,
                "reasoning_tokens": s.reasoning_tokens,
                **run_figures(s, wall_s=wall, charged=self.books.charged_usd, spent=self.books.spent()),
                "max_spend_usd": self.cfg.max_spend_usd, "reserve_usd": self.cfg.reserve_usd,
                "balance_start_usd": self.balance_start, "budget_mode": self.cfg.budget_mode,
                "concurrency": self.cfg.concurrency, "max_tokens": self.cfg.max_tokens,
                "cheapest_eligible_usd_per_m_output": cheapest.completion_per_m if cheapest else None,
                "errors": dict(s.errors), "providers": dict(s.providers), "finish_reasons": dict(s.finish),
                "concurrency_changes": [[round(t - self.t0, 1), round(share, 3), round(limit)]
                                        for t, share, limit in self.congestion.history
                                        if limit < self.cfg.concurrency][-200:],
                "retokenized_agreement_mean": (sum(s.agreement) / len(s.agreement)) if s.agreement else None,
                "torn_bytes_repaired": self.store.torn_bytes, "done_before": self.done_before,
            },
            "routing": {"provider": self.routing.provider, "source": self.routing.source},
            "timeline_columns": TIMELINE_COLUMNS,
            "timeline": s.timeline[-2000:],
        }


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


async def run_generation(cfg: GenerateConfig, *, complete_fn: CompleteFn = complete) -> dict[str, Any]:
    """Generate one dataset; returns the summary (also written to summary.json). Every input error is
    raised before the first completion request; a fatal API error (bad key, no endpoints) is raised
    after the summary is written. `complete_fn` sends one request (tests and benches wrap it)."""
    key = resolve_api_key(cfg.base_url, cfg.api_key_env, cfg.backend)
    async with ClientPool(cfg.base_url, key, concurrency=cfg.concurrency, timeout=cfg.request_timeout_s) as clients:
        run = await Run.start(cfg, clients[0], complete_fn=complete_fn)
        try:
            summary = await run.execute(clients)
        finally:
            run.store.close()
    if run.fatal is not None:
        raise RuntimeError(f"generation stopped: {summary['stop_reason']}: {run.fatal.message}")
    return summary


def generate(cfg: GenerateConfig) -> dict[str, Any]:
    return run_sync(run_generation(cfg), "run_generation")
