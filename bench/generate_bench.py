"""Generation engine benchmarks against the local emulator (see bench/README.md for figures).

  efficiency  completed requests/s ÷ (concurrency / L) at 2,000 in flight, every request taking L seconds
  rss         peak RSS of a run with 100k prompts queued at 2,000 in flight
  resume      start-up of a run whose dataset already holds 1M records (everything done: it only resumes)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, run_generation

TINY = {"reasoning_median": 30, "reasoning_sigma": 0.3, "content_median": 10, "content_sigma": 0.3, "max_total": 120}


def write_prompts(d: Path, n: int) -> Path:
    prompts = d / "P.jsonl"
    with prompts.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i:07d}", "messages": [{"role": "user", "content": f"Question {i}?"}]}) + "\n")
    (d / "datasets.yaml").write_text(f"P:\n  prompts: {prompts}\n")
    return d / "datasets.yaml"


def cfg(d: Path, datasets: Path, base_url: str, **kw) -> GenerateConfig:
    base = dict(dataset="P", datasets_file=str(datasets), base_url=base_url, output_dir=str(d / "out"),
                params_dir=str(d / "params"), concurrency=2000, max_tokens=200, progress=False, reserve_usd=0.0)
    base.update(kw)
    return GenerateConfig(**base)


def efficiency(latency: float, requests: int) -> None:
    endpoint = {"provider": "Fixed", "slug": "fixed", "quantization": "int4", "prompt_price": 0.4,
                "completion_price": 2.2, "latency": latency, "throughput": 1e9, "capacity": 100_000}
    with tempfile.TemporaryDirectory() as tmp, \
            run_emulator(speed=1, content=TINY, replace_endpoints=True, endpoints=[endpoint]) as emu:
        d = Path(tmp)
        datasets = write_prompts(d, requests)
        s = asyncio.run(run_generation(cfg(d, datasets, emu.base_url)))
        done = s["run"]["recorded"]
        rate = done / s["wall_s"]
        ideal = 2000 / latency
        # The last wave cannot overlap a next one: compare with the best a perfect client can do on N requests.
        waves = -(-requests // 2000)
        best = requests / (waves * latency)
        print(f"efficiency: {done:,} requests, L={latency:g}s, 2000 in flight, wall {s['wall_s']:.2f}s -> "
              f"{rate:,.1f} req/s vs ideal {ideal:,.1f} = {rate / ideal:.3f} "
              f"(vs a perfect client on {waves} waves {best:,.1f} req/s = {rate / best:.3f}); "
              f"server in-flight peak {emu.stats()['in_flight_peak']}; client errors {s['run']['errors']}")


def rss(prompts: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp, run_emulator(speed=1, content=TINY) as emu:
        d = Path(tmp)
        datasets = write_prompts(d, prompts)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        async def bounded():
            # SIGINT after `seconds`: the engine stops issuing and drains, as on Ctrl-C
            timer = asyncio.get_running_loop().call_later(seconds, os.kill, os.getpid(), 2)
            try:
                return await run_generation(cfg(d, datasets, emu.base_url, drain_timeout_s=5))
            finally:
                timer.cancel()

        s = asyncio.run(bounded())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"rss: {prompts:,} prompts queued, 2000 in flight for {seconds:g}s, {s['run']['recorded']:,} recorded "
              f"({s['stop_reason']}): peak RSS {peak:,.0f} MiB (before the run {before:,.0f} MiB)")


def resume(records: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, run_emulator(speed=0) as emu:
        d = Path(tmp)
        datasets = write_prompts(d, records)
        ds = d / "out" / "datasets" / "P"
        ds.mkdir(parents=True)
        offset = 0
        with (ds / "records.jsonl").open("w") as rec, (ds / "done.idx").open("w") as idx:
            for i in range(records):
                line = json.dumps({"id": f"p{i:07d}", "dataset": "P", "messages": [{"role": "user", "content": "q"}],
                                   "reasoning": "r", "content": "c", "finish_reason": "stop", "model": "m",
                                   "provider": "x", "generation_id": f"g{i}", "usage": {"prompt_tokens": 9,
                                   "completion_tokens": 4, "reasoning_tokens": 1, "cost": 1e-5},
                                   "prompt_ids": [1] * 9, "output_ids": [2, 163607, 3, 163586]},
                                  separators=(",", ":")) + "\n"
                rec.write(line)
                offset += len(line.encode())
                idx.write(f"p{i:07d}\t{offset}\t4\t1e-05\n")
        size = (ds / "records.jsonl").stat().st_size / 2**20
        t0 = time.perf_counter()
        s = asyncio.run(run_generation(cfg(d, datasets, emu.base_url)))
        warm = time.perf_counter() - t0
        (ds / "done.idx").unlink()
        t0 = time.perf_counter()
        asyncio.run(run_generation(cfg(d, datasets, emu.base_url)))
        cold = time.perf_counter() - t0
        print(f"resume: {records:,} records ({size:,.0f} MiB), all done -> '{s['stop_reason']}' with "
              f"{emu.stats()['requests']} requests sent; start-up to finish {warm:.2f}s with the index, "
              f"{cold:.2f}s rebuilding it from records.jsonl")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("which", choices=["efficiency", "rss", "resume", "all"])
    ap.add_argument("--latency", type=float, default=10.0)
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--records", type=int, default=1_000_000)
    a = ap.parse_args()
    if a.which in ("efficiency", "all"):
        efficiency(a.latency, a.requests)
    if a.which in ("rss", "all"):
        rss(a.prompts, a.seconds)
    if a.which in ("resume", "all"):
        resume(a.records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
