"""Does the engine keep its requests in flight and spend the budget at full speed? (issue 11)

Against the emulator, time-scaled so neither side is CPU-bound on 2 cores: answers are `--scale` times
shorter than the seed's (~2.4k tokens → ~600), prices `--scale` times higher, so worst/mean cost stays
the seed's (~18) and latency against client work stays realistic (tens of seconds against milliseconds).

  seed       (a) the seed replay: $100 balance, $5 reserve, 2,000 in flight, max_tokens 32768/scale. Time to
             charge 90% of usable ÷ the Little's-law ideal at full concurrency, for the engine and for a
             plain client (no budget logic) run the same way; mean in-flight until 90% is charged; the client's
             and the emulator's CPU. `--engine-stream both`: the engine asking for JSON bodies, then streaming.
  background (b) answers/s with 3% OpenRouter + 2% upstream 429s ÷ the same without.
  capacity   (c) one provider that takes `--capacity` requests at once, 2,000 in flight: goodput ÷ the
             allowed rate (capacity ÷ mean latency); the longest stretch with no answer.
  capped     (d) `--runs` seeded runs with a cap under the usual fault mix and heavy-tailed lengths:
             charged ÷ cap per run (strict mode is covered by tests: it cannot pass the cap by construction).
  abandon    what a killed run pays for its requests in flight, streamed or not, and streaming's client CPU.
  cap-then-continue  issue 30's trial: 1,500 prompts with a target, a hostile fault mix, 2,000 in flight, a `--cap`
             run then the uncapped continuation: charged ÷ cap, stop reasons, every prompt once, exact ids.
  job        (e) the user's whole job (issue 23): six datasets (B3-B8), each with its own target, on one balance,
             at seed ratios time-scaled x1/4: $25 balance, $1.25 reserve, 500 in flight, max_tokens 32768, answers
             ~2.4k tokens at ~25 s, the usual fault mix. One run over the six, side by side with the Little's-law
             ideal of one full pool measured on that run's own answers: time to every target ÷ ideal, each
             dataset's tokens ÷ target, charged vs balance - reserve, and the time an oracle pacing would need.
             `--money-share-of-targets 1.67`: money for 60% of the targets. `--baseline`: also the old way, six
             runs one after another on the same balance.
             `--multi-turn 0.4`: 40 % of the prompts are conversations of 2–4 user turns, every turn answered on the
             target's own answers (issue 31); the oracle then runs the same chains.
             `--whole-command`: then the same job as the user's command (papermill generate.ipynb), timed whole:
             the run's start, its last target, its slots' end, its summaries and the process's end ÷ the ideal.
             `--repeat N --pair --multi-turn 0.4`: N seeds, each the single-turn job and then the multi-turn one; both
             medians ÷ their oracles (one run's tail varies by ±10 %).
             Every run prints where the pool's slots were (summary.json's `run.pool`): in flight, or not and why, to
             the last target, to the slots' end and over time. Issue 60's job: `--answers short --whole-share 0.56
             --turns 2 --no-faults --job-speed 1` (answers of ~1,700 tokens in ~4.6 s, 56 % of the pool on
             endpoints that bill whole answers, conversations of two turns).
  panel      (f) what the live panel costs (issue 33): the seed replay's engine, 2,000 in flight, `--panel-balance`
             usable, `--runs` pairs with the panel off and on in turn, each pair on one emulator seed: time to charge
             90 % of usable, off ÷ on (goal >= 0.98), and the panel's frames and drawing time (a share of one core).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from eagledata.emulator import run_emulator
from eagledata.emulator.catalog import default_endpoints
from eagledata.generation import GenerateConfig, run_generation
from eagledata.generation.realtime.attempt import ChatCompletions
from eagledata.openrouter import ClientPool, Kind, build_request, complete, load_routing
from eagledata.openrouter.client import LOCAL_KEY
from eagledata.openrouter.fast_stream import FastStreams
from eagledata.openrouter.stream import StreamState, stream_complete

ROOT = Path(__file__).resolve().parents[1]
SEED_MAX_TOKENS = 32768
MULTI_TURNS = (2, 3, 4)  # user turns of a multi-turn conversation, equally likely
CONVERSATION_STREAM = 1_000_003  # seed offset of a draw's conversation choices (`oracle_time`, pacing_replay.py)
ORACLE_DRAWS = 21  # the oracle is the median over this many draws of the run's answers (one draw varies by ±10 %)
USUAL_FAULTS = {"rate_limit": 0.04, "upstream_rate_limit": 0.02, "bad_gateway": 0.01, "unavailable": 0.01,
                "timeout": 0.005, "error_in_choice": 0.005, "error_top_level": 0.005, "empty_content": 0.005,
                "truncated_json": 0.005, "connection_reset": 0.005, "slow": 0.005}


# issue 60's job (`job --answers short`): reasoning 600–3,000 and content 50–500 tokens (lognormals with those 5th–95th
# percentiles: the emulator's lengths are lognormal), every endpoint 0.35 s to its first token and 400 tokens/s, both
# times the emulator's speed: an answer takes ~4.6 s at speed 1
SHORT_CONTENT = {"reasoning_median": 1342.0, "reasoning_sigma": 0.49, "content_median": 158.0, "content_sigma": 0.70}
SHORT_LATENCY_S, SHORT_THROUGHPUT = 0.35, 400.0


def job_endpoints(answers: str, whole_share: float | None, slots: int) -> list[dict]:
    """The default catalog's endpoints as the job bench changes them: `answers` short, every endpoint at issue 60's
    speed; `whole_share`: that share of the pool goes to endpoints that bill whole answers (the two cheapest, Chutes
    and DeepInfra, cancel and take the rest of the pool at once; what they cannot take falls back to SiliconFlow, the
    cheapest that bills whole; near a cut, requests that leave out those go on to Novita, which cancels)."""
    eps = []
    for e in default_endpoints():
        over: dict[str, Any] = {"provider": e.provider}
        if answers == "short":
            over.update(latency=SHORT_LATENCY_S, throughput=SHORT_THROUGHPUT)
        eps.append(over)
    if whole_share is not None:
        if not 0 < whole_share < 1:
            raise SystemExit("--whole-share must be between 0 and 1")
        cancel = max(2, round((1 - whole_share) * slots))
        caps = {"Chutes": cancel - cancel // 2, "DeepInfra": cancel // 2}
        for over in eps:
            if over["provider"] in caps:
                over["capacity"] = caps[over["provider"]]
    return eps


def scaled_emulator(scale: float, speed: float, **extra: Any) -> dict:
    """The default catalog with prices × scale and answers ÷ scale: cost ratios stay the seed's."""
    eps = [{"provider": e.provider, "prompt_price": e.prompt_price * scale,
            "completion_price": e.completion_price * scale}
           for e in default_endpoints()]
    content = {"reasoning_median": 1500 / scale, "reasoning_sigma": 0.8, "content_median": 300 / scale,
               "content_sigma": 0.7, "max_total": int(32000 / scale)}
    content.update(extra.pop("content", {}))
    return {"speed": speed, "content": content, "endpoints": eps, "generation_delay": 0.1, **extra}


