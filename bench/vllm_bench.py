"""The vllm backend against a real vLLM: tokens/s of a prefill-only extraction, with and without the target's
prompt log-probabilities in the same request (`score`), and the transformers path on the same samples.

CPU (`make test-vllm` built .venv-vllm; the connector's CUDA calls get the test stand-ins):
    PYTHONPATH=lib .venv/bin/python bench/vllm_bench.py --preset cpu-tiny
GPU (vLLM installed in the Python named by --vllm-python, no stand-ins; bench/gpu_extraction.sh):
    PYTHONPATH=lib python bench/vllm_bench.py --device cuda --preset gpu-7b-dense --vllm-python "$(which python)"

The model is random (bench/hidden_states_bench.py's presets, or tiny ones), saved to a temporary checkpoint the
server loads with the command `python -m eagledata.hidden_states serve-command` prints
(tests/helpers/vllm_server/harness).
Rounds alternate score off/on, so drift in the machine's load hits both; each round sends fresh random samples of
the same length distribution (a request with prompt_logprobs skips vLLM's prefix cache; `--repeat-prompts` shows
what that costs when prompts repeat).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from eagledata.training import ExtractOptions, Sample, extract  # noqa: E402
from eagledata.training.layers import eagle3_layers  # noqa: E402
from eagledata.training.vllm_backend import VllmOptions, VllmSource  # noqa: E402

TINY = {"cpu-tiny": ("llama", 64, 8), "cpu-tiny-mla": ("deepseek_v3_k25_mla", 64, 8)}


def samples_for(n: int, lo: int, hi: int, seed: int = 0) -> list[Sample]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(lo, hi)
        out.append(Sample(f"b{i}", "B1", [rng.randrange(1, 163_840) for _ in range(k)],
                          [0] * (k // 4) + [1] * (k - k // 4), False))
    return out


async def one_round(source: VllmSource, samples: list[Sample]) -> float:
    t = time.perf_counter()
    n = 0
    async for batch in source.batches(samples):
        n += len(batch.samples)
    assert n == len(samples)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each of score off/on, alternating")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight (1: per-request latency)")
    ap.add_argument("--vllm-python", default=None, help="the Python with vLLM (default: .venv-vllm/bin/python)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers path's figure")
    ap.add_argument("--repeat-prompts", action="store_true",
                    help="send the same samples every round (prefix-cache hits for the states-only rounds)")
    args = ap.parse_args()

    from eagledata.training.tiny import build_tiny_model
    from tests.helpers.vllm_server.harness import start_vllm

    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    checkpoint = work / "checkpoint"
    if args.preset in TINY:
        family, h, layers = TINY[args.preset]
        model = build_tiny_model(family, checkpoint, hidden_size=h, num_layers=layers)
    else:
        from hidden_states_bench import PRESETS, build

        model = build(PRESETS[args.preset], "cpu", torch.bfloat16)
        model.save_pretrained(str(checkpoint))
    samples = samples_for(args.samples, args.min_len, args.max_len)
    tokens = sum(len(s) for s in samples)
    t = time.perf_counter()
    server = start_vllm(checkpoint, work / "connector", cpu=args.device == "cpu", python=args.vllm_python)
    print(f"server ready in {time.perf_counter() - t:.0f} s ({server.url}); {len(samples)} samples, {tokens:,} "
          f"tokens, {args.concurrency} in flight", flush=True)
    try:
        num_layers = model.config.get_text_config().num_hidden_layers
        sources = {}
        for score in (False, True):
            source = VllmSource(checkpoint, VllmOptions(server=server.url, server_concurrency=args.concurrency))
            source.open()
            source.prepare(eagle3_layers(num_layers), "pre_norm", score=score)
            sources[score] = source
        asyncio.run(one_round(sources[False], samples_for(4, args.min_len, args.max_len, seed=999)))  # warm-up
        times: dict[bool, list[float]] = {False: [], True: []}  # tokens/s per round
        for r in range(args.rounds):
            for score in (False, True):
                # fresh ids every round: a request with prompt_logprobs skips vLLM's prefix cache (sampling_params:
                # skip_reading_prefix_cache), so repeated prompts would favour the states-only rounds
                fresh = samples if args.repeat_prompts else samples_for(args.samples, args.min_len, args.max_len,
                                                                         seed=1 + 2 * r + score)
                times[score].append(sum(len(s) for s in fresh) / asyncio.run(one_round(sources[score], fresh)))
        print("| requests per round | tok/s states only (median; rounds) | tok/s + prompt_logprobs | time ratio |")
        print("|---|---|---|---|")
        a, b = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {len(samples)} | {a:,.0f} ({', '.join(f'{x:,.0f}' for x in times[False])}) | {b:,.0f} "
              f"({', '.join(f'{x:,.0f}' for x in times[True])}) | {a / b:.3f} |")
    finally:
        server.stop()
    if not args.no_transformers:
        model.to(args.device)
        t = time.perf_counter()
        extract(samples, work / "tf", "set", model, options=ExtractOptions(layout="speculators"), device=args.device,
                progress=False)
        s = time.perf_counter() - t
        print(f"transformers path ({next(model.parameters()).dtype}, {args.device}): {s:.2f} s, "
              f"{tokens / s:,.0f} tok/s")


if __name__ == "__main__":
    main()
