"""The money's end in virtual time: how fast does admission spend the last of the money, and what bounds the
run's end?

The engine itself (`generation.realtime.engine.Run`: its slots, ledger, admission, books and stop rules) in virtual time
against a service of drawn answers (virtual_service.py), on the six-dataset job's answers at ×¼ scale
(`throughput_bench.py job`: answers ~2,480 tokens, log-normal, generation time proportional to length, ~25 s each;
500 in flight; $23.75 usable as `max_spend_usd`; max_tokens 32768 at the worst eligible price, so one request's bound
is ~17× the mean answer; every straggler waited for). Per seed: when issuing stopped (the last request sent), when
the last answer came, the share of the usable money charged, each against the Little's-law ideal of one full pool
spending the usable money; and the same for an **oracle** that knows every answer's cost the moment it starts and
keeps the pool full until the money is committed to the cent.

    PYTHONPATH=lib .venv/bin/python bench/money_end_sim.py --seeds 5
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from virtual_service import Drawn, config, endpoint, run_engine  # noqa: E402

from eagledata.text import load_tokenizer  # noqa: E402

PRICE_IN, PRICE_OUT, WORST_IN, WORST_OUT = 0.4, 2.2, 0.7, 2.8  # $/M (the default catalog's cheapest and worst)
MAX_TOKENS, PROMPT = 32768, 40


def tokens_and_latency(rng: random.Random) -> tuple[float, int]:
    """(latency, output tokens) of one answer: the emulator's default lengths at `--job-speed 0.38`."""
    n = min(32000, round(rng.lognormvariate(math.log(1500), 0.8)) + round(rng.lognormvariate(math.log(300), 0.7)))
    return 0.38 * (1.4 + n / 40), n


def answer(rng: random.Random) -> tuple[float, float]:
    """(cost, latency) of one answer, for the oracle: the same draws as the engine's service."""
    latency, n = tokens_and_latency(rng)
    return (n * PRICE_OUT + PROMPT * PRICE_IN) / 1e6, latency


def engine(seed: int, usable: float, slots: int, tok) -> dict[str, float]:
    """The engine, every straggler waited for, in virtual time."""
    service = Drawn(tokens_and_latency, seed, tok, price_in=PRICE_IN, price_out=PRICE_OUT, prompt_tokens=PROMPT)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        prompts = d / "M.jsonl"
        n = math.ceil(3 * usable / (2000 * PRICE_OUT / 1e6)) + slots  # more than the money buys
        prompts.write_text("".join(json.dumps({"id": f"m{i:06d}", "messages": [
            {"role": "user", "content": f"Question {i}: prove that {i} + {i} is even."}]}) + "\n" for i in range(n)))
        (d / "datasets.yaml").write_text(f"M:\n  prompts: {prompts}\n")
        cfg = config(dataset="M", datasets_file=str(d / "datasets.yaml"), output_dir=str(d / "out"),
                     params_dir=str(d / "params"), concurrency=slots, max_tokens=MAX_TOKENS, max_spend_usd=usable,
                     account_refresh_s=5.0, account_lag_s=2.0, straggler_wait_s=None)
        s = run_engine(cfg, service, [endpoint("Cheap", PRICE_IN, PRICE_OUT), endpoint("Worst", WORST_IN, WORST_OUT)])
    served = s["run"]["recorded"]
    assert served == len(service.sent_at), (served, len(service.sent_at))
    rng = random.Random(seed)  # the same draws again: the answers the engine was served
    drawn = [answer(rng) for _ in range(served)]
    ideal = usable / (slots * statistics.fmean(c for c, _ in drawn) / statistics.fmean(x for _, x in drawn))
    assert s["stop_reason"] == "max_spend_reached", s["stop_reason"]
    return {"stop": service.sent_at[-1] / ideal, "end": s["wall_s"] / ideal,
            "charged": s["run"]["charged_usd"] / usable}


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
    a = ap.parse_args()
    tok = load_tokenizer(None)
    for name, run in (("engine", lambda s: engine(s, a.usable, a.slots, tok)),
                      ("oracle", lambda s: oracle(s, a.usable, a.slots))):
        rows = [run(seed) for seed in range(1, a.seeds + 1)]
        print(f"{name:>14}: issuing stopped at " + ", ".join(f"{r['stop']:.2f}" for r in rows) + "x ideal; last answer "
              "at " + ", ".join(f"{r['end']:.2f}" for r in rows) + "x; charged " +
              ", ".join(f"{r['charged']:.3f}" for r in rows) + " of usable", flush=True)


if __name__ == "__main__":
    main()