def write_prompts(d: Path, n: int, name: str = "P") -> Path:
    return write_datasets(d, n, {name: None})


def write_datasets(d: Path, n: int, targets: dict[str, int | None], multi_turn: float = 0.0,
                   rng: Any = None, turns_of: tuple[int, ...] = MULTI_TURNS) -> Path:
    """A prompt file of `n` prompts per dataset and the datasets file naming them (with their targets). A share
    `multi_turn` of the prompts are conversations of 2–4 user turns (`turns_of`, equally likely), the dataset's old
    answers between them (which ones: `rng`'s draws, a `random.Random(0)` unless given)."""
    import random

    rng = rng or random.Random(0)
    lines = []
    for name, target in targets.items():
        prompts = d / f"{name}.jsonl"
        with prompts.open("w") as f:
            for i in range(n):
                turns = rng.choice(turns_of) if rng.random() < multi_turn else 1
                msgs = [{"role": "user", "content": f"Question {i}: prove that {i} + {i} is even, then explain."}]
                for j in range(2, turns + 1):
                    msgs += [{"role": "assistant", "content": f"(the dataset's old answer {i}.{j - 1})"},
                             {"role": "user", "content": f"Question {i}.{j}: prove that {i} + {j} is odd or even."}]
                f.write(json.dumps({"id": f"{name}{i:07d}", "messages": msgs}) + "\n")
        lines.append(f"{name}:\n  prompts: {prompts}\n" + (f"  target_output_tokens: {target}\n" if target else ""))
    (d / "datasets.yaml").write_text("".join(lines))
    return d / "datasets.yaml"


def config(d: Path, base_url: str, scale: float, **kw: Any) -> GenerateConfig:
    """The engine's settings at this time scale: the cost prior is the budget model's default, scaled."""
    base = dict(dataset="P", datasets_file=str(d / "datasets.yaml"), base_url=base_url, output_dir=str(d / "out"),
                params_dir=str(d / "params"), concurrency=2000, progress=False, reserve_usd=0.0,
                max_tokens=int(SEED_MAX_TOKENS / scale), prior_output_median_tokens=3000 / scale,
                account_refresh_s=2.0, account_lag_s=0.5)
    base.update(kw)
    return GenerateConfig(**base)


class Monitor:
    """Polls the emulator's books: charged $ and requests in flight over time."""

    def __init__(self, base_url: str, usable: float | None = None):
        self.admin = base_url.rsplit("/api/v1", 1)[0] + "/admin/stats"
        self.usable = usable
        self.samples: list[tuple[float, float, int, int]] = []  # (t, charged, in flight, ok answers)
        self.t0 = time.monotonic()
        self.reached: dict[float, float] = {}

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=10) as c:
            while True:
                s = (await c.get(self.admin)).json()
                t = time.monotonic() - self.t0
                self.samples.append((t, s["charged_usd"], s["in_flight"], s["outcomes"].get("ok", 0)))
                if self.usable:
                    for frac in (0.5, 0.9):
                        if frac not in self.reached and s["charged_usd"] >= frac * self.usable:
                            self.reached[frac] = t
                await asyncio.sleep(0.25)

    def mean_in_flight(self, until_t: float) -> float:
        xs = [n for t, _, n, _ in self.samples if t <= until_t]
        return statistics.fmean(xs) if xs else 0.0

    def rate(self, lo: float, hi: float) -> tuple[float, float]:
        """ok answers/s between the moments lo and hi fractions of the final count were reached; longest gap."""
        final = self.samples[-1][3]
        pts = [(t, k) for t, _, _, k in self.samples]
        t_lo = next(t for t, k in pts if k >= lo * final)
        t_hi = next(t for t, k in pts if k >= hi * final)
        gap, last_t, last_k = 0.0, t_lo, 0
        for t, k in pts:
            if t_lo <= t <= t_hi and k > last_k:
                gap, last_t = max(gap, t - last_t), t
            last_k = k if k > last_k else last_k
        return (hi - lo) * final / max(t_hi - t_lo, 1e-9), gap


async def with_monitor(coro, monitor: Monitor) -> Any:
    task = asyncio.ensure_future(monitor.run())
    try:
        return await coro
    finally:
        task.cancel()


class Timed:
    """A transport (the engine's `Transport` seam) that notes each OK answer's latency and cost (for the Little's-law
    ideal); it sends through `inner` (`timed_run` gives it the engine's own: streams over FastStreams), else
    `openrouter.complete`."""

    def __init__(self) -> None:
        self.inner: Any = None
        self.latency: list[float] = []
        self.cost: list[float] = []
        self.tokens: list[int] = []

    async def handle_request(self, client: httpx.AsyncClient, body: dict, state=None) -> Any:
        t = time.monotonic()
        out = await (self.inner.handle_request(client, body, state) if self.inner else complete(client, body, state))
        if out.kind is Kind.OK:
            self.latency.append(time.monotonic() - t)
            self.cost.append(out.completion.usage.cost or 0.0)
            self.tokens.append(out.completion.usage.completion_tokens)
        return out

    def ideal_s(self, money: float, concurrency: int) -> float:
        """Little's law: at N in flight, $ per second = N × mean cost / mean latency."""
        return money / (concurrency * statistics.fmean(self.cost) / statistics.fmean(self.latency))


async def timed_run(cfg: GenerateConfig, timed: Timed) -> dict:
    """`run_generation(cfg)` through `timed` wrapped around the transport a run makes for itself (streams read over
    FastStreams), so the bench measures the engine's own read path."""
    async with FastStreams() as fast:
        timed.inner = ChatCompletions(cfg.stall_timeout_s, fast_streams=fast)
        return await run_generation(cfg, transport=timed)


