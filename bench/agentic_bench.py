"""Issue 61's BFCL runs at scale: BFCL's multi-turn base tasks (all 200 by default) rolled out against the emulator,
its agent writing calls from the conversation and earlier results with small slip rates (`tool_style`), every step's
calls executed in contained workers (`RolloutExecutor`, its pool of live environments on), the generate process
SIGKILLed `--kills` times while it writes, then run to the end. Then every trajectory is checked whole:

- each request once (`<task>`, `<task>#n`, no turn twice, none missing), each the one before with its answer and that
  answer's results (or the next user turn) appended, the trajectory ended (answered or capped);
- every assistant turn token-exact against the emulator's ground truth, its call ids the model's own;
- every tool result equal to what a fresh environment gives when the recorded calls are replayed in order, replayed
  independently of the run (`InProcessEnvironments`, in this process), each call id once.

Reported: steps (requests) per task, calls per step, error results by kind, trajectories ended how, the executor's
environments built and steps run on a live one, wall time.

    PYTHONPATH=lib python bench/agentic_bench.py --cache .cache/quality            # 200 tasks, 10 kills
    PYTHONPATH=lib python bench/agentic_bench.py --tasks subset --kills 1          # 8 tasks over the 8 backends

`python bench/agentic_bench.py child CONFIG_JSON --cache DIR --live N` is the generate process (killed and rerun).
tests/agentic/test_agentic_bench.py runs the subset with one kill in `make test`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "lib"), str(ROOT)]

from eagledata.agentic import (  # noqa: E402
    ContainedEnvironments,
    EnvironmentSpec,
    InProcessEnvironments,
    Limits,
    Task,
    bfcl_code_path,
    bfcl_wheel,
    read_bfcl_tasks,
    write_tasks,
)
from eagledata.agentic.executor import RolloutExecutor  # noqa: E402
from eagledata.emulator_process import run_emulator  # noqa: E402
from eagledata.records import Record, load_records  # noqa: E402
from tests.helpers.kills import kill_while_writing  # noqa: E402
from tests.helpers.rollouts import check_trajectories  # noqa: E402

# Eight tasks over BFCL's eight backends (GorillaFileSystem, TwitterAPI, TicketAPI, MessageAPI, MathAPI,
# VehicleControlAPI, TradingBot, TravelAPI), one to three classes each.
SUBSET = ("multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_14", "multi_turn_base_15",
          "multi_turn_base_50", "multi_turn_base_59", "multi_turn_base_101", "multi_turn_base_150")
# The agent: most string and integer arguments from the conversation and earlier results, a few slips per hundred.
STYLE = {"context_share": 0.7, "slips": {"unknown_name": 0.02, "bad_json": 0.02, "missing_required": 0.03,
                                         "wrong_type": 0.03}}
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.5, "content_median": 15, "content_sigma": 0.5, "max_total": 300}
STEPS = 20  # requests per user turn at most (BFCL's step limit)
DATASET = "BFCL"
TRUTH = "ground_truth.json"  # the emulator's, kept beside the run


class FreshReplay:
    """The check's replay, independent of the run: each task's environment built in this process, the recorded
    calls run in order; (call id, recorded result, fresh result) per call, and the fresh results' error kinds."""

    def __init__(self, specs: dict[str, EnvironmentSpec]):
        self.specs, self.environments = specs, InProcessEnvironments()
        self.errors: Counter[str] = Counter()
        self.calls = 0

    def __call__(self, obj: dict, messages: Sequence[dict]) -> list[tuple[str, str, str]]:
        env = self.environments.open(self.specs[obj["id"]])
        shown = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
        out = []
        try:
            for m in messages:
                for c in m.get("tool_calls") or ():
                    got = env.execute(c["function"]["name"], c["function"]["arguments"])
                    out.append((c["id"], shown.get(c["id"], "<no result recorded>"), got.text))
                    self.calls += 1
                    if got.error is not None:
                        self.errors[got.error] += 1
        finally:
            env.close()
        return out


