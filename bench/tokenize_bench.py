"""Re-tokenization throughput: eagledata's output-id recipe against raw tiktoken on the same text.

Answers are built from real text found on this machine (Python sources and docs: English prose and
code), split into reasoning/content pairs of realistic length, plus a CJK/emoji share. Prints tokens/s
for raw `encode_ordinary`, the library single-threaded, and the library's batch API on all cores, then
the projected time for a 42M-output-token run.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

from eagledata.records import Answer
from eagledata.text import load_tokenizer, output_ids, output_ids_batch

FULL_RUN_TOKENS = 42_000_000


def corpus(target_chars: int, seed: int = 0) -> list[Answer]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.parts)[:4000]
    rnd = random.Random(seed)
    rnd.shuffle(files)
    text_parts, total = [], 0
    cjk = "量子纠缠是两个粒子状态相互关联的现象。我们先想一想这个问题。🎉 日本語の文章も少し混ぜます。"
    for p in files:
        t = p.read_text(encoding="utf-8", errors="ignore")
        text_parts.append(t)
        total += len(t)
        if total >= target_chars:
            break
    blob = "\n".join(text_parts)
    answers, pos = [], 0
    while pos < len(blob):
        r_len, c_len = rnd.randint(2000, 24000), rnd.randint(200, 4000)  # ~500-6000 reasoning tokens
        reasoning = blob[pos:pos + r_len]
        content = blob[pos + r_len:pos + r_len + c_len] + (cjk if rnd.random() < 0.2 else "")
        answers.append(Answer(reasoning, content, "stop"))
        pos += r_len + c_len
    return answers


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chars", type=int, default=40_000_000, help="corpus size in characters")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    tok = load_tokenizer()
    answers = corpus(args.chars)
    texts = [t for a in answers for t in (a.reasoning, a.content)]
    enc = tok.encoding

    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, fn in [
            ("raw tiktoken encode_ordinary, 1 thread", lambda: [enc.encode_ordinary(t) for t in texts]),
            ("eagledata output_ids, 1 thread", lambda: [output_ids(tok, a.reasoning, a.content, a.finish_reason)
                                                         for a in answers]),
            (f"eagledata output_ids_batch, {args.threads} threads",
             lambda: output_ids_batch(tok, answers, threads=args.threads)),
        ]:
            out, secs = timed(fn)
            best[name] = min(best.get(name, float("inf")), secs)
    tokens = sum(len(ids) for ids in output_ids_batch(tok, answers, threads=args.threads))
    raw_name = "raw tiktoken encode_ordinary, 1 thread"
    print(f"corpus: {len(answers):,} answers, {sum(map(len, texts)):,} chars, {tokens:,} output tokens "
          f"(best of {args.repeat}; {os.cpu_count()} cores)")
    for name, secs in best.items():
        rate = tokens / secs
        print(f"  {name:<46} {rate / 1e6:6.2f} M tok/s  {rate * best[raw_name] / tokens:5.2f}x raw  "
              f"42M tokens in {FULL_RUN_TOKENS / rate:5.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