async def plain_client(base_url: str, d: Path, n: int, concurrency: int, max_tokens: int, monitor: Monitor,
                       timed: Timed) -> None:
    """No budget logic, no retries policy: N workers send prompts until 90% of the money is charged."""
    routing = await load_routing("moonshotai/kimi-k2.5", params_dir=str(d / "params"), base_url=base_url,
                                 api_key_env="OPENROUTER_API_KEY")
    prompts = iter(range(n))

    async def worker(client: httpx.AsyncClient) -> None:
        while 0.9 not in monitor.reached and (i := next(prompts, None)) is not None:
            msgs = [{"role": "user", "content": f"Question {i}: prove that {i} + {i} is even, then explain."}]
            await timed.handle_request(client, build_request("moonshotai/kimi-k2.5", msgs, max_tokens=max_tokens,
                                                             temperature=1.0, provider=routing.provider))

    async with ClientPool(base_url, LOCAL_KEY, concurrency=concurrency, timeout=900) as clients:
        workers = [asyncio.ensure_future(worker(clients[i])) for i in range(concurrency)]
        while 0.9 not in monitor.reached and not all(w.done() for w in workers):
            await asyncio.sleep(0.1)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def seed(a: argparse.Namespace) -> None:
    balance, reserve = a.balance, a.balance * 0.05
    usable = balance - reserve
    max_tokens = int(SEED_MAX_TOKENS / a.scale)
    emu_cfg = scaled_emulator(a.scale, a.speed, balance=balance, seed=a.seed)
    print(f"(a) seed replay: ${usable:g} usable (balance ${balance:g} - reserve ${reserve:g}), 2,000 in flight, "
          f"max_tokens {max_tokens}, answers ~{2400 / a.scale:.0f} tokens, speed {a.speed}", flush=True)
    ideal = None
    engines = {"on": ("engine",), "off": ("json",), "both": ("json", "engine")}[a.engine_stream]
    for who in ("plain", *engines, *(("strict",) if a.strict else ())):
        with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:  # a fresh account each
            d = Path(tmp)
            write_prompts(d, 60_000)
            mon, timed = Monitor(emu.base_url, usable), Timed()
            t0, cpu0, emu0 = time.monotonic(), time.process_time(), process_cpu_s(emu.process.pid)
            if who == "plain":
                asyncio.run(with_monitor(plain_client(emu.base_url, d, 60_000, 2000, max_tokens, mon, timed), mon))
                ideal = timed.ideal_s(0.9 * usable, 2000)
                print(f"    Little's-law ideal to charge 90% at 2,000 in flight: {ideal:.1f} s (mean answer "
                      f"${statistics.fmean(timed.cost):.4f}, {statistics.fmean(timed.latency):.1f} s)")
                stop = "charged 90%"
            else:
                s = asyncio.run(with_monitor(timed_run(
                    config(d, emu.base_url, a.scale, reserve_usd=reserve, stream=who != "json",
                           budget_mode="strict" if who == "strict" else "portfolio"), timed), mon))
                stop = s["stop_reason"]
            wall = time.monotonic() - t0
            cpu, emu_cpu = time.process_time() - cpu0, process_cpu_s(emu.process.pid) - emu0
            t90, t50 = mon.reached.get(0.9), mon.reached.get(0.5)
            inflight = mon.mean_in_flight(t90 or wall)
            charged = emu.stats()["charged_usd"]
        ratio = f"{t90 / ideal:.3f}x ideal" if t90 and ideal else "never reached 90%"
        print(f"    {who:6s}: 50% at {t50 or float('nan'):.1f} s, 90% at {t90 or float('nan'):.1f} s = {ratio}; "
              f"mean in flight until then {inflight:,.0f} ({inflight / 2000:.3f} of 2,000); charged ${charged:.2f} "
              f"({charged / usable:.3f} of usable), stop: {stop}, wall {wall:.0f} s; CPU: client {cpu:.0f} s "
              f"({cpu / wall:.2f} cores), emulator {emu_cpu:.0f} s ({emu_cpu / wall:.2f} cores)", flush=True)


def panel(a: argparse.Namespace) -> None:
    from eagledata.generation.report.panel import LivePanel

    usable = a.panel_balance
    max_tokens = int(SEED_MAX_TOKENS / a.scale)
    print(f"(f) the live panel: ${usable:g} usable, 2,000 in flight, max_tokens {max_tokens}, answers "
          f"~{2400 / a.scale:.0f} tokens, speed {a.speed}, {a.runs} pairs (off, on)", flush=True)
    ratios = []
    for i in range(a.runs):
        t90 = {}
        for who in ("off", "on"):
            emu_cfg = scaled_emulator(a.scale, a.speed, balance=usable, seed=a.seed + i)
            with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:
                d = Path(tmp)
                write_prompts(d, 60_000)
                mon, panels = Monitor(emu.base_url, usable), []
                view = ((lambda snap, panels=panels: panels.append(LivePanel(snap, show=None)) or panels[0])
                        if who == "on" else None)
                cpu0, t0 = time.process_time(), time.monotonic()
                s = asyncio.run(with_monitor(run_generation(config(d, emu.base_url, a.scale), view=view), mon))
                wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
            t90[who] = mon.reached.get(0.9, math.nan)
            drawn = (f"; {panels[0].frames} frames, drawing {panels[0].busy_s:.1f} s = "
                     f"{panels[0].busy_s / wall:.3f} of one core") if panels else ""
            print(f"    pair {i + 1} panel {who:3s}: 90% charged at {t90[who]:.1f} s, wall {wall:.0f} s, "
                  f"{s['run']['output_tokens'] / wall:,.0f} output tok/s, client CPU {cpu:.0f} s "
                  f"({cpu / wall:.2f} cores), stop {s['stop_reason']}{drawn}", flush=True)
        ratios.append(t90["off"] / t90["on"])
        print(f"    pair {i + 1}: off ÷ on {ratios[-1]:.3f}", flush=True)
    print(f"    throughput with the panel ÷ without (time to 90 % charged, off ÷ on): median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}", flush=True)


