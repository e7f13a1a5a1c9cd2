"""The engine itself replayed on a saved job run's answers, with and without conversations (issue 31, issue 41).

One real job run is one draw of its tail (a few long answers decide when the last target is met: ±10 % from run
to run), so comparing the single-turn and the multi-turn job on one run of each says little. This runs the engine —
`generation.realtime.engine.Run`, its dispatcher, pacing, ledger, recorder and slots, every line of it — in virtual time
(`clock.run_virtual`) against a service that answers from draws of a run's (latency, tokens) answers saved by
`throughput_bench.py job --save`: the run's slots (`concurrency`), targets, max_tokens, account and straggler
settings; the money never binds (pacing is what is measured). Minutes of answers replay in tens of seconds.
Each draw is run with no conversations and with the `--multi-turn` mix, and set against the bench's oracle on the
same mix. A draw's answers come from their own random stream, in the order requests are sent, so the draw with
conversations and the one without send the same answers (common random numbers): the two are compared draw by
draw, and the mean of the paired differences says what the conversations cost, with its standard error. Prints the
medians (time to the last target ÷ the oracle's), the paired difference, and the overshoots.

  PYTHONPATH=lib .venv/bin/python bench/throughput_bench.py job --save run.json
  PYTHONPATH=lib .venv/bin/python bench/pacing_replay.py run.json [more.json ...] --draws 21

`--stream` replays the same draws streamed (issue 42): every answer streams (virtual_service.Drawn), from an endpoint
that stops billing on a closed stream (`--cancel-share` of the traffic, the rest from one that bills whole answers), so
pacing sees how far each answer has got and, with `--at-target cut` (the default), a dataset at its target is cut.
Prints each mix's time to the last target ÷ the ideal of one full pool (Little's law on the draws: Σ targets ÷ (slots
× mean tokens ÷ mean latency)), the overshoots, the cut samples and the money billed for tokens no record holds.
`synthetic` instead of files draws the job's answers from the emulator's shape (no saved run needed).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from throughput_bench import CONVERSATION_STREAM, ORACLE_DRAWS, SEED_MAX_TOKENS, oracle_time, write_datasets  # noqa: E402
from virtual_service import Drawn, Served, config, endpoint, run_engine  # noqa: E402

from eagledata.generation.realtime import pacing  # noqa: E402
from eagledata.generation.realtime.pacing import MAX_OVERSHOOT  # noqa: E402
from eagledata.text import load_tokenizer  # noqa: E402

PRICE_IN, PRICE_OUT = 0.45, 2.2  # $/M: the cheapest eligible endpoint's order of price (the money never binds)
STRAGGLER_WAIT_S = 120.0  # throughput_bench.py job's default (the job saves no setting of it)


def synthetic(seed: int = 0, n: int = 20_000) -> tuple[dict[str, Any], list[tuple[float, int]]]:
    """The job as throughput_bench.py job runs it (six targets of the money's 85 % at $2.20/M, 500 in flight) with
    answers of the emulator's shape at the job's speed (0.38): reasoning (median 1,500, sigma 0.8) and content
    (300, 0.7) tokens, an answer taking 0.38 × (1.2 s + tokens ÷ 40 tok/s), ~25 s for the mean."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        tokens = min(32_000, round(rng.lognormvariate(math.log(1500), 0.8) + rng.lognormvariate(math.log(300), 0.7)))
        pairs.append((0.38 * (1.2 + tokens / 40), tokens))
    each = int(23.75 * 0.85 / 2.2e-6 / 6)
    saved = {"summary": {"run": {"concurrency": 500},
                         "datasets": {f"B{i}": {"target_output_tokens": each} for i in range(3, 9)}}}
    return saved, pairs


def ideal_s(saved: dict[str, Any], pairs: list[tuple[float, int]]) -> float:
    """One full pool's time to every target: Σ targets ÷ (slots × mean tokens ÷ mean latency)."""
    total = sum(x["target_output_tokens"] for x in saved["summary"]["datasets"].values())
    slots = saved["summary"]["run"]["concurrency"]
    return total / (slots * statistics.fmean(n for _, n in pairs) / statistics.fmean(x for x, _ in pairs))


def replay(saved: dict[str, Any], pairs: list[tuple[float, int]], multi_turn: float, draw: int,
           tok: Any, *, stream: bool = False, at_target: str = "cut", cancel_share: float = 0.8,
           report: dict[str, Any] | None = None) -> tuple[float, float]:
    """(time every target was recorded, worst tokens ÷ target − 1) of one draw, the engine in virtual time.
    `stream`: every answer streamed, `cancel_share` of them from an endpoint that stops billing on a closed stream;
    `report` gets the cut samples, the money billed for tokens no record holds and the run's end (`end_s`)."""
    run, per = saved["summary"]["run"], saved["summary"]["datasets"]
    targets = {n: x["target_output_tokens"] for n, x in per.items()}
    mean = statistics.fmean(n for _, n in pairs)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        prompts = math.ceil(2 * max(targets.values()) / mean) + 200
        file = write_datasets(d, prompts, targets, multi_turn, random.Random(CONVERSATION_STREAM + draw))
        cfg = config(dataset=list(targets), datasets_file=str(file), output_dir=str(d / "out"),
                     params_dir=str(d / "params"), concurrency=run["concurrency"], max_tokens=SEED_MAX_TOKENS,
                     account_refresh_s=5.0, account_lag_s=2.0, straggler_wait_s=STRAGGLER_WAIT_S, stream=stream,
                     at_target=at_target)
        served = [Served("Cancels", cancel_share, True), Served("Bills", 1 - cancel_share, False)]
        service = Drawn(lambda rng: rng.choice(pairs), draw, tok, price_in=PRICE_IN, price_out=PRICE_OUT,
                        endpoints=[e for e in served if e.weight > 0])
        s = run_engine(cfg, service, [endpoint(e.provider, PRICE_IN, PRICE_OUT, stream_cancellation=e.cancels)
                                      for e in served if e.weight > 0])
        if report is not None:
            report.update(cut=sum(x["run"]["finish_reasons"].get("cut", 0) for x in s["datasets"].values()),
                          records=sum(x["run"]["recorded"] for x in s["datasets"].values()), wasted=service.wasted,
                          billed=service.billed, end_s=s["wall_s"], pool=s["run"]["pool"])
    met = [x["run"]["target_met_s"] for x in s["datasets"].values()]
    if None in met:
        raise RuntimeError(f"draw {draw}: a target was not met ({s['stop_reason']})")
    return max(met), max(s["datasets"][n]["output_tokens"] / t - 1 for n, t in targets.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="files written by throughput_bench.py job --save, or 'synthetic'")
    ap.add_argument("--multi-turn", type=float, default=0.4)
    ap.add_argument("--draws", type=int, default=ORACLE_DRAWS)
    ap.add_argument("--stream", action="store_true", help="every answer streamed (pacing sees it; cut at targets)")
    ap.add_argument("--at-target", choices=["cut", "finish"], default="cut")
    ap.add_argument("--cancel-share", type=float, default=0.8,
                    help="--stream: the share of traffic on an endpoint that stops billing on a closed stream")
    ap.add_argument("--near", type=float, default=pacing.NEAR,
                    help="--stream: pacing.NEAR, the answer-time quantile within which a dataset near its cut sends "
                         "only to endpoints that cancel (0: near-target routing off)")
    a = ap.parse_args()
    if a.stream:
        pacing.NEAR = a.near
        return streamed(a)
    tok = load_tokenizer(None)
    mixes = (0.0, a.multi_turn)
    ratios: dict[float, list[float]] = {m: [] for m in mixes}
    overs: dict[float, list[float]] = {m: [] for m in mixes}
    for path in a.runs:
        saved = json.loads(Path(path).read_text())
        pairs = [(float(x), int(n)) for x, n in saved["answers"]]
        targets = {n: x["target_output_tokens"] for n, x in saved["summary"]["datasets"].items()}
        slots = saved["summary"]["run"]["concurrency"]
        for mix in mixes:
            oracle = statistics.median(oracle_time(pairs, targets, slots, d, multi_turn=mix) for d in range(a.draws))
            t0 = time.monotonic()
            got = [replay(saved, pairs, mix, d, tok) for d in range(a.draws)]
            times, over = [g[0] for g in got], [g[1] for g in got]
            ratios[mix] += [x / oracle for x in times]
            overs[mix] += over
            print(f"{Path(path).name}: {mix:.0%} multi-turn: last target at {statistics.median(times):.0f} s "
                  f"({min(times):.0f}-{max(times):.0f}) = {statistics.median(times) / oracle:.3f}x the oracle "
                  f"({oracle:.0f} s), median of {a.draws} draws; overshoot median {statistics.median(over):.1%}, "
                  f"worst {max(over):.1%}, {sum(o > MAX_OVERSHOOT for o in over)} draw(s) over {MAX_OVERSHOOT:.0%} "
                  f"[{(time.monotonic() - t0) / a.draws:.0f} s a draw]", flush=True)
    n = len(ratios[0.0])
    diff = [m - s for s, m in zip(ratios[0.0], ratios[a.multi_turn])]
    for mix in mixes:
        print(f"all {n} draws, {mix:.0%} multi-turn: mean {statistics.fmean(ratios[mix]):.3f}x the oracle, median "
              f"{statistics.median(ratios[mix]):.3f}x; {sum(o > MAX_OVERSHOOT for o in overs[mix])} of {n} runs end a "
              f"dataset over {MAX_OVERSHOOT:.0%} (worst {max(overs[mix]):.1%})")
    if n > 1:
        print(f"paired: the multi-turn rule minus the single-turn rule, same answers: {statistics.fmean(diff):+.3f} "
              f"± {statistics.stdev(diff) / math.sqrt(n):.3f} (mean ± standard error of {n} draws)")
    return 0


def streamed(a: argparse.Namespace) -> int:
    """Each run's draws streamed: time to the last target ÷ one full pool's ideal, overshoots, cut samples, waste."""
    tok = load_tokenizer(None)
    for path in a.runs:
        saved, pairs = synthetic() if path == "synthetic" else _load(path)
        ideal = ideal_s(saved, pairs)
        for mix in (0.0, a.multi_turn):
            rows = []
            for d in range(a.draws):
                report: dict[str, Any] = {}
                last, over = replay(saved, pairs, mix, d, tok, stream=True, at_target=a.at_target,
                                    cancel_share=a.cancel_share, report=report)
                rows.append((last / ideal, over, report))
            ratios, overs = [r[0] for r in rows], [r[1] for r in rows]
            cut = statistics.fmean(r[2]["cut"] / max(r[2]["records"], 1) for r in rows)
            ends = [r[2]["end_s"] / ideal for r in rows]
            waste = statistics.fmean(r[2]["wasted"] / max(r[2]["billed"], 1e-12) for r in rows)
            print(f"{Path(path).name}: streamed, at_target {a.at_target}, {a.cancel_share:.0%} on cancelling "
                  f"endpoints, "
                  f"{mix:.0%} multi-turn: last target at {statistics.median(ratios):.3f}x the ideal ({ideal:.0f} s; "
                  f"{min(ratios):.3f}-{max(ratios):.3f} over {a.draws} draws), the run's end at "
                  f"{statistics.median(ends):.3f}x ({min(ends):.3f}-{max(ends):.3f}); overshoot median "
                  f"{statistics.median(overs):.1%}, worst {max(overs):.1%}; cut samples {cut:.1%} of the records; "
                  f"billed for tokens no record holds {waste:.2%}", flush=True)
    return 0


def _load(path: str) -> tuple[dict[str, Any], list[tuple[float, int]]]:
    saved = json.loads(Path(path).read_text())
    return saved, [(float(x), int(n)) for x, n in saved["answers"]]


if __name__ == "__main__":
    sys.exit(main())
