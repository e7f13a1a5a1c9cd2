"""The engine's pacing rule replayed on a saved job run's answers, with and without conversations (issue 31).

One real job run is one draw of its tail (a few long answers decide when the last target is met: ±10 % from run
to run), so comparing the single-turn and the multi-turn job on one run of each says little. This replays
`eagledata.generation.pacing.Pacing` itself, in simulated time, on draws of a run's (latency, tokens) answers
saved by `throughput_bench.py job --save`: the run's slots (`concurrency`) and targets, the datasets taken in
pacing's order, a started conversation's next turn ahead of its dataset's new ones (as the engine's `take`),
`refresh` every 0.5 s.
Each draw is run with no conversations and with the `--multi-turn` mix, and set against the bench's oracle on
the same mix. A draw's answers come from their own random stream, in the order requests start, so the draw with
conversations and the one without send the same answers (common random numbers): the two rules are compared draw by
draw, and the mean of the paired differences says what the conversations cost, with its standard error (two
independent sets of 21 draws differ by ±1.5 % by chance alone). Prints the medians (time to the last target ÷ the
oracle's), the paired difference, and the overshoots.

  PYTHONPATH=lib .venv/bin/python bench/throughput_bench.py job --save run.json
  PYTHONPATH=lib .venv/bin/python bench/pacing_replay.py run.json [more.json ...] --draws 21
"""
from __future__ import annotations

import argparse
import collections
import heapq
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from throughput_bench import CONVERSATION_STREAM, MULTI_TURNS, ORACLE_DRAWS, oracle_time  # noqa: E402

from eagledata.generation.config import GenerateConfig  # noqa: E402
from eagledata.generation.pacing import MAX_OVERSHOOT, Pacing  # noqa: E402
from eagledata.generation.priors import prior_lengths  # noqa: E402

TICK_S = 0.5


def replay(pairs: list[tuple[float, int]], targets: dict[str, int], slots: int, multi_turn: float, draw: int,
           prior: list[float]) -> tuple[float, float]:
    """(time every target was recorded, worst tokens ÷ target − 1) of one draw under the engine's pacing."""
    rng = random.Random(draw)  # the answers (as `oracle_time`'s)
    turns = random.Random(CONVERSATION_STREAM + draw)  # which prompts are conversations
    pace = Pacing(Pacing.lane(n, target=t, prompts=10**9, recorded=0, finished=0, prior_tokens=prior)
                  for n, t in targets.items())
    ready: dict[str, collections.deque[int]] = {n: collections.deque() for n in targets}  # later turns left
    ends: list = []
    met: dict[str, float] = {}
    t, next_tick = 0.0, TICK_S
    while len(met) < len(targets) or ends:
        while len(ends) < slots:
            taken = None
            for name in pace.ranked([n for n in targets if n not in met]):
                lane = pace.lanes[name]
                if ready[name] and lane.may_continue():
                    taken = name, ready[name].popleft()
                    pace.hold(name, promised=True)
                    break
                if lane.open():
                    later = turns.choice(MULTI_TURNS) - 1 if turns.random() < multi_turn else 0
                    taken = name, later
                    pace.hold(name, later=later)
                    break
            if taken is None:
                break
            name, later = taken
            latency, tokens = rng.choice(pairs)
            heapq.heappush(ends, (t + latency, pace.start(name, t), name, tokens, later))
        if ends and ends[0][0] <= next_tick:
            t, ticket, name, tokens, later = heapq.heappop(ends)
            if later:
                if name in met:  # the run stops asking its dataset: the conversation stays open
                    pace.forgo(name, later)
                else:
                    ready[name].append(later - 1)
            pace.end(ticket, t, tokens, finished=not later)
            if name not in met and pace.lanes[name].recorded >= targets[name]:
                met[name] = t
        elif not ends and len(met) < len(targets) and not any(ready.values()):
            raise RuntimeError(f"draw {draw}: pacing holds every dataset shut short of its target")
        else:
            t, next_tick = next_tick, next_tick + TICK_S
            pace.refresh(t)
    return max(met.values()), max(pace.lanes[n].recorded / targets[n] - 1 for n in targets)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="files written by throughput_bench.py job --save")
    ap.add_argument("--multi-turn", type=float, default=0.4)
    ap.add_argument("--draws", type=int, default=ORACLE_DRAWS)
    a = ap.parse_args()
    cfg = GenerateConfig(dataset="replay")
    prior = prior_lengths(cfg.prior_output_median_tokens, cfg.prior_output_sigma, cfg.max_tokens)  # the engine's guess
    mixes = (0.0, a.multi_turn)
    ratios: dict[float, list[float]] = {m: [] for m in mixes}
    overs: dict[float, list[float]] = {m: [] for m in mixes}
    for path in a.runs:
        saved = json.loads(Path(path).read_text())
        pairs = [(float(x), int(n)) for x, n in saved["answers"]]
        targets = {n: x["target_output_tokens"] for n, x in saved["summary"]["datasets"].items()}
        slots = saved["summary"]["run"]["concurrency"]
        for mix in mixes:
            oracle = statistics.median(oracle_time(pairs, targets, slots, d, multi_turn=mix) for d in range(a.draws))
            got = [replay(pairs, targets, slots, mix, d, prior) for d in range(a.draws)]
            times, over = [g[0] for g in got], [g[1] for g in got]
            ratios[mix] += [x / oracle for x in times]
            overs[mix] += over
            print(f"{Path(path).name}: {mix:.0%} multi-turn: last target at {statistics.median(times):.0f} s "
                  f"({min(times):.0f}-{max(times):.0f}) = {statistics.median(times) / oracle:.3f}x the oracle "
                  f"({oracle:.0f} s), median of {a.draws} draws; overshoot median {statistics.median(over):.1%}, "
                  f"worst {max(over):.1%}, {sum(o > MAX_OVERSHOOT for o in over)} draw(s) over {MAX_OVERSHOOT:.0%}", flush=True)
    n = len(ratios[0.0])
    diff = [m - s for s, m in zip(ratios[0.0], ratios[a.multi_turn])]
    for mix in mixes:
        print(f"all {n} draws, {mix:.0%} multi-turn: mean {statistics.fmean(ratios[mix]):.3f}x the oracle, median "
              f"{statistics.median(ratios[mix]):.3f}x; {sum(o > MAX_OVERSHOOT for o in overs[mix])} of {n} runs end a "
              f"dataset over {MAX_OVERSHOOT:.0%} (worst {max(overs[mix]):.1%})")
    print(f"paired: the multi-turn rule minus the single-turn rule, same answers: {statistics.fmean(diff):+.3f} "
          f"± {statistics.stdev(diff) / math.sqrt(n):.3f} (mean ± standard error of {n} draws)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
