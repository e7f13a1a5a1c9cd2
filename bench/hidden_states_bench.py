"""Hidden-state extraction against a bare forward of the same decoder over the same batches.

The bare pass runs the decoder stack alone (no hooks, no copies, nothing written); the extraction
pass is `eagledata.training.extract` end to end into a temporary directory (hooks, real-token
gather, storage cast, fp8 or bf16 shards, atomic writes, index and manifest). The ratio is the
price of capturing and storing; goal ≤ 1.10 on CPU with a small model. End-to-end runs take the best
of `--repeat`; the per-batch ratio alternates bare and capture + storage cast batch by batch (best
of `--repeat` each, no disk), the steadier figure on a machine shared with other work.

Scoring (the fidelity audit's LM head over every output token, on by default) is timed as its own row
(`--score both`): its cost is 2·H·V per scored token against 2 FLOPs per decoder parameter, so a tiny model with
Kimi's 163,840-token vocabulary pays many times its forward, while K2.5 pays ~4 %; the `FLOP ratio` column
is that prediction (`scoring.audit_cost`), to read the measured one against.

CPU:  PYTHONPATH=lib .venv/bin/python bench/hidden_states_bench.py --preset cpu-small
GPU:  PYTHONPATH=lib python bench/hidden_states_bench.py --device cuda --preset gpu-7b-dense gpu-moe --storage bf16
      (or bench/gpu_extraction.sh, which also runs the MoE-overhead bench; both print markdown/JSON for bench/README.md)
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass

import torch

from eagledata.training import ExtractOptions, Sample, eagle3_layers, extract, find_decoder
from eagledata.training.scoring import audit_cost
from eagledata.training.source import scored_positions
from eagledata.training.storage import STORAGE_DTYPES, quantize_fp8
from eagledata.training.transformers_backend import Capture, _pad, plan_batches


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    num_layers: int
    intermediate_size: int
    heads: int
    samples: int
    min_len: int
    max_len: int
    max_tokens_per_batch: int
    family: str = "llama"  # or deepseek_v3: MLA attention, MoE from layer 1 (transformers' eager experts loop)
    experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0


PRESETS = {
    # a small Llama-style model on 2 CPU cores: ~35k tokens
    "cpu-small": Preset(256, 4, 1024, 4, 128, 32, 512, 8192),
    # ~1B and ~7B Llama-style models in bf16, Kimi's vocabulary: ~1M and ~0.5M tokens
    "gpu-small": Preset(2048, 16, 8192, 16, 1024, 256, 2048, 65536),
    "gpu-mid": Preset(4096, 32, 14336, 32, 512, 256, 2048, 65536),
    # the 7B-class dense preset under the name, and a DeepseekV3-style MoE (~16B total, ~2.5B active,
    # DeepSeek-V2-Lite's shape: 64 routed experts, 6 per token, 2 shared) in bf16: ~0.5M tokens each
    "gpu-7b-dense": Preset(4096, 32, 11008, 32, 512, 256, 2048, 32768),
    "gpu-moe": Preset(2048, 27, 10944, 16, 512, 256, 2048, 32768, family="deepseek_v3", experts=64, top_k=6,
                      moe_intermediate_size=1408),
    # the same MoE shape, tiny, for a CPU smoke run of the MoE path
    "cpu-moe": Preset(256, 4, 1024, 4, 64, 32, 256, 4096, family="deepseek_v3", experts=16, top_k=4,
                      moe_intermediate_size=128),
}


def build(preset: Preset, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, DeepseekV3Config, LlamaConfig

    if preset.family == "deepseek_v3":
        h = preset.hidden_size
        cfg = DeepseekV3Config(vocab_size=163_840, hidden_size=h, intermediate_size=preset.intermediate_size,
                               num_hidden_layers=preset.num_layers, num_attention_heads=preset.heads,
                               num_key_value_heads=preset.heads, moe_intermediate_size=preset.moe_intermediate_size,
                               n_routed_experts=preset.experts, num_experts_per_tok=preset.top_k, n_shared_experts=2,
                               n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=None,
                               kv_lora_rank=512 if h >= 1024 else h // 4, qk_rope_head_dim=64 if h >= 1024 else 16,
                               qk_nope_head_dim=128 if h >= 1024 else 32, v_head_dim=128 if h >= 1024 else 32,
                               max_position_embeddings=8192)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        return model.eval()
    cfg = LlamaConfig(vocab_size=163_840, hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
                      num_hidden_layers=preset.num_layers, num_attention_heads=preset.heads,
                      num_key_value_heads=max(1, preset.heads // 4), max_position_embeddings=8192)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def make_samples(preset: Preset, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(preset.samples):
        n = rng.randint(preset.min_len, preset.max_len)
        p = rng.randint(1, n - 1)
        out.append(Sample(f"s{i}", "bench", [rng.randrange(163_584) for _ in range(n)], [0] * p + [1] * (n - p),
                          False))
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bare_forward(model: torch.nn.Module, samples: list[Sample], max_tokens: int, device: str) -> float:
    """The same batches as extraction (same packing, same padding), decoder only, nothing kept."""
    decoder = find_decoder(model)
    batches = plan_batches([len(s) for s in samples], max_tokens)
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            ids, mask = _pad([samples[i].input_ids for i in batch], decoder.module.embed_tokens.weight.device)
            decoder.module(input_ids=ids, attention_mask=mask, use_cache=False)
    sync(device)
    return time.perf_counter() - start


def extraction(model: torch.nn.Module, samples: list[Sample], max_tokens: int, device: str, storage: str,
               shard_bytes: int, score: bool) -> float:
    options = ExtractOptions(storage=storage, max_tokens_per_batch=max_tokens, shard_bytes=shard_bytes, score=score)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = extract(samples, tmp, "bench", model, options=options, device=device, progress=False)
        sync(device)
        seconds = time.perf_counter() - start
    assert result.complete
    return seconds


def interleaved(model: torch.nn.Module, samples: list[Sample], max_tokens: int, device: str, storage: str,
                rounds: int) -> tuple[float, float]:
    """(bare s, capture + storage cast s), each summed over batches of the best of `rounds`, the two
    alternating batch by batch so that load drifts on a shared machine hit both alike. No disk."""
    decoder = find_decoder(model)
    layers = eagle3_layers(decoder.num_layers)
    dtype = decoder.module.embed_tokens.weight.dtype
    in_device = decoder.module.embed_tokens.weight.device
    bare = ext = 0.0
    with torch.inference_mode():
        for batch in plan_batches([len(s) for s in samples], max_tokens):
            ids, mask = _pad([samples[i].input_ids for i in batch], in_device)
            b = e = float("inf")
            for _ in range(rounds):
                start = time.perf_counter()
                decoder.module(input_ids=ids, attention_mask=mask, use_cache=False)
                sync(device)
                b = min(b, time.perf_counter() - start)
                start = time.perf_counter()
                with Capture(decoder, layers, "post_norm") as capture:
                    states, _ = capture.run(ids, mask, dtype)
                if storage == "fp8":
                    quantize_fp8(states)[0].cpu()
                else:
                    states.to(STORAGE_DTYPES[storage]).cpu()
                sync(device)
                e = min(e, time.perf_counter() - start)
            bare, ext = bare + b, ext + e
    return bare, ext


def peak_gb(device: str) -> str:
    return f"{torch.cuda.max_memory_allocated() / 1e9:.1f}" if device.startswith("cuda") else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", nargs="+", default=["cpu-small"], choices=list(PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--storage", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shard-mib", type=int, default=16, help="shard size: several shards, so writes overlap "
                    "compute as they do in a full-size run (1 GiB shards over millions of tokens)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--score", choices=["off", "on", "both"], default="both",
                    help="extraction with the audit's scoring off, on, or both (one row each)")
    args = ap.parse_args()
    scores = {"off": [False], "on": [True], "both": [False, True]}[args.score]
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    print(f"device {args.device}, compute {dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| preset | H | layers | tokens | storage | scoring | bare forward s | extraction s | ratio | "
          "per-batch ratio (no disk) | extraction tok/s | peak GPU GB | scoring FLOP ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.preset:
        preset = PRESETS[name]
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        model = build(preset, args.device, dtype)
        samples = make_samples(preset)
        tokens = sum(len(s) for s in samples)
        bare_forward(model, samples[:8], preset.max_tokens_per_batch, args.device)  # warm-up
        scored_tokens = sum(len(scored_positions(s)) for s in samples)
        flop_ratio = audit_cost(model.config.to_dict())["ratio"] * scored_tokens / tokens
        bare: list[float] = []
        ext: dict[tuple[str, bool], list[float]] = {(st, sc): [] for st in args.storage for sc in scores}
        for _ in range(args.repeat):  # interleaved, so drift in machine load hits every path alike
            bare.append(bare_forward(model, samples, preset.max_tokens_per_batch, args.device))
            for storage, score in ext:
                ext[storage, score].append(extraction(model, samples, preset.max_tokens_per_batch, args.device,
                                                      storage, args.shard_mib << 20, score))
        b = min(bare)  # the same work whatever the storage
        for storage in args.storage:
            pb, pe = interleaved(model, samples, preset.max_tokens_per_batch, args.device, storage, args.repeat)
            for score in scores:
                e = min(ext[storage, score])
                print(f"| {name} | {preset.hidden_size} | {preset.num_layers} | {tokens:,} | {storage} | "
                      f"{'on' if score else 'off'} | {b:.2f} | {e:.2f} | {e / b:.3f} | "
                      f"{pe / pb if not score else float('nan'):.3f} | {tokens / e:,.0f} | {peak_gb(args.device)} | "
                      f"{flop_ratio if score else 0:.3f} |", flush=True)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