def background(a: argparse.Namespace) -> None:
    rates = {}
    for label, faults in (("none", {}), ("429s", {"rate_limit": 0.03, "upstream_rate_limit": 0.02})):
        emu_cfg = scaled_emulator(a.scale, a.speed / 2, balance=10_000, seed=a.seed, faults=faults)
        with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            write_prompts(d, a.prompts)
            mon = Monitor(emu.base_url)
            s = asyncio.run(with_monitor(run_generation(config(d, emu.base_url, a.scale)), mon))
            rates[label], gap = mon.rate(0.1, 0.9)
            print(f"(b) {label}: {s['run']['recorded']:,} recorded in {s['wall_s']:.0f} s, "
                  f"{rates[label]:.1f} answers/s (10-90%), mean in flight {mon.mean_in_flight(1e9):,.0f}, "
                  f"errors {s['run']['errors']}, concurrency cuts {len(s['run']['concurrency_changes'])}")
    print(f"(b) throughput with 5% background 429s / without: {rates['429s'] / rates['none']:.3f}")


def capacity(a: argparse.Namespace) -> None:
    ep = {"provider": "Solo", "slug": "solo", "quantization": "int4", "prompt_price": 0.5 * a.scale,
          "completion_price": 2.4 * a.scale, "latency": 1.0, "throughput": 45.0, "capacity": a.capacity}
    emu_cfg = scaled_emulator(a.scale, a.speed / 2, balance=10_000, seed=a.seed, replace_endpoints=True)
    emu_cfg["endpoints"] = [ep]
    with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_prompts(d, a.prompts)
        mon, timed = Monitor(emu.base_url), Timed()
        s = asyncio.run(with_monitor(run_generation(config(d, emu.base_url, a.scale),
                                                    transport=timed), mon))
        goodput, gap = mon.rate(0.1, 0.8)
        # The provider's own time per answer (first token + generation), whatever the client's queueing:
        service = statistics.fmean(emu_cfg["speed"] * (ep["latency"] + n / ep["throughput"]) for n in timed.tokens)
        allowed = a.capacity / service
        print(f"(c) one provider taking {a.capacity} at once, 2,000 in flight: {s['run']['recorded']:,} recorded in "
              f"{s['wall_s']:.0f} s; goodput {goodput:.1f}/s vs allowed {allowed:.1f}/s = {goodput / allowed:.3f}; "
              f"longest stretch without an answer {gap:.2f} s; "
              f"429s {s['run']['errors'].get('upstream_rate_limit', 0):,}; "
              f"limit history {s['run']['concurrency_changes'][:12]}")


def capped(a: argparse.Namespace) -> None:
    used = []
    for i in range(a.runs):
        speed = a.speed / 15
        emu_cfg = scaled_emulator(a.scale, speed, balance=1000, seed=a.first_seed + i,
                                  faults={**USUAL_FAULTS, "slow_seconds": 30 * speed},
                                  content={"reasoning_sigma": 1.2, "content_sigma": 1.0})
        with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            write_prompts(d, 20_000)
            t0 = time.monotonic()
            s = asyncio.run(run_generation(config(d, emu.base_url, a.scale, concurrency=500, max_spend_usd=a.cap)))
            charged = emu.stats()["charged_usd"]
            used.append(charged / a.cap)
            print(f"(d) seed {a.first_seed + i}: charged ${charged:.4f} of ${a.cap:g} = {charged / a.cap:.3f} in "
                  f"{time.monotonic() - t0:.0f} s; summary charged ${s['run']['charged_usd']:.4f} recorded "
                  f"${s['run']['recorded_usd']:.4f} wasted ${s['run']['wasted_usd']:.4f}; stop {s['stop_reason']}",
                  flush=True)
    print(f"(d) {a.runs} runs: charged/cap min {min(used):.3f} median {statistics.median(used):.3f} "
          f"max {max(used):.3f}; over the cap in {sum(u > 1 for u in used)} runs")


HOSTILE_FAULTS = {cls: 0.03 for cls in USUAL_FAULTS} | {"rate_limit": 0.06, "upstream_rate_limit": 0.04}


def cap_then_continue(a: argparse.Namespace) -> None:
    """Issue 30's trial: one dataset of 1,500 prompts with a token target, a hostile fault mix, 2,000 in flight,
    a `--cap` run, then the uncapped continuation. Figures: the capped run's charge ÷ cap, time, stop reason; the
    continuation's stop reason; every prompt once (records + failures), ids equal to the emulator's."""
    from eagledata.records import load_records

    speed = a.speed / 15
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        truth_file = d / "truth.jsonl"
        emu_cfg = {"speed": a.job_speed, "balance": 1000, "seed": a.seed, "generation_delay": 0.1,
                   "ground_truth_file": str(truth_file), "faults": {**HOSTILE_FAULTS, "slow_seconds": 30 * speed}}
        with run_emulator(emu_cfg) as emu:
            n = 1500
            target = int(n * 2480 * 0.8)  # ~80 % of what the prompts hold: the continuation ends at the target
            write_datasets(d, n, {"P": target})
            kw = dict(dataset="P", datasets_file=str(d / "datasets.yaml"), base_url=emu.base_url,
                      output_dir=str(d / "out"), params_dir=str(d / "params"), concurrency=2000, progress=False,
                      reserve_usd=0.0, max_tokens=SEED_MAX_TOKENS, account_refresh_s=5.0, account_lag_s=2.0)
            t0 = time.monotonic()
            s1 = asyncio.run(run_generation(GenerateConfig(max_spend_usd=a.cap, **kw)))
            t1 = time.monotonic() - t0
            charged1 = emu.stats()["charged_usd"]
            left = s1["run"]["money_left"] or {}
            print(f"capped: charged ${charged1:.4f} of ${a.cap:g} = {charged1 / a.cap:.3f} in {t1:.0f} s; stop "
                  f"{s1['stop_reason']}; {s1['records']} records, {s1['remaining']} remaining; issuing stopped with "
                  f"${left.get('usd', float('nan')):.4f} left, {left.get('in_flight')} in flight "
                  f"({left.get('why')}); abandoned {s1['run']['abandoned']}", flush=True)
            t0 = time.monotonic()
            s2 = asyncio.run(run_generation(GenerateConfig(**kw)))
            records = load_records(d / "out" / "datasets" / "P" / "records.jsonl")
            failures = (d / "out" / "datasets" / "P" / "failures.jsonl")
            failed = [json.loads(x)["id"] for x in failures.read_text().splitlines() if x.strip()] \
                if failures.exists() else []
            ids = [r.id for r in records] + failed
            truth = {}
            for line in truth_file.read_text().splitlines():
                g = json.loads(line)
                truth[g["generation_id"]] = g
            exact = sum(r.output_ids == truth[r.generation_id]["output_ids"] for r in records)
            print(f"continued: stop {s2['stop_reason']} in {time.monotonic() - t0:.0f} s; {s2['output_tokens']:,} of "
                  f"{target:,} target tokens; {len(records)} records + {len(failed)} failures, {len(set(ids))} "
                  f"distinct of {len(ids)} (duplicates: {len(ids) - len(set(ids))}); ids equal to the emulator's: "
                  f"{exact} of {len(records)}", flush=True)