def prepare(folder: Path, cache: Path, ids: Sequence[str] | None) -> tuple[dict[str, dict], Path, dict]:
    """The task file (BFCL's tasks, or those of `ids`), its datasets file, and each task's environment spec."""
    tasks: list[Task] = read_bfcl_tasks(bfcl_wheel(cache))
    if ids is not None:
        tasks = [t for t in tasks if t.id in set(ids)]
        assert len(tasks) == len(ids), "a task id not among BFCL's"
    folder.mkdir(parents=True, exist_ok=True)
    prompts = write_tasks(folder / f"{DATASET}.jsonl", tasks)
    datasets = folder / "datasets.yaml"
    datasets.write_text(f"{DATASET}:\n  prompts: {prompts}\n")
    code_path = bfcl_code_path(cache)
    return {t.id: t.row() for t in tasks}, datasets, {t.id: t.spec(code_path=code_path) for t in tasks}


def generate_config(folder: Path, datasets: Path, url: str, concurrency: int) -> dict[str, Any]:
    return {"dataset": DATASET, "datasets_file": str(datasets), "base_url": url, "output_dir": str(folder / "out"),
            "params_dir": str(folder / "params"), "concurrency": concurrency, "max_tokens": 300, "progress": False,
            "reserve_usd": 0.0, "retry_base_s": 0.01, "retry_cap_s": 0.2, "rollout_steps": STEPS,
            "tool_call_s": 20.0}


def child(config: str, cache: str, live: int) -> int:
    """One generate process: `run_generation` with a contained executor whose BFCL cache is `cache`."""
    from eagledata.aio import run_sync
    from eagledata.generation import GenerateConfig
    from eagledata.generation.realtime.parts import Seams
    from eagledata.generation.run import run_generation

    cfg = GenerateConfig(**json.loads(config))
    execute = RolloutExecutor(ContainedEnvironments(Limits(call_s=cfg.tool_call_s)), cache_dir=cache, live=live)
    summary = run_sync(run_generation(cfg, seams=Seams(environments=execute)), "run_generation")
    print(json.dumps({"stop_reason": summary.get("stop_reason"), "built": execute.built,
                      "reused": execute.reused}))
    return 0


