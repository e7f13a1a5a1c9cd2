"""Issue 60's interrupt case, as a user meets it: generate.ipynb's run cell in the `eagledata` kernel over 3,000
prompts (a tenth of them conversations of 2-4 user turns; the usual fault mix; 2,000 in flight; no token target),
Lab's stop button `--after` seconds into the run, then the same cell run again `--reruns` times to its end.

What must hold (issue 60, "Must hold"): every prompt finished or failed (every conversation asked to its last turn,
or ended by a cut answer or a failure naming it), every record exact against the emulator's own tokens (a pause
sample a strict prefix), nothing twice; the interrupt's pause samples each answered again by a rerun.

    PYTHONPATH=lib .venv/bin/python bench/interrupt_bench.py [--prompts 3000 --concurrency 2000 --after 10]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from kill_bench import exactness, load_truth  # noqa: E402
from throughput_bench import USUAL_FAULTS, write_datasets  # noqa: E402

from eagledata.emulator import run_emulator  # noqa: E402
from eagledata.generation.conversations.turns import pauses  # noqa: E402
from eagledata.prompts import load_prompts  # noqa: E402
from eagledata.records import load_records  # noqa: E402
from tests.helpers.records import answers_and_pauses, recorded_turns  # noqa: E402
from tests.notebooks.test_kernel import CTRL_C_RUN, _reply_to, _start  # noqa: E402


def asks_per_prompt(prompts: Path) -> dict[str, int]:
    """Each prompt's user turns (its asks): what a finished conversation has recorded."""
    from eagledata.generation.conversations.turns import split_asks

    out = {}
    for p in load_prompts(prompts):
        split = split_asks(p.messages)
        out[p.id] = len(split[0]) if split else 1
    return out


def completeness(folder: Path, asks: dict[str, int]) -> dict:
    """Every prompt finished or failed: its turns 1..k recorded once, k its last ask unless the k-th answer was cut
    (a finish other than stop) or a failure names its turn k + 1; every paused turn answered or failed after it."""
    records, failures, by_conv = recorded_turns(folder)  # asserts: no id twice, no turn answered twice
    answers, paused = answers_and_pauses(records)
    failed = {f.get("conversation_id", f["id"]) for f in failures}
    unfinished = []
    for cid, n in asks.items():
        turns = by_conv.get(cid, {})
        k = len(turns)
        if sorted(turns) != list(range(1, k + 1)):
            unfinished.append(f"{cid}: turns {sorted(turns)}")
        elif k < n and cid not in failed and (k == 0 or turns[k].finish_reason == "stop"):
            unfinished.append(f"{cid}: {k} of {n} turns")
    settled = {r.id for r in answers} | {f["id"] for f in failures}
    never = sorted({p.id.rpartition("~")[0] for p in paused} - settled)
    return {"prompts": len(asks), "conversations": sum(n > 1 for n in asks.values()), "failures": len(failures),
            "unfinished": len(unfinished), "unfinished_ids": unfinished[:10],
            "paused_turns_never_finished": len(never), "never_finished_ids": never[:10]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--multi-turn", type=float, default=0.1, help="share of prompts that are conversations")
    ap.add_argument("--after", type=float, default=10.0, help="Lab's stop this many seconds into the cell")
    ap.add_argument("--reruns", type=int, default=2)
    ap.add_argument("--speed", type=float, default=1.0, help="emulator speed: answers take ~40 s at 1.0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900, help="seconds a rerun may take")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        datasets = write_datasets(tmp, a.prompts, {"C": None}, multi_turn=a.multi_turn, rng=random.Random(a.seed))
        asks = asks_per_prompt(tmp / "C.jsonl")
        out = tmp / "out"
        folder = out / "datasets" / "C"
        emu_cfg = {"speed": a.speed, "balance": 10_000, "seed": a.seed, "faults": USUAL_FAULTS,
                   "ground_truth_file": str(tmp / "truth.jsonl")}
        cell = CTRL_C_RUN.format(datasets=str(datasets), base_url="{base_url}", out=str(out),
                                 params=str(tmp / "params"), concurrency=a.concurrency)
        runs = []
        with run_emulator(emu_cfg) as emu:
            cell = cell.replace("{base_url}", emu.base_url)
            km, kc = _start("eagledata", tmp, tmp / "kernel.log")
            try:
                for i in range(1 + a.reruns):
                    started = time.monotonic()
                    msg_id = kc.execute(cell)
                    if i == 0:
                        time.sleep(a.after)
                        in_flight = emu.stats()["in_flight"]
                        km.interrupt_kernel()
                    reply, took = _reply_to(kc, msg_id, within_s=a.timeout)
                    summary = json.loads((folder / "summary.json").read_text())
                    records = load_records(folder / "records.jsonl")
                    runs.append({"run": "interrupted" if i == 0 else f"rerun {i}",
                                 "reply": reply and reply["content"]["status"],
                                 "seconds": round(time.monotonic() - started, 1),
                                 **({"in_flight_at_stop": in_flight} if i == 0 else {}),
                                 "stop_reason": summary["stop_reason"], "remaining": summary.get("remaining"),
                                 "records": sum(not pauses(r.meta) for r in records),
                                 "pause_samples": sum(pauses(r.meta) for r in records),
                                 "cut_samples": summary["run"].get("cut_samples")})
                    print(json.dumps(runs[-1]), flush=True)
                    if reply is None:
                        break
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
        truth = load_truth(tmp / "truth.jsonl")
        ex = exactness(folder, 0, truth)  # its per-record checks; which prompts are done is `completeness`'s
        done = completeness(folder, asks)
        result = {"records": ex["records"], "pause_samples": ex["paused"], "exact_ids": ex["exact_ids"],
                  "exact_text": ex["exact_text"], "wrong": ex["wrong"], "wrong_ids": ex["wrong_ids"],
                  "duplicates": ex["duplicates"], **done}
        ok = (runs and runs[-1]["stop_reason"] == "completed" and ex["wrong"] == 0 and ex["duplicates"] == 0
              and done["unfinished"] == 0 and done["paused_turns_never_finished"] == 0)
        print(json.dumps({"ok": bool(ok), **result}))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