async def _abandoning_client(base_url: str, routing: Any, stream: bool, concurrency: int, max_tokens: int,
                             seconds: float) -> tuple[int, int, float]:
    """N workers for `seconds`, then every connection dropped at once, as a killed process drops them.
    Returns (answers, SSE chunks, client CPU seconds)."""
    answers = chunks = 0

    async def worker(client: httpx.AsyncClient, i: int) -> None:
        nonlocal answers, chunks
        while True:
            i += concurrency
            msgs = [{"role": "user", "content": f"Question {i}: prove that {i} + {i} is even, then explain."}]
            body = build_request("moonshotai/kimi-k2.5", msgs, max_tokens=max_tokens, temperature=1.0,
                                 provider=routing.provider)
            if not stream:
                await complete(client, body)
            else:  # the library's stream reader (openrouter/stream.py), as the engine reads answers
                state = StreamState()
                try:
                    await stream_complete(client, body, state)
                finally:
                    chunks += state.chunks
            answers += 1

    cpu = time.process_time()
    pool = ClientPool(base_url, LOCAL_KEY, concurrency=concurrency, timeout=900)
    workers = [asyncio.ensure_future(worker(pool[i], i)) for i in range(concurrency)]
    await asyncio.sleep(seconds)
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    await pool.__aexit__()
    return answers, chunks, time.process_time() - cpu


def abandon(a: argparse.Namespace) -> None:
    """What a killed run still pays for: its requests in flight, streamed (providers with stream cancellation
    stop billing) or not (every answer is generated and billed to the end); and what streaming costs the client."""
    max_tokens = int(SEED_MAX_TOKENS / a.scale)
    emu_cfg = scaled_emulator(a.scale, a.speed, balance=10_000, seed=a.seed)
    with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:
        routing = asyncio.run(load_routing("moonshotai/kimi-k2.5", params_dir=str(Path(tmp) / "params"),
                                           base_url=emu.base_url, api_key_env="OPENROUTER_API_KEY"))
        for stream in (False, True):
            emu.reset(emu_cfg)
            answers, chunks, cpu = asyncio.run(_abandoning_client(emu.base_url, routing, stream, a.abandon_concurrency,
                                                                  max_tokens, a.seconds))
            at_kill = emu.stats()["charged_usd"]
            while emu.stats()["in_flight_worst_usd"] > 1e-9:  # the abandoned generations run out
                time.sleep(0.5)
            after = emu.stats()
            paid = after["charged_usd"] - at_kill
            print(f"abandon: {'stream' if stream else 'plain '} {a.abandon_concurrency} in flight, killed after "
                  f"{a.seconds:g} s ({answers:,} answers): ${at_kill:.3f} charged at the kill, ${paid:.3f} more for "
                  f"the abandoned requests ({paid / max(at_kill, 1e-9):.1%}); outcomes {after['outcomes']}; client CPU "
                  f"{1e3 * cpu / max(answers, 1):.2f} ms per answer"
                  + (f", {chunks / max(answers, 1):.0f} chunks per answer, "
                     f"{1e6 * cpu / max(chunks, 1):.0f} us CPU per chunk" if stream else ""))


def oracle_time(pairs: list[tuple[float, int]], targets: dict[str, int], slots: int, seed: int,
                aim: float = 1.05, multi_turn: float = 0.0, keep_chains: bool = False,
                turns_of: tuple[int, ...] = MULTI_TURNS) -> float:
    """What no pacing can beat, in simulated time: answers drawn from this run's own (latency, tokens), and a
    scheduler that knows the length of every answer in flight (not of the next one). It keeps the pool full,
    gives each slot to the dataset furthest behind, and stops a dataset once its true tokens in flight would take
    it to `aim` × target (5 % over, the most allowed). With `multi_turn`, that share of conversations has 2–4 turns
    in a chain: a finished turn's next one starts at once, while its dataset is open; with `keep_chains` under the
    engine's rule instead: a started conversation's later turns count (at the mean answer, their lengths are not
    known yet) against a new conversation, and it goes on until its dataset's target is recorded. Returns the time
    every target was recorded."""
    import heapq
    import random

    rng = random.Random(seed)  # the answers, in the order requests start
    turns = random.Random(CONVERSATION_STREAM + seed)  # which are conversations: its own stream, so that a draw
    # with the multi-turn mix sends the same answers in the same order as without (paired, not two samples)
    mean = statistics.fmean(n for _, n in pairs)
    recorded, flying, promised = dict.fromkeys(targets, 0), dict.fromkeys(targets, 0), dict.fromkeys(targets, 0)
    ends: list = []
    met: dict[str, float] = {}
    t, seq = 0.0, 0
    while True:
        while len(ends) < slots:
            open_ = [n for n in targets if recorded[n] + flying[n] + (promised[n] + 1) * mean <= aim * targets[n]]
            if not open_:
                break
            name = min(open_, key=lambda n: (recorded[n] + flying[n] + promised[n] * mean) / targets[n])
            later = turns.choice(turns_of) - 1 if turns.random() < multi_turn else 0
            promised[name] += later if keep_chains else 0
            latency, tokens = rng.choice(pairs)
            flying[name] += tokens
            seq += 1
            heapq.heappush(ends, (t + latency, seq, name, tokens, later))
        if not ends:
            return max(met.values()) if len(met) == len(targets) else math.inf
        t, _, name, tokens, later = heapq.heappop(ends)
        flying[name] -= tokens
        recorded[name] += tokens
        if keep_chains:
            go_on = recorded[name] < targets[name]
            promised[name] -= later if not go_on else 1 if later else 0
        else:
            go_on = recorded[name] + flying[name] + mean <= aim * targets[name]
        if later and go_on:  # the chain goes on
            latency, tokens = rng.choice(pairs)
            flying[name] += tokens
            seq += 1
            heapq.heappush(ends, (t + latency, seq, name, tokens, later - 1))
        if name not in met and recorded[name] >= targets[name]:
            met[name] = t