def spread(values: Sequence[float]) -> dict[str, float]:
    s = sorted(values)
    return {"mean": round(statistics.fmean(s), 2), "median": s[len(s) // 2], "p90": s[int(0.9 * (len(s) - 1))],
            "max": s[-1]}


def describe(chains: dict[str, list[Record]], replay: FreshReplay) -> dict[str, Any]:
    """What the trajectories hold: steps per task, calls per step, error results by kind, how they ended."""
    calling = [r for c in chains.values() for r in c if r.tool_calls and r.finish_reason in ("stop", "tool_calls")]
    return {"tasks": len(chains), "requests": sum(map(len, chains.values())),
            "steps_per_task": spread([len(c) for c in chains.values()]),
            "calls_per_step": spread([len(r.tool_calls or ()) for r in calling]),
            "calls": replay.calls, "error_results": dict(sorted(replay.errors.items())),
            "ended": dict(Counter(c[-1].meta["rollout"].get("ended", c[-1].finish_reason) for c in chains.values()))}


def check(folder: Path, objs: dict[str, dict], specs: dict[str, EnvironmentSpec], tok: Any) \
        -> tuple[dict[str, list[Record]], FreshReplay]:
    """Every trajectory of the run in `folder` whole (an AssertionError names the first that is not): against the
    emulator's ground truth kept in `folder`, each result replayed fresh in this process."""
    truth = {t["generation_id"]: t for t in json.loads((folder / TRUTH).read_text())}
    replay = FreshReplay(specs)
    chains = check_trajectories(tok, folder / "out" / "datasets" / DATASET, objs, truth, STEPS, replay=replay)
    assert all(chains.values()) and len(chains) == len(objs), "a task without records"
    return chains, replay


def run(cache: Path, folder: Path, ids: Sequence[str] | None, kills: int, seed: int, concurrency: int, live: int,
        tok: Any, speed: float, after_s: tuple[float, float]) -> dict[str, Any]:
    """The bench: kills, the run to the end, the check (an AssertionError names the first trajectory that is not
    whole). Returns the report."""
    objs, datasets, specs = prepare(folder, cache, ids)
    records = folder / "out" / "datasets" / DATASET / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    report: dict[str, Any] = {"tasks_run": len(objs), "seed": seed, "speed": speed, "concurrency": concurrency,
                              "tool_envs": live}
    with run_emulator(speed=speed, content=SMALL, generation_delay=0.02, balance=10_000, seed=seed,
                      tool_style=STYLE) as emu:
        cmd = [sys.executable, str(Path(__file__).resolve()), "child",
               json.dumps(generate_config(folder, datasets, emu.base_url, concurrency)), "--cache", str(cache),
               "--live", str(live)]
        started = time.monotonic()
        killed, sizes = kill_while_writing(cmd, [records], random.Random(seed), kills, after_s=after_s, env=env,
                                           cwd=ROOT)
        report["kills"], report["kills_s"] = killed, round(time.monotonic() - started, 1)
        at_kills = load_records(records, tolerate_torn_tail=True) if records.exists() else []
        started = time.monotonic()
        final = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env, cwd=ROOT)
        assert final.returncode == 0, final.stderr[-3000:]
        report["final_s"] = round(time.monotonic() - started, 1)
        report["final_run"] = json.loads(final.stdout.splitlines()[-1])
        (folder / TRUTH).write_text(json.dumps(emu.ground_truth()))
        assert "Traceback" not in emu.log()
    summary = json.loads((records.parent / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0, summary["stop_reason"]
    started = time.monotonic()
    chains, replay = check(folder, objs, specs, tok)
    report["check_s"] = round(time.monotonic() - started, 1)
    killed_ids = {r.id for r in at_kills}
    open_at_kill = {r.conversation_id for r in at_kills if r.finish_reason in ("stop", "tool_calls")} \
        - {r.conversation_id for r in at_kills if "ended" in r.meta["rollout"]}
    report["records_at_last_kill"] = len(at_kills)
    report["open_at_last_kill"] = len(open_at_kill)
    report["resumed_mid_tool_loop"] = sum(any(r.id not in killed_ids and r.meta["rollout"]["step"] > 1 for r in c)
                                          and any(r.id in killed_ids for r in c)
                                          for cid, c in chains.items() if cid in open_at_kill)
    report.update(describe(chains, replay))
    return report


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["child"]:
        ap = argparse.ArgumentParser(prog="agentic_bench.py child")
        ap.add_argument("config")
        ap.add_argument("--cache", required=True)
        ap.add_argument("--live", type=int, required=True)
        a = ap.parse_args(args[1:])
        return child(a.config, a.cache, a.live)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=os.environ.get("EAGLEDATA_QUALITY_CACHE", ".cache/quality"),
                    help="where the bfcl-eval wheel is (fetched there once)")
    ap.add_argument("--tasks", choices=("all", "subset"), default="all")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=61)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--live", type=int, default=64, help="tool_envs: environments kept live between steps")
    ap.add_argument("--speed", type=float, default=0.05, help="emulator speed (1: real latencies)")
    ap.add_argument("--after", type=float, nargs=2, default=(1.0, 6.0),
                    help="each kill lands this many seconds (uniform) after the process's first new record")
    a = ap.parse_args(args)
    from eagledata.text import load_tokenizer

    with tempfile.TemporaryDirectory() as d:
        report = run(Path(a.cache).resolve(), Path(d), None if a.tasks == "all" else SUBSET, a.kills, a.seed,
                     a.concurrency, a.live, load_tokenizer(None), a.speed, tuple(a.after))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
