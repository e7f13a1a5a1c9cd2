"""budget.ipynb's realtime time against a run: the plan's expected time for a small job (`plan.route_plan.
realtime_seconds`, from the routed endpoint's speed and latency and the answers' lengths) beside the time an
emulator run at `emulator_speed 1` (real time) takes to meet the same target (summary.json's `target_met_s`).

  PYTHONPATH=lib .venv/bin/python bench/realtime_time_bench.py [--cases 5:12000 40:60000]

Each case: the first N prompts of examples/prompts/demo-a.jsonl then demo-b.jsonl (80 in all; demo-b's are
conversations of several turns, asked one after another) and a target of T output tokens. The answers'
lengths come from a quick run of the same prompts (at speed 0.02), as budget.ipynb takes them from earlier records.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from eagledata.emulator import run_emulator
from eagledata.emulator_process import embedded_config
from eagledata.generation import GenerateConfig, run_generation
from eagledata.generation.plan.budget import OutputLengths
from eagledata.generation.plan.route_plan import DatasetWork, answer_times, realtime_seconds, realtime_throughput
from eagledata.openrouter import load_routing
from eagledata.paths import dataset_files
from eagledata.prompts import load_prompts

ROOT = Path(__file__).resolve().parents[1]


def case(d: Path, n: int, target: int) -> Path:
    prompts = d / "P.jsonl"
    lines = [ln for name in ("demo-a", "demo-b") for ln in (ROOT / "examples" / "prompts" / f"{name}.jsonl").read_text()
             .splitlines(True)]
    if n > len(lines):
        raise SystemExit(f"{n} prompts asked for, the demo files hold {len(lines)}")
    prompts.write_text("".join(lines[:n]))
    (d / "datasets.yaml").write_text(f"P:\n  prompts: {prompts}\n  target_output_tokens: {target}\n")
    return d / "datasets.yaml"


async def run(d: Path, datasets: Path, url: str, out: str, concurrency: int) -> dict:
    cfg = GenerateConfig(dataset="P", datasets_file=str(datasets), base_url=url, output_dir=str(d / out),
                         params_dir=str(d / "params"), concurrency=concurrency, progress=False, reserve_usd=0.0)
    return await run_generation(cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["5:5000", "40:60000", "80:150000"], help="prompts:target pairs")
    ap.add_argument("--concurrency", type=int, default=2000)
    args = ap.parse_args()
    for spec in args.cases:
        n, target = map(int, spec.split(":"))
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            datasets = case(d, n, target)
            with run_emulator(embedded_config(speed=0.02)) as quick:  # the answers' lengths, as earlier records
                asyncio.run(run(d, _untargeted(d, datasets), quick.base_url, "lengths", args.concurrency))
            lengths = OutputLengths.from_records([dataset_files("P", str(d / "lengths")).records])
            assert lengths is not None
            with run_emulator(embedded_config(speed=1.0)) as emu:
                routing = asyncio.run(load_routing("moonshotai/kimi-k2.5", params_dir=str(d / "params"),
                                                   base_url=emu.base_url, api_key_env="OPENROUTER_API_KEY"))
                rate = realtime_throughput(args.concurrency, endpoint_tps=routing.cheapest().throughput_tps)
                answers = answer_times(rate, routing.eligible, args.concurrency)
                requests = math.ceil(target / lengths.mean)
                depths = Counter(sum(m["role"] == "user" for m in p.messages) for p in load_prompts(d / "P.jsonl"))
                work = [DatasetWork("P", target, requests, max(depths), 0.0, 0.0, turns=tuple(sorted(depths.items())),
                                    available=sum(t * c for t, c in depths.items()))]
                planned = max(target / rate.output_tps, realtime_seconds(work, lengths.samples, args.concurrency,
                                                                         answers.speed_tps, answers.latency_s))
                started = time.monotonic()
                summary = asyncio.run(run(d, datasets, emu.base_url, "run", args.concurrency))
                took = time.monotonic() - started
            met = summary["run"]["target_met_s"]
            print(json.dumps({"prompts": n, "target": target, "answers": answers.source, "lengths_mean":
                              round(lengths.mean), "planned_s": round(planned, 1), "target_met_s": met,
                              "run_s": round(took, 1), "output_tokens": summary["output_tokens"],
                              "planned_over_measured": round(planned / met, 3) if met else None}), flush=True)
    return 0


def _untargeted(d: Path, datasets: Path) -> Path:
    """The same prompts without a target: every answer, for the lengths."""
    text = datasets.read_text().split("  target_output_tokens")[0]
    out = d / "untargeted.yaml"
    out.write_text(text)
    return out


if __name__ == "__main__":
    sys.exit(main())