def _job_report(label: str, per: dict[str, dict], targets: dict[str, int], met_at: list[float | None], wall: float,
                ideal: float, charged: float, usable: float) -> None:
    shares = {n: per[n]["output_tokens"] / targets[n] for n in targets}
    last = None if any(m is None for m in met_at) else max(met_at)
    ratio = f"{last / ideal:.2f}x ideal" if last is not None else "not every target met"
    print(f"    {label}: every target met at {last if last is not None else float('nan'):.0f} s = {ratio}; run "
          f"ended at {wall:.0f} s = {wall / ideal:.2f}x; charged ${charged:.2f} of ${usable:.2f} usable "
          f"({charged / usable:.3f}); tokens / target " + ", ".join(f"{n} {v:.3f}" for n, v in shares.items()) +
          f" (spread {max(shares.values()) - min(shares.values()):.3f}); stops "
          + ", ".join(sorted({per[n]['stop_reason'] for n in targets})), flush=True)


def job(a: argparse.Namespace) -> None:
    """`--repeat` runs on seeds `--seed`, `--seed` + 1, …; with `--pair` each seed runs the single-turn job and then
    the `--multi-turn` one, so the two are compared on runs of the same hour (one run's time to its last target varies
    by ±10 %: its tail is a few long answers)."""
    mixes = [0.0, a.multi_turn] if a.pair else [a.multi_turn]
    ratios: dict[float, list[tuple[float, float, float]]] = {m: [] for m in mixes}
    for seed in range(a.seed, a.seed + a.repeat):
        for mix in mixes:
            ratios[mix].append(_job_run(a, seed, mix))
    if a.pair or a.repeat > 1:
        print(f"(e) {a.repeat} seed(s) from {a.seed}: the run's last target ÷ the oracle's (÷ the ideal; the most "
              f"tokens ÷ target)")
        for mix, got in ratios.items():
            done = [r for r in got if not math.isnan(r[0])]
            median = statistics.median(r[0] for r in done) if done else float("nan")
            print(f"    {mix:.0%} multi-turn: " + ", ".join(f"{o:.2f}x ({i:.2f}x; {w:.3f})" for o, i, w in got)
                  + f"; median {median:.2f}x the oracle", flush=True)


