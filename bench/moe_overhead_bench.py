"""The transformers path's MoE overhead: a DeepseekV3 MoE against the same model made dense at equal active size.

Both models share everything but the MLP: MLA attention, depth, width. The dense twin replaces every
MoE block (k routed + shared experts of `moe_intermediate_size`) by one MLP of intermediate size
(k + shared) × moe_intermediate_size, so both do the same FLOPs per token. The ratio of their
decoder-forward times is what transformers' expert dispatch costs (routing, per-expert gathers,
index_add; `--experts` picks transformers' experts implementations: eager loop, batched_mm, grouped_mm).

CPU:  .venv/bin/python bench/moe_overhead_bench.py
GPU:  python bench/moe_overhead_bench.py --device cuda --dtype bfloat16 --hidden 2048 --experts-count 128 --tokens 8192
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def build(dense: bool, args: argparse.Namespace, experts_impl: str = "eager") -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    h, heads = args.hidden, max(2, args.hidden // 64)
    active = (args.top_k + 1) * args.moe_inter
    cfg = DeepseekV3Config(
        vocab_size=32_000, hidden_size=h, num_hidden_layers=args.layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=active, moe_intermediate_size=args.moe_inter,
        n_routed_experts=args.experts_count, num_experts_per_tok=args.top_k, n_shared_experts=1, n_group=1,
        topk_group=1, first_k_dense_replace=args.layers if dense else 1, q_lora_rank=h // 2, kv_lora_rank=h // 4,
        qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=8192,
        experts_implementation=experts_impl)
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(cfg).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()


def time_forward(model: torch.nn.Module, args: argparse.Namespace) -> float:
    """Best of `repeat` decoder forwards over `tokens` tokens (rows of `row` tokens); no LM head."""
    rows = max(1, args.tokens // args.row)
    ids = torch.randint(0, 32_000, (rows, args.row), device=args.device)
    best = float("inf")
    with torch.inference_mode():
        model.model(input_ids=ids, use_cache=False)  # warm-up
        for _ in range(args.repeat):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            model.model(input_ids=ids, use_cache=False)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts-count", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--moe-inter", type=int, default=128)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--row", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--experts", nargs="+", default=["eager", "batched_mm", "grouped_mm"])
    args = p.parse_args()
    dense = time_forward(build(True, args), args)
    results = {"dense": {"seconds": round(dense, 4), "tok_per_s": round(args.tokens / dense)}}
    for impl in args.experts:
        try:
            t = time_forward(build(False, args, impl), args)
        except Exception as e:  # an implementation this torch/device lacks
            results[impl] = {"error": f"{type(e).__name__}: {e}"[:200]}
            continue
        results[impl] = {"seconds": round(t, 4), "tok_per_s": round(args.tokens / t), "vs_dense": round(t / dense, 2)}
    print(json.dumps({"config": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
