#!/usr/bin/env bash
# One GPU, ~12 minutes: extraction ÷ bare forward, tokens/s and peak memory for a 7B-class dense model and a
# DeepseekV3-style MoE (random weights, Kimi's vocabulary), then transformers' MoE overhead against a dense
# twin of equal active size at GPU scale, then the vllm backend against a real vLLM on the GPU (the printed serve
# command, no CPU stand-ins) next to the transformers path on the same samples, with and without the target's
# prompt log-probabilities. Paste the output into bench/README.md.
#   bench/gpu_extraction.sh            # all three
#   bench/gpu_extraction.sh vllm       # only the vLLM part (VLLM_PY: a Python with `pip install vllm==0.32.0`)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
VLLM_PY=${VLLM_PY:-.venv-vllm-gpu/bin/python}
PART=${1:-all}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$PART" = all ] || [ "$PART" = transformers ]; then
    PYTHONPATH=lib timeout 360 "$PY" bench/hidden_states_bench.py --device cuda --preset gpu-7b-dense gpu-moe \
        --storage bf16 --repeat 2
    timeout 120 "$PY" bench/moe_overhead_bench.py --device cuda --dtype bfloat16 --hidden 2048 --layers 8 \
        --experts-count 128 --top-k 8 --moe-inter 768 --tokens 16384 --row 2048 --experts eager grouped_mm
fi
if [ "$PART" = all ] || [ "$PART" = vllm ]; then
    if "$VLLM_PY" -c "import vllm" 2>/dev/null; then
        # ~1B Llama (gpu-small), 256 samples of 64-2,048 tokens, 32 requests in flight, 2 rounds each of states
        # only / + prompt_logprobs; then the transformers path on the same samples.
        PYTHONPATH=lib timeout 300 "$PY" bench/vllm_bench.py --device cuda --preset gpu-small --vllm-python "$VLLM_PY" \
            --samples 256 --min-len 64 --max-len 2048 --concurrency 32 --rounds 2
    else
        echo "vllm part skipped: no vLLM in $VLLM_PY (python3 -m venv .venv-vllm-gpu && .venv-vllm-gpu/bin/pip install vllm==0.32.0)"
    fi
fi