def _job_run(a: argparse.Namespace, seed: int, multi_turn: float) -> tuple[float, float, float]:
    """One run of the job on emulator seed `seed`; returns its last target ÷ the oracle's and ÷ the ideal, and the
    most any dataset holds ÷ its target."""
    balance, reserve, slots = 25.0, 1.25, 500
    usable = balance - reserve
    names = [f"B{i}" for i in range(3, 9)]
    emu_cfg = {"speed": a.job_speed, "balance": balance, "seed": seed, "generation_delay": 0.1,
               "faults": {**USUAL_FAULTS, "slow_seconds": 30 * a.job_speed} if a.faults else {},
               **({"endpoints": job_endpoints(a.answers, a.whole_share, slots)}
                  if a.answers != "job" or a.whole_share is not None else {}),
               **({"content": SHORT_CONTENT} if a.answers == "short" else {})}
    turns_of = tuple(int(x) for x in a.turns.split(","))
    with run_emulator(emu_cfg) as emu, tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        routing = asyncio.run(load_routing("moonshotai/kimi-k2.5", params_dir=str(d / "params"), base_url=emu.base_url,
                                           api_key_env="OPENROUTER_API_KEY"))
        price = routing.cheapest().completion_per_m / 1e6
        each = int(usable * a.money_share_of_targets / price / len(names))  # one target: its share of the money
        targets = dict.fromkeys(names, each)
        datasets = write_datasets(d, 20_000, targets, multi_turn=multi_turn, turns_of=turns_of)
        print(f"(e) the job: {len(names)} datasets x {each:,} output tokens "
              f"(money for {1 / a.money_share_of_targets:.0%} of them at ${price * 1e6:.2f}/M), ${balance:g} balance, "
              f"${reserve:g} reserve, {slots} in flight, max_tokens {SEED_MAX_TOKENS}, speed {a.job_speed}, "
              f"faults {'on' if a.faults else 'off'}, {multi_turn:.0%} multi-turn ({a.turns} turns), answers "
              f"{a.answers}" + (f", {a.whole_share:.0%} of the pool on endpoints that bill whole answers"
                                if a.whole_share is not None else ""), flush=True)
        kw = dict(datasets_file=str(datasets), base_url=emu.base_url, params_dir=str(d / "params"), concurrency=slots,
                  progress=False, reserve_usd=reserve, max_tokens=SEED_MAX_TOKENS, account_refresh_s=5.0,
                  account_lag_s=2.0, straggler_wait_s=a.straggler_wait, stream=a.engine_stream != "off")
        timed = Timed()
        t0 = time.monotonic()
        s = asyncio.run(timed_run(GenerateConfig(dataset=names, output_dir=str(d / "one"), **kw), timed))
        wall = time.monotonic() - t0
        if a.save:
            save = Path(a.save)
            if a.pair or a.repeat > 1:  # one file a run: name.s<seed>-mt<share>.json
                save = save.with_name(f"{save.stem}.s{seed}-mt{multi_turn:g}{save.suffix}")
            save.write_text(json.dumps({"summary": s, "answers": list(zip(timed.latency, timed.tokens))}))
        ideal = sum(targets.values()) / (slots * statistics.fmean(timed.tokens) / statistics.fmean(timed.latency))
        print(f"    ideal of one full pool: {ideal:.0f} s ({sum(targets.values()):,} tokens; mean answer "
              f"{statistics.fmean(timed.tokens):,.0f} tokens in {statistics.fmean(timed.latency):.1f} s over "
              f"{len(timed.tokens):,} answers)")
        _job_report("one run ", s["datasets"], targets, [x["run"]["target_met_s"] for x in s["datasets"].values()],
                    wall, ideal, emu.stats()["charged_usd"], usable)
        timing, opened = s["run"]["timing"], wall - s["wall_s"]  # before the engine's clock: stores, prompts, routing
        print(f"    where the time went (from the call): the run began at {opened:.1f} s; every target met at "
              f"{opened + (timing['last_target_s'] or math.nan):.1f} s; its slots ended at "
              f"{opened + timing['slots_end_s']:.1f} s; its summaries written at {wall:.1f} s; in flight to the last "
              f"target {held_on_average(s, timing['last_target_s']):.0f} of {slots} on average; wasted (charged - "
              f"recorded) ${s['run']['wasted_usd'] or 0:.4f}", flush=True)
        print(pool_split(s), flush=True)
        if s["stop_reason"] in ("balance_reserve_reached", "max_spend_reached"):  # the money's end came first
            money_ideal = timed.ideal_s(usable, slots)
            left = s["run"]["money_left"] or {}
            print(f"    the money's end: ideal of one full pool spending ${usable:g} (Little's law on this run's "
                  f"answers): {money_ideal:.0f} s; issuing stopped with ${left.get('usd', float('nan')):.3f} left "
                  f"({left.get('in_flight')} in flight: {left.get('why')}); run ended at {wall:.0f} s = "
                  f"{wall / money_ideal:.2f}x; charged {emu.stats()['charged_usd'] / usable:.3f} of usable; "
                  f"abandoned {s['run']['abandoned']}", flush=True)
        pairs = list(zip(timed.latency, timed.tokens))
        bound = statistics.median(oracle_time(pairs, targets, slots, draw, multi_turn=multi_turn,
                                              turns_of=turns_of) for draw in range(ORACLE_DRAWS))
        last = [x["run"]["target_met_s"] for x in s["datasets"].values()]
        if multi_turn:
            kept = statistics.median(oracle_time(pairs, targets, slots, draw, multi_turn=multi_turn, keep_chains=True,
                                                 turns_of=turns_of) for draw in range(ORACLE_DRAWS))
            print(f"    an oracle under the engine's chain rule (a started conversation goes on until its target, its "
                  f"later turns counted): every target at {kept:.0f} s = {kept / ideal:.2f}x ideal; the run's last "
                  f"target ÷ this oracle's: {max(last) / kept if None not in last else float('nan'):.2f}x", flush=True)
        print(f"    an oracle that knows every answer's length once it starts (5 % over allowed, median of "
              f"{ORACLE_DRAWS} draws of this run's answers): every target at {bound:.0f} s = "
              f"{bound / ideal:.2f}x ideal; the run's last target ÷ the oracle's: "
              f"{max(last) / bound if None not in last else float('nan'):.2f}x", flush=True)
        if multi_turn:
            per_turn = {n: x["records"] for n, x in s["datasets"].items()}
            print(f"    records (turns) per dataset: {per_turn}; conversations left open: "
                  f"{sum(x['open_conversations'] for x in s['datasets'].values())}", flush=True)
        if a.whole_command:
            emu.reset(emu_cfg)  # a fresh account: the same balance again
            whole_command(d, {**kw, "dataset": names, "output_dir": str(d / "papermill")}, ideal)
        if a.baseline:
            emu.reset(emu_cfg)  # a fresh account: the same balance again
            per, met, t0, elapsed = {}, [], time.monotonic(), 0.0
            for name in names:
                one = asyncio.run(run_generation(GenerateConfig(dataset=name, output_dir=str(d / "seq"), **kw)))
                per[name] = one
                met.append(None if one["run"]["target_met_s"] is None else elapsed + one["run"]["target_met_s"])
                elapsed = time.monotonic() - t0
            _job_report("six runs", per, targets, met, elapsed, ideal, emu.stats()["charged_usd"], usable)
    worst = max(x["output_tokens"] / targets[n] for n, x in s["datasets"].items())
    if None in last:
        return math.nan, math.nan, worst
    return max(last) / bound, max(last) / ideal, worst


POOL_WINDOWS = 8  # the pool's split over time: this many windows up to the slots' end


def pool_split(summary: dict[str, Any], indent: str = "    ") -> str:
    """Where the pool's slots were (summary.json's `run.pool`, generation/realtime/pool.py): mean slots per state up
    to the last target and over the run, then over time (POOL_WINDOWS windows up to the slots' end)."""
    pool = summary["run"].get("pool")
    if not pool:
        return f"{indent}the pool: not in this summary"
    slots = pool["slots"]

    def states(mean: dict[str, float]) -> str:
        idle = sum(v for c, v in mean.items() if c.startswith("idle_"))
        return (f"in flight {mean['in_flight']:.1f} ({mean['in_flight'] / slots:.1%}); not: preparing "
                f"{mean['preparing']:.1f}, money {mean['money']:.1f}, recording {mean['recording']:.1f}, "
                f"idle {idle:.1f} (" + ", ".join(f"{c[5:]} {v:.1f}" for c, v in mean.items()
                                                 if c.startswith("idle_")) + ")")

    lines = []
    for key, what in (("until_last_target", "to the last target"), ("whole_run", "to the slots' end")):
        if (m := pool.get(key)) is not None:
            lines.append(f"{indent}the pool {what} ({m['seconds']:.0f} s, mean of {slots} slots): {states(m['mean'])}")
    cols, rows = pool["timeline_columns"], pool["timeline"]
    if rows:
        end, start, acc = rows[-1][0], 0.0, [0.0] * (len(cols) - 1)
        edges = [end * (i + 1) / POOL_WINDOWS for i in range(POOL_WINDOWS)]
        out, prev = [], 0.0
        for row in rows:
            acc = [a + v * (row[0] - prev) for a, v in zip(acc, row[1:])]
            prev = row[0]
            if row[0] >= edges[len(out)] - 1e-9:
                width = row[0] - start
                mean = {c: a / width for c, a in zip(cols[1:], acc)} if width > 0 else dict.fromkeys(cols[1:], 0.0)
                idle = sorted(((v, c) for c, v in mean.items() if c != "in_flight" and v >= 0.5), reverse=True)
                out.append(f"{start:.0f}-{row[0]:.0f} s {mean['in_flight']:.0f}" +
                           (" (" + ", ".join(f"{c.removeprefix('idle_')} {v:.0f}" for v, c in idle) + ")" if idle
                            else ""))
                start, acc = row[0], [0.0] * (len(cols) - 1)
                if len(out) == POOL_WINDOWS:
                    break
        lines.append(f"{indent}in flight over time (and the rest, ≥ 0.5 slot): " + "; ".join(out))
    return "\n".join(lines)


