#!/usr/bin/env bash
# One GPU, ~10 minutes: extraction ÷ bare forward, tokens/s and peak memory for a 7B-class dense model and a
# DeepseekV3-style MoE (random weights, Kimi's vocabulary), then transformers' MoE overhead against a dense
# twin of equal active size at GPU scale. Paste the output into bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
PYTHONPATH=lib timeout 420 "$PY" bench/hidden_states_bench.py --device cuda --preset gpu-7b-dense gpu-moe \
    --storage bf16 --repeat 2
timeout 150 "$PY" bench/moe_overhead_bench.py --device cuda --dtype bfloat16 --hidden 2048 --layers 8 \
    --experts-count 128 --top-k 8 --moe-inter 768 --tokens 16384 --row 2048 --experts eager grouped_mm
