"""The generation engine: a dataset's prompts → records, 2000 in flight, resumable, never over budget.

Workers (one coroutine per concurrency slot, none per prompt) pull the next prompt from the file as
they free up, so memory stays flat however many prompts wait. A request starts only when the spend
guard admits its worst case; retries wait in a heap until due so a Retry-After never blocks a slot;
a 429 lowers the number of requests allowed in flight (AIMD) instead of stalling everyone. Every
finished prompt is appended once to the checkpoint store; a kill at any instant loses at most the
requests in flight, which the next run issues again.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Literal

from ..aio import run_sync
from ..errors import InputError
from ..layout import DATASETS_FILE, OUTPUT_DIR, PARAMS_DIR, dataset_files
from ..openrouter import (OPENROUTER_URL, ClientPool, Completion, Kind, Outcome, Price, RoutingDecision,
                          build_request, complete, load_routing, read_balance, resolve_api_key)
from ..records import Record
from ..settings import Settings, setting
from ..text import KimiTokenizer, agreement, load_tokenizer, output_ids, prompt_ids
from .datasets import get_dataset
from .prompts import Prompt, PromptScan, scan_prompts
from .spend import Admit, SpendGuard
from .store import Store

# Outcomes whose cost we cannot know: the server may have finished (and billed) the work.
UNKNOWN_COST = {"malformed", "connection", "client_timeout"}
NO_ENDPOINT_BREAKER = 50  # this many no-endpoint answers in a row, none succeeding: routing is wrong


@dataclass(kw_only=True)
class GenerateConfig(Settings):
    """Every setting of a generation run: generate.ipynb's parameters cell and the command's flags are
    made from these fields (DESIGN.md fixes the first fifteen names)."""

    dataset: str = setting("demo-a", "a name in datasets_file", cli_required=True)
    datasets_file: str = setting(DATASETS_FILE, "name -> {prompts, target_output_tokens}")
    base_url: str = setting(OPENROUTER_URL, "OpenRouter, the emulator, or a local server")
    api_key_env: str = setting("OPENROUTER_API_KEY", "the key is read from this variable only, never stored")
    model: str = setting("moonshotai/kimi-k2.5", "model id sent with every request")
    tokenizer: str | None = setting(None, "local dir or hub id; None -> $EAGLEDATA_TOKENIZER_DIR, else the hub")
    concurrency: int = setting(2000, "requests in flight")
    max_tokens: int = setting(32768, "generation cap per request (reasoning included)")
    temperature: float | None = setting(1.0, "None -> the server's default")
    target_output_tokens: int | None = setting(None, "None -> the datasets file")
    max_spend_usd: float | None = setting(None, "per-run cap; None -> no cap")
    reserve_usd: float = setting(5.0, "account balance never spent")
    output_dir: str = setting(OUTPUT_DIR, "records go to <output_dir>/datasets/<dataset>/")
    limit: int | None = setting(None, "at most this many prompts; None -> all")
    params_dir: str = setting(PARAMS_DIR, "the routing decision is read from <params_dir>/routing/<model>.yaml")
    backend: Literal["openrouter", "local"] = setting(
        "openrouter", "local: an OpenAI-compatible server (vLLM, SGLang) that returns token ids")
    max_attempts: int = setting(8, "per prompt, then failures.jsonl")
    retry_base_s: float = setting(1.0, "backoff: base * 2^attempt, full jitter, capped")
    retry_cap_s: float = setting(60.0, "longest backoff")
    request_timeout_s: float = setting(900.0, "client-side timeout of one request")
    drain_timeout_s: float = setting(60.0, "after a stop signal, in-flight requests get this long")
    balance_refresh_s: float = setting(30.0, "seconds between account balance readings")
    progress: bool = setting(True, "progress bar")

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


@dataclass(order=True)
class _Item:  # a prompt on its way: due time and sequence order the retry heap
    due: float
    seq: int
    prompt: Prompt = field(compare=False)
    attempts: int = field(default=0, compare=False)
    prompt_ids: list[int] | None = field(default=None, compare=False)
    last_error: dict | None = field(default=None, compare=False)


class Run:
    """One generation run over one dataset. Use `await Run.start(cfg)` then `await run.execute()`."""

    def __init__(self, cfg: GenerateConfig, tok: KimiTokenizer, store: Store, routing: RoutingDecision,
                 scan: PromptScan, target: int | None):
        self.cfg, self.tok, self.store, self.routing = cfg, tok, store, routing
        self.total_prompts, self.target = scan.total, target
        worst = routing.worst_price() if cfg.backend == "openrouter" else Price(0.0, 0.0)
        if worst is None:
            raise InputError("the routing decision has no price to reserve against", field="routing")
        self.worst = worst
        self.guard = SpendGuard(worst.prompt_per_m / 1e6, worst.completion_per_m / 1e6, max_tokens=cfg.max_tokens,
                                max_spend_usd=cfg.max_spend_usd, reserve_usd=cfg.reserve_usd)
        self.price_by_provider = {e.provider: e.price for e in routing.eligible if e.priced}
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="eagledata-tok")
        self.cond = asyncio.Condition()
        self.retries: list[_Item] = []
        self.seq = itertools.count()
        self.new_prompts = iter(scan)
        self.prompts_exhausted = False
        self.holding = 0          # items in workers' hands (tokenizing, waiting for money, in flight)
        self.in_flight = 0        # HTTP requests under way
        self.limit = float(cfg.concurrency)
        self.last_decrease = 0.0
        self.stopping = False
        self.stop_reason = ""
        self._signalled = False
        self.fatal: Outcome | None = None
        self.no_endpoint_streak = 0
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.providers: Counter[str] = Counter()
        self.finish: Counter[str] = Counter()
        self.out_tokens = 0
        self.prompt_tokens = 0
        self.reasoning_tokens = 0
        self.done_before = len(store.done)
        self.agreement: list[float] = []
        self.timeline: list[list[float]] = []
        self.t0 = time.monotonic()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.balance_start: float | None = None
        self.bar = None

    # -- setup -----------------------------------------------------------------------------------
    @classmethod
    async def start(cls, cfg: GenerateConfig, client) -> "Run":
        spec = get_dataset(cfg.datasets_file, cfg.dataset)
        if not spec.prompts.is_file():
            raise InputError("prompts file not found", spec.prompts, field=f"{cfg.dataset}.prompts")
        store = Store.open(dataset_files(cfg.dataset, cfg.output_dir))
        try:
            scan = scan_prompts(spec.prompts, store.done, cfg.limit)  # every bad line named before any request
            tok = load_tokenizer(cfg.tokenizer)
            routing = RoutingDecision(model=cfg.model) if cfg.backend == "local" else await load_routing(
                cfg.model, params_dir=cfg.params_dir, base_url=cfg.base_url, api_key_env=cfg.api_key_env)
            run = cls(cfg, tok, store, routing, scan, cfg.target_output_tokens or spec.target_output_tokens)
            if cfg.backend == "openrouter":
                run.balance_start = await read_balance(client)
                run.guard.balance_usd = run.balance_start
        except BaseException:
            store.close()
            raise
        return run

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
                if self.holding >= int(self.limit):
                    pass  # AIMD gate: wait for a slot
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

    async def _release(self, n: int = 1) -> None:
        async with self.cond:
            self.holding -= 1
            self.cond.notify(n)

    async def _admit(self, item: _Item) -> float | None:
        """Reserve the request's worst case; None when the money is gone (or the run is stopping)."""
        async with self.cond:
            while True:
                if self.stopping:
                    return None
                verdict = self.guard.admit(len(item.prompt_ids))
                if verdict is Admit.YES:
                    return self.guard.reserve(len(item.prompt_ids))
                if verdict is Admit.NO or self.guard.in_flight == 0:
                    cap_hit = self.cfg.max_spend_usd is not None and \
                        self.guard.spent_usd + self.guard.worst_case(len(item.prompt_ids)) > self.cfg.max_spend_usd
                    self.stop("max_spend_reached" if cap_hit else "balance_reserve_reached")
                    self.cond.notify_all()
                    return None
                await self.cond.wait()

    async def _in_pool(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- one request ------------------------------------------------------------------------------
    async def worker(self, client) -> None:
        """One concurrency slot: its own connection from `client` (a shard of the pool)."""
        while (item := await self._take()) is not None:
            try:
                await self._work(client, item)
            finally:
                await self._release()

    async def _work(self, client, item: _Item) -> None:
        if item.prompt_ids is None:
            item.prompt_ids = await self._in_pool(prompt_ids, self.tok, item.prompt.messages)
        reserved = await self._admit(item)
        if reserved is None:
            return  # unfinished: the next run issues it again
        body = build_request(self.cfg.model, item.prompt.messages, max_tokens=self.cfg.max_tokens,
                             temperature=self.cfg.temperature, provider=self.routing.provider, backend=self.cfg.backend)
        self.in_flight += 1
        try:
            outcome = await complete(client, body)
        finally:
            self.in_flight -= 1
        item.attempts += 1
        if outcome.kind is Kind.OK:
            await self._record(item, outcome.completion, reserved)
        else:
            await self._not_ok(item, outcome, reserved)

    def _cost(self, c: Completion) -> float:
        """The server's `usage.cost`, else the tokens at the serving provider's price (else the worst)."""
        if c.usage.cost is not None:
            return c.usage.cost
        price = self.price_by_provider.get(c.provider, self.worst)
        return price.cost(c.usage.prompt_tokens, c.usage.completion_tokens)

    def _build_record(self, item: _Item, c: Completion) -> Record:
        a = c.answer
        # A lone surrogate (legal in JSON, not in UTF-8) has no exact ids: refuse it rather than record
        # ids that decode to other text. Raises UnicodeEncodeError.
        a.reasoning.encode("utf-8"), a.content.encode("utf-8")
        ids = output_ids(self.tok, a.reasoning, a.content, a.finish_reason)
        meta: dict[str, Any] = {"attempts": item.attempts}
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

    async def _record(self, item: _Item, c: Completion, reserved: float) -> None:
        cost = self._cost(c)
        try:
            record = await self._in_pool(self._build_record, item, c)
        except UnicodeEncodeError:
            outcome = Outcome(Kind.RETRY, "untokenizable", 200, "answer text is not valid Unicode (lone surrogate)")
            return await self._not_ok(item, outcome, reserved, cost)
        async with self.cond:
            self.guard.settle(reserved, cost)
            if item.prompt.id not in self.store.done:  # a stop signal cannot make us write twice
                self.store.add_record(record, cost)
            self.counts["recorded"] += 1
            self.out_tokens += record.output_tokens
            self.prompt_tokens += c.usage.prompt_tokens
            self.reasoning_tokens += c.usage.reasoning_tokens
            self.providers[c.provider or "?"] += 1
            self.finish[record.finish_reason] += 1
            if "retokenized_agreement" in record.meta:
                self.agreement.append(record.meta["retokenized_agreement"])
            self.no_endpoint_streak = 0
            self.limit = min(float(self.cfg.concurrency), self.limit + 1.0)
            self.cond.notify(2)

    def _backoff(self, item: _Item, outcome: Outcome) -> float:
        if outcome.retry_after is not None:
            return outcome.retry_after + random.uniform(0, 0.1 * max(1.0, outcome.retry_after))
        return random.uniform(0, min(self.cfg.retry_cap_s, self.cfg.retry_base_s * 2 ** item.attempts))

    async def _not_ok(self, item: _Item, outcome: Outcome, reserved: float, cost: float | None = None) -> None:
        cls = outcome.error_class
        async with self.cond:
            # An answer we could not read may still have been billed: book its worst case.
            if cost is None:
                cost = reserved if cls in UNKNOWN_COST else 0.0
            self.guard.settle(reserved, cost)
            self.errors[cls] += 1
            item.last_error = outcome.error_dict()
            if outcome.kind is Kind.RETRY:
                if cls in ("rate_limit", "upstream_rate_limit"):
                    now = time.monotonic()
                    if now - self.last_decrease > 1.0:  # one cut per second, however many 429s arrive
                        self.limit = max(1.0, self.limit * 0.7)
                        self.last_decrease = now
                if cls == "no_endpoint":
                    self.no_endpoint_streak += 1
                    if self.no_endpoint_streak >= NO_ENDPOINT_BREAKER:
                        self.fatal = outcome
                        self.stop("no_endpoints")
                if item.attempts >= self.cfg.max_attempts:
                    self.store.add_failure(item.prompt.id, {**item.last_error, "gave_up_after": "max_attempts"},
                                           item.attempts)
                    self.counts["failed"] += 1
                else:
                    item.due = time.monotonic() + self._backoff(item, outcome)
                    item.seq = next(self.seq)
                    heapq.heappush(self.retries, item)
                    self.counts["retried"] += 1
            elif outcome.kind is Kind.FAILED:
                self.store.add_failure(item.prompt.id, item.last_error, item.attempts)
                self.counts["failed"] += 1
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
    async def _ticker(self, client) -> None:
        last_balance = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            self._sample()
            if self.cfg.backend == "openrouter" and time.monotonic() - last_balance >= self.cfg.balance_refresh_s:
                last_balance = time.monotonic()
                try:
                    balance = await read_balance(client)
                    self.guard.update_balance(balance, self.guard.spent_usd)
                except Exception:  # a failed refresh keeps the last reading (never raises the limit)
                    pass
            async with self.cond:  # periodic wake-up: no waiter can sleep through a state change
                self.cond.notify_all()

    def _sample(self) -> None:
        t = time.monotonic() - self.t0
        self.timeline.append([round(t, 2), self.counts["recorded"], self.out_tokens, round(self.guard.spent_usd, 6),
                              self.in_flight])
        if self.bar is not None:
            total_now = self.store.output_tokens if self.target else self.store.recorded + self.store.failed
            self.bar.n = min(total_now, self.bar.total or total_now)
            cap = f"/{self.cfg.max_spend_usd:g}" if self.cfg.max_spend_usd else ""
            errs = sum(self.errors.values())
            self.bar.set_postfix_str(
                f"done {self.store.recorded + self.store.failed:,}/{self.total_prompts:,} | "
                f"{self.out_tokens / max(t, 1e-9):,.0f} tok/s | in flight {self.in_flight} | "
                f"${self.guard.spent_usd:,.2f}{cap} | errors {errs}"
                + (f" ({', '.join(f'{k} {v}' for k, v in self.errors.most_common(3))})" if errs else ""),
                refresh=False)
            self.bar.refresh()

    def _open_bar(self) -> None:
        if not self.cfg.progress:
            return
        from tqdm.auto import tqdm

        if self.target:
            self.bar = tqdm(total=self.target, initial=min(self.store.output_tokens, self.target), unit="tok",
                            unit_scale=True, desc=f"{self.cfg.dataset} output tokens", dynamic_ncols=True)
        else:
            self.bar = tqdm(total=self.total_prompts, initial=len(self.store.done), unit="prompt",
                            desc=f"{self.cfg.dataset} prompts", dynamic_ncols=True)

    async def execute(self, clients: ClientPool) -> dict[str, Any]:
        self._open_bar()
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
            self._sample()
            if self.bar is not None:
                self.bar.close()
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
                "recorded": self.counts["recorded"], "failed": self.counts["failed"], "retried": self.counts["retried"],
                "output_tokens": self.out_tokens, "prompt_tokens": self.prompt_tokens,
                "reasoning_tokens": self.reasoning_tokens, "spend_usd": round(self.guard.spent_usd, 8),
                "max_spend_usd": self.cfg.max_spend_usd, "reserve_usd": self.cfg.reserve_usd,
                "balance_start_usd": self.balance_start, "concurrency": self.cfg.concurrency,
                "max_tokens": self.cfg.max_tokens, "output_tokens_per_s": round(self.out_tokens / max(wall, 1e-9), 1),
                "usd_per_m_output": round(1e6 * self.guard.spent_usd / self.out_tokens, 4) if self.out_tokens else None,
                "cheapest_eligible_usd_per_m_output": cheapest.completion_per_m if cheapest else None,
                "errors": dict(self.errors), "providers": dict(self.providers), "finish_reasons": dict(self.finish),
                "retokenized_agreement_mean": (sum(self.agreement) / len(self.agreement)) if self.agreement else None,
                "torn_bytes_repaired": self.store.torn_bytes, "done_before": self.done_before,
            },
            "routing": {"provider": self.routing.provider, "source": self.routing.source},
            "timeline_columns": ["t_s", "recorded", "output_tokens", "spend_usd", "in_flight"],
            "timeline": self.timeline[-2000:],
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


async def run_generation(cfg: GenerateConfig) -> dict[str, Any]:
    """Generate one dataset; returns the summary (also written to summary.json). Every input error is
    raised before the first completion request; a fatal API error (bad key, no endpoints) is raised
    after the summary is written."""
    key = resolve_api_key(cfg.base_url, cfg.api_key_env)
    async with ClientPool(cfg.base_url, key, concurrency=cfg.concurrency, timeout=cfg.request_timeout_s) as clients:
        run = await Run.start(cfg, clients[0])
        try:
            summary = await run.execute(clients)
        finally:
            run.store.close()
    if run.fatal is not None:
        raise RuntimeError(f"generation stopped: {summary['stop_reason']}: {run.fatal.message}")
    return summary


def generate(cfg: GenerateConfig) -> dict[str, Any]:
    return run_sync(run_generation(cfg), "run_generation")