def held_on_average(summary: dict[str, Any], until: float | None) -> float:
    """Requests in flight, time-weighted over the run's timeline up to `until` (its last target)."""
    cols, rows = summary["timeline_columns"], summary["timeline"]
    t, n = cols.index("t_s"), cols.index("in_flight")
    rows = [r for r in rows if until is None or r[t] <= until]
    if len(rows) < 2:
        return math.nan
    return sum((b[t] - a[t]) * a[n] for a, b in zip(rows, rows[1:])) / (rows[-1][t] - rows[0][t])


def whole_command(d: Path, params: dict[str, Any], ideal: float) -> None:
    """The same job as the user runs it: `papermill notebooks/generate.ipynb` in a process of its own (its kernel,
    imports, run, report cells), timed from its start to its exit. The engine's moments come from the summaries:
    its start is the summaries' `started_at` (to the second), `run.timing` gives its last target and its slots'
    end. `ideal`: the in-process run's, on the same seed (one pool's ideal varies by ~1 % between runs)."""
    params = {k: v for k, v in params.items() if k != "progress"}  # the user's default: status lines
    out = d / "generate.out.ipynb"
    cmd = [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "generate.ipynb"), str(out),
           "-y", json.dumps(params), "--cwd", str(ROOT)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    end = time.time() - t0
    if proc.returncode:
        print(f"    the whole command failed ({proc.returncode}): {proc.stderr[-2000:]}", flush=True)
        return
    files = [Path(params["output_dir"]) / "datasets" / n / "summary.json" for n in params["dataset"]]
    s = json.loads(files[0].read_text())
    start = datetime.fromisoformat(s["started_at"]).timestamp() - t0
    timing = s["run"]["timing"]
    marks = [("the run began", start), ("every target met", start + timing["last_target_s"]),
             ("its slots ended", start + timing["slots_end_s"]), ("its summaries written", start + s["wall_s"]),
             ("the process ended", end)]
    print("    the whole command (papermill notebooks/generate.ipynb, the same job on a fresh account): "
          + "; ".join(f"{what} at {t:.0f} s = {t / ideal:.2f}x" for what, t in marks)
          + f" (the kernel had lived {timing['before_start_s']:.1f} s when the run began)", flush=True)
    cells = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    print("    its code cells (papermill's durations): " + "; ".join(
        f"{c['source'].splitlines()[0][:40] if isinstance(c['source'], str) else c['source'][0][:40].strip()!r} "
        f"{c['metadata']['papermill']['duration']:.1f} s" for c in cells), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["seed", "background", "capacity", "capped", "abandon", "job", "cap-then-continue",
                                      "panel", "all"])
    ap.add_argument("--scale", type=float, default=4.0, help="answers this many times shorter, prices higher")
    ap.add_argument("--speed", type=float, default=1.5, help="emulator time scale (1 = the catalog's latencies)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--strict", action="store_true", help="(a): also run budget_mode strict")
    ap.add_argument("--balance", type=float, default=100.0,
                    help="(a): the account's balance (reserve 5 %%); smaller: a shorter run")
    ap.add_argument("--engine-stream", choices=["on", "off", "both"], default="on",
                    help="(a): the engine streams (on, the default), asks for JSON bodies (off), or both, one after "
                         "the other (issue 42); the plain client always asks for JSON. (e) job: streams unless off")
    ap.add_argument("--prompts", type=int, default=12_000)
    ap.add_argument("--capacity", type=int, default=500)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cap", type=float, default=3.0)
    ap.add_argument("--first-seed", type=int, default=100, help="capped: seeds first_seed .. first_seed + runs - 1")
    ap.add_argument("--seconds", type=float, default=60.0, help="abandon: run this long, then kill")
    ap.add_argument("--abandon-concurrency", type=int, default=1000)
    ap.add_argument("--job-speed", type=float, default=0.38, help="job: emulator time scale (0.38: ~25 s an answer)")
    ap.add_argument("--money-share-of-targets", type=float, default=0.85,
                    help="job: the targets cost this share of the usable money (0.85; >1: not enough money)")
    ap.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True, help="job: the usual fault mix")
    ap.add_argument("--baseline", action="store_true", help="job: also six runs one after another")
    ap.add_argument("--whole-command", action="store_true",
                    help="job: then the same job as the user's command, papermill generate.ipynb, timed whole")
    ap.add_argument("--straggler-wait", type=float, default=120.0,
                    help="job: straggler_wait_s (the engine's default, 120 s, is for real answers of minutes)")
    ap.add_argument("--multi-turn", type=float, default=0.0,
                    help="job: this share of the prompts are conversations of 2-4 user turns (issue 31: 0.4)")
    ap.add_argument("--turns", default="2,3,4",
                    help="job: a conversation's user turns, equally likely (issue 60's job: 2)")
    ap.add_argument("--answers", choices=["job", "short"], default="job",
                    help="job: the emulator's default answers (~2,480 tokens), or issue 60's short ones (reasoning "
                         "600-3,000, content 50-500 tokens; 0.35 s + tokens / 400 per second, times --job-speed)")
    ap.add_argument("--whole-share", type=float, default=None,
                    help="job: this share of the pool on endpoints that bill whole answers (issue 60: 0.56)")
    ap.add_argument("--panel-balance", type=float, default=30.0, help="panel: usable $ of each run")
    ap.add_argument("--save", help="job: write the run's summary and its answers' (latency, tokens) to this file "
                                   "(with several runs, one file a run: NAME.s<seed>-mt<share>.json)")
    ap.add_argument("--repeat", type=int, default=1, help="job: runs on seeds --seed, --seed + 1, ...")
    ap.add_argument("--pair", action="store_true",
                    help="job: each seed runs the single-turn job, then the --multi-turn one; prints both medians")
    a = ap.parse_args()
    for name, fn in (("seed", seed), ("background", background), ("capacity", capacity), ("capped", capped),
                     ("abandon", abandon), ("job", job)):
        if a.which in (name, "all"):
            fn(a)
    if a.which == "cap-then-continue":
        cap_then_continue(a)
    if a.which == "panel":
        panel(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
