"""What journaling the streams' delivered text costs the engine (issue 60 item 6): the engine's own
`Journals.flush` over 2,000 streams in flight, each receiving its text as a provider streams it (deltas of a few
characters, at the real run's ~21k output tokens/s over the 2,000; `--tokens-per-s 400`: every stream at a fast
provider's full speed at once), flushed every `FLUSH_S` as the engine's ticker does. Reports the CPU time per flush,
its share of one core, and the bytes written per second.

    PYTHONPATH=lib python bench/journal_bench.py --streams 2000 --seconds 20
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from eagledata.generation.realtime.attempt import Attempt
from eagledata.generation.realtime.journals import FLUSH_S, Journals
from eagledata.openrouter.stream import StreamState

WORDS = ("the of and to in is that for it as with was on be by this are we can which model answer "
         "量子 計算 reasoning step so then").split()


@dataclass
class FakeLane:  # what Journals reads of a lane: its name and its store's folder
    name: str
    store: object


@dataclass
class FakeStore:
    files: object


@dataclass
class FakeFiles:
    directory: Path


@dataclass
class FakeWork:
    lane: FakeLane
    turn: object


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--tokens-per-s", type=float, default=10.5,
                    help="each stream's rate (10.5: the real run's ~21k output tokens/s over 2,000 in flight)")
    ap.add_argument("--chunk-chars", type=int, default=12, help="characters per delta")
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        lane = FakeLane("B1", FakeStore(FakeFiles(Path(tmp))))
        journals = Journals([lane])  # type: ignore[list-item]
        attempts = []
        for i in range(args.streams):
            state = StreamState()
            state.chunk({"id": f"gen-{i}", "provider": "P", "model": "m", "choices": [{"delta": {"reasoning": ""}}]})
            a = Attempt(None, state, FakeWork(lane, None))  # type: ignore[arg-type]
            a.journaled = True
            attempts.append(a)
        chars_per_s = args.tokens_per_s * 4
        deltas_per_s = max(1, int(chars_per_s / args.chunk_chars))
        flush_s, written = [], 0
        journal = Path(tmp) / "streams.jsonl"
        for second in range(args.seconds):
            for a in attempts:  # one second of text arriving (not timed: the engine's readers do this anyway)
                field = "reasoning" if second < args.seconds // 2 else "content"
                for _ in range(deltas_per_s):
                    piece = " ".join(rng.choices(WORDS, k=2))[:args.chunk_chars]
                    a.state.chunk({"choices": [{"delta": {field: piece}}]})
            before = journal.stat().st_size if journal.exists() else 0
            t0 = time.process_time()
            journals.flush(attempts)
            flush_s.append(time.process_time() - t0)
            written += journal.stat().st_size - before
        flush_s.sort()
        med = flush_s[len(flush_s) // 2]
        print(f"{args.streams:,} streams, {args.tokens_per_s:g} tok/s each, a flush every {FLUSH_S:g} s over "
              f"{args.seconds} s: CPU per flush median {1e3 * med:.1f} ms (max {1e3 * flush_s[-1]:.1f} ms) = "
              f"{med / FLUSH_S:.1%} of one core; {written / args.seconds / 1e6:.2f} MB/s written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
