"""The money's end in simulated time: how fast does admission spend the last of the money, and what bounds the run's end?

The engine's own `Ledger` (its admission, books and stop rules) in simulated time, on the six-dataset job's answers at ×¼ scale
(`throughput_bench.py job`: answers ~2,480 tokens, log-normal, generation time proportional to length, ~25 s each;
500 in flight; $23.75 usable; max_tokens 32768 at the worst eligible price, so one request's bound is ~17× the mean
answer). Per seed: when issuing stopped, when the last answer came, the share of the usable money charged, each
against the Little's-law ideal of one full pool spending the usable money; and the same for an **oracle** that knows
every answer's cost the moment it starts and keeps the pool full until the money is committed to the cent.

    PYTHONPATH=lib .venv/bin/python bench/money_end_sim.py --seeds 5
    PYTHONPATH=lib .venv/bin/python bench/money_end_sim.py --bernstein-only   # the admission before issue 30
"""
from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics

import numpy as np

from eagledata.generation.account import Books
from eagledata.generation.admission import Admission, AgeModel
from eagledata.generation.ledger import Ledger, MoneyStop
from eagledata.generation.policy import rule
from eagledata.openrouter import Kind, Outcome

OK = Outcome(Kind.OK, "ok")

PRICE_OUT, PRICE_IN, WORST_OUT, WORST_IN = 2.2e-6, 0.4e-6, 2.8e-6, 0.7e-6  # USD per token (the default catalog)
MAX_TOKENS, PROMPT = 32768, 40


def answer(rng: random.Random) -> tuple[float, float]:
    """(cost, latency) of one answer: the emulator's default lengths at `--job-speed 0.38`."""
    n = min(32000, round(rng.lognormvariate(math.log(1500), 0.8)) + round(rng.lognormvariate(math.log(300), 0.7)))
    return n * PRICE_OUT + PROMPT * PRICE_IN, 0.38 * (1.4 + n / 40)


def prior() -> list[float]:
    """The engine's cost prior before any answer: the budget model's guess (median 3,000, sigma 0.9) at the worst price."""
    n = np.minimum(np.random.default_rng(0).lognormal(math.log(3000), 0.9, 20_000), MAX_TOKENS)
    return list(n * WORST_OUT + 500 * WORST_IN)


class BernsteinOnly(Admission):
    """The admission before issue 30: Bernstein's margin alone, and the old stop (few in flight, under 2 % left)."""

    def chernoff_fits(self, bound: float, left: float) -> bool:
        return False

    def trickle(self, *args: float) -> bool:
        return False


def engine(seed: int, usable: float, slots: int, tick: float, bernstein_only: bool) -> dict[str, float]:
    """The engine's own `Ledger` (admission, the books, the stop rules) in simulated time."""
    rng = random.Random(seed)
    bound = MAX_TOKENS * WORST_OUT + PROMPT * WORST_IN
    ledger = Ledger((BernsteinOnly if bernstein_only else Admission)(AgeModel(prior())), Books(), paid=True,
                    max_spend_usd=usable, reserve_usd=0.0, concurrency=slots, refresh_s=math.inf)
    ends: list = []
    t = 0.0
    next_tick, stopped = tick, None
    costs, latencies = [], []
    while True:
        while stopped is None and ledger.in_flight < slots:
            verdict = ledger.admit(bound, t)
            if isinstance(verdict, int):
                cost, latency = answer(rng)
                heapq.heappush(ends, (t + latency, verdict, cost, latency))
                continue
            if isinstance(verdict, MoneyStop):
                stopped = t
            break
        if not ends:
            break
        if ends[0][0] <= next_tick:
            t, ticket, cost, latency = heapq.heappop(ends)
            costs.append(cost)
            latencies.append(latency)
            ledger.settle(ticket, rule(OK), cost, bound, t)
        else:
            t, next_tick = next_tick, next_tick + tick
            ledger.tick(t)
    ideal = usable / (slots * statistics.fmean(costs) / statistics.fmean(latencies))
    return {"stop": (stopped or t) / ideal, "end": t / ideal, "charged": ledger.spent() / usable}


def oracle(seed: int, usable: float, slots: int) -> dict[str, float]:
    """Knows each answer's cost once it starts: the pool stays full until the money is committed exactly."""
    rng = random.Random(seed)
    ends: list = []
    t = committed = spent = 0.0
    costs, latencies, stopped = [], [], None
    while True:
        while stopped is None and len(ends) < slots:
            cost, latency = answer(rng)
            if committed + cost > usable:
                stopped = t
                break
            committed += cost
            heapq.heappush(ends, (t + latency, len(costs) + len(ends), cost, latency))
        if not ends:
            break
        t, _, cost, latency = heapq.heappop(ends)
        spent += cost
        costs.append(cost)
        latencies.append(latency)
    ideal = usable / (slots * statistics.fmean(costs) / statistics.fmean(latencies))
    return {"stop": (stopped or t) / ideal, "end": t / ideal, "charged": spent / usable}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--usable", type=float, default=23.75)
    ap.add_argument("--slots", type=int, default=500)
    ap.add_argument("--tick", type=float, default=0.5, help="seconds between refreshes (the engine's TICK_S)")
    ap.add_argument("--bernstein-only", action="store_true", help="the admission before issue 30")
    a = ap.parse_args()
    label = "Bernstein only" if a.bernstein_only else "engine"
    for name, run in ((label, lambda s: engine(s, a.usable, a.slots, a.tick, a.bernstein_only)),
                      ("oracle", lambda s: oracle(s, a.usable, a.slots))):
        rows = [run(seed) for seed in range(1, a.seeds + 1)]
        print(f"{name:>14}: issuing stopped at " + ", ".join(f"{r['stop']:.2f}" for r in rows) + "x ideal; last answer "
              "at " + ", ".join(f"{r['end']:.2f}" for r in rows) + "x; charged " +
              ", ".join(f"{r['charged']:.3f}" for r in rows) + " of usable", flush=True)


if __name__ == "__main__":
    main()
