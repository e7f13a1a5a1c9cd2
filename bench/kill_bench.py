"""Ten SIGKILLs at 2,000 in flight, streamed (issue 42's must-hold "Kills").

`eagledata.generate` runs as a command against the emulator at the seed bench's time scale (throughput_bench.py:
answers ÷ `--scale`, prices × `--scale`, `--speed` so an answer takes tens of seconds, the usual fault mix), one
dataset of `--prompts` prompts, `--concurrency` in flight. Its process group is SIGKILLed each time the emulator
counts `--kill-at` requests in flight (`/admin/stats`), `--kills` times, then it runs to the end. Then:

- exactness: every prompt exactly once in records.jsonl ∪ failures.jsonl, no id twice, each record's ids those
  the emulator generated (its ground truth, by generation id; a cut sample a prefix of them);
- waste, from the emulator's own books (every billed generation: provider, cost, cancelled or not): the spend that
  paid for tokens no record holds (a generation no record holds: all of it; a cut sample: what was billed beyond
  its prefix), as a share of the spend on endpoints with stream cancellation, on those without, and overall; split
  into the kills (clean answers no record holds) and the faults (billed faults, e.g. cut bodies);
- the last run's summary: `run.killed_before` against what the emulator billed for the streams the last killed run
  left (the journal's ids) and for every killed run's.

Goals (issue 42): on endpoints with stream cancellation ≤ 10 % (today, JSON answers: 50.1 %); overall ≤ 30 %
(38.6 %). `--stream both` runs the same with JSON answers (`stream: false`) after it, the "today" figure.

Issue 60's scenario (`--whole-share 0.56`: 56 % of the pool on endpoints that bill whole answers, the job bench's
catalog, `throughput_bench.job_endpoints`); goal ≤ 25 % overall. The figures add what the kept prefixes (pause samples,
`meta.cut: killed`) recovered, the share had none been kept, and the answers abandoned on endpoints that bill whole
ones: how much of them had been sent when the client went away (the emulator's `sent_tokens`), how much the records
hold, which were not kept. `--kill-after S` kills S seconds after the run first has `--kill-at` in flight (at 0 no
answer has begun to stream: nothing can be kept).

    PYTHONPATH=lib .venv/bin/python bench/kill_bench.py                 # 5,000 prompts, 10 kills at 1,500 of 2,000
    PYTHONPATH=lib .venv/bin/python bench/kill_bench.py --stream both
    PYTHONPATH=lib .venv/bin/python bench/kill_bench.py --whole-share 0.56 --kill-after 10

With JSON answers a killed run's requests stay in the emulator's in-flight count until their answers end (they are
generated and billed whole): the next run starts once at most `--residual` are left, and is killed at `--kill-at`
above what was left then.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from throughput_bench import USUAL_FAULTS, config, job_endpoints, scaled_emulator, write_datasets

from eagledata.emulator import parse_config, run_emulator
from eagledata.generation import GenerateConfig
from eagledata.generation.conversations.turns import pauses
from eagledata.generation.money.killed import leftovers
from eagledata.records import load_records

CANCELLING, WHOLE = "stream cancellation", "no stream cancellation"


@dataclass(frozen=True)
class Held:
    """What a record holds of a generation: its ids, whether a prefix (a cut sample), whether a pause sample."""

    ids: int
    prefix: bool
    pause: bool


def generate_cmd(cfg: GenerateConfig) -> list[str]:
    """`python -m eagledata.generate` with every setting of `cfg` that is not its default (a string as it is, any
    other value as YAML: the command's reading, `settings._cli_parser`)."""
    cmd = [sys.executable, "-m", "eagledata.generate"]
    for f, default, _ in GenerateConfig._leaves():
        value = getattr(cfg, f.name)
        if value != default or f.name == "dataset":
            cmd += [f"--{f.name.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
    return cmd


def in_flight(admin: httpx.Client) -> int:
    return admin.get("stats").json()["in_flight"]


def kill_at_in_flight(cmd: list[str], admin: httpx.Client, kill_at: int, residual: int, timeout_s: float,
                      log: Path, kill_after_s: float = 0.0) -> dict:
    """Wait until at most `residual` requests of earlier runs are left in flight, start `cmd`, SIGKILL its process
    group `kill_after_s` after the emulator first counts `kill_at` more than were left then. Returns when and what it
    killed (`in_flight`: the run's requests at the kill; `reached_s`: when `kill_at` was first counted)."""
    t0 = time.monotonic()
    while (left := in_flight(admin)) > residual and time.monotonic() - t0 < timeout_s:
        time.sleep(0.5)
    waited = time.monotonic() - t0
    with log.open("ab") as err:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    t1, peak, n, reached = time.monotonic(), 0, 0, None
    while proc.poll() is None and time.monotonic() - t1 < timeout_s:
        n = in_flight(admin)
        peak = max(peak, n)
        if reached is None and n - left >= kill_at:
            reached = time.monotonic() - t1
        if reached is not None and time.monotonic() - t1 >= reached + kill_after_s:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    proc.wait()
    return {"killed": proc.returncode == -signal.SIGKILL, "after_s": time.monotonic() - t1, "in_flight": n - left,
            "left_before": left, "waited_s": waited, "peak": peak, "reached_s": reached}


def exactness(d: Path, n: int, truth: dict[str, dict]) -> dict:
    """Every prompt once in records ∪ failures, no id twice, records' ids the emulator's (a cut sample a prefix); the
    pause samples (prefixes a kill or a Ctrl-C cut, `<id>~n`: their prompts answered again) beside them."""
    records = load_records(d / "records.jsonl")
    failures = [json.loads(x) for x in (d / "failures.jsonl").read_text().splitlines() if x.strip()] \
        if (d / "failures.jsonl").exists() else []
    paused = [r.id for r in records if pauses(r.meta)]
    ids = [r.id for r in records if not pauses(r.meta)] + [f["id"] for f in failures]
    expected = {f"P{i:07d}" for i in range(n)}
    exact = texts = wrong = 0
    wrong_ids: list[str] = []
    for r in records:
        g = truth.get(r.generation_id)
        wrong_before = wrong
        if g is None:
            wrong += 1
        elif r.finish_reason == "cut":
            ok = r.output_ids == g["output_ids"][:len(r.output_ids)] and len(r.output_ids) < len(g["output_ids"])
            exact, wrong = exact + ok, wrong + (not ok)
        elif g.get("retokenizes", True):
            ok = r.output_ids == g["output_ids"]
            exact, wrong = exact + ok, wrong + (not ok)
        else:  # ids that no re-tokenization gives back (a quirk the records keep as text): the text must be exact
            ok = (r.reasoning, r.content, r.finish_reason) == (g["reasoning"], g["content"], g["finish_reason"])
            texts, wrong = texts + ok, wrong + (not ok)
        if wrong > wrong_before:
            wrong_ids.append(f"{r.id} ({r.provider}, {r.meta.get('cut') or r.finish_reason}"
                             f"{', fault ' + str(g.get('fault')) if g else ', unknown generation'})")
    return {"records": len(records) - len(paused), "failures": len(failures), "duplicates": len(ids) - len(set(ids)),
            "missing": len(expected - set(ids)), "unknown": len(set(ids) - expected), "exact_ids": exact,
            "exact_text": texts, "wrong": wrong, "cut": sum(r.finish_reason == "cut" for r in records),
            "paused": len(paused), "wrong_ids": wrong_ids[:10],
            "ok": len(ids) == len(set(ids)) == n and set(ids) == expected and wrong == 0
            and len(set(paused)) == len(paused) and not set(paused) & set(ids),
            "held": {r.generation_id: Held(len(r.output_ids), r.finish_reason == "cut", bool(pauses(r.meta)))
                     for r in records}}


def waste(truth: dict[str, dict], held: dict[str, Held], emu_cfg: dict) -> dict:
    """The emulator's books split by whether the endpoint stops billing a closed stream: spend, the spend that paid
    for tokens no record holds (by cause: kills, faults, the rest of what was billed beyond a cut sample's prefix),
    and what the pause samples' prefixes hold (`recovered`: their prompt and ids at the provider's price, which
    would be waste had the killed streams' prefixes not been kept)."""
    eps = {e.provider: e for e in parse_config(emu_cfg).endpoints}
    spend: Counter = Counter()
    wasted: Counter = Counter()
    recovered: Counter = Counter()
    by_provider: Counter = Counter()
    for gid, g in truth.items():
        ep = eps[g["provider"]]
        group = CANCELLING if ep.stream_cancellation else WHOLE
        spend[group] += g["cost"]
        if (h := held.get(gid)) is not None:  # a record holds it: only what was billed beyond a prefix is waste
            kept = g["prompt_tokens"] * ep.price_prompt + h.ids * ep.price_completion
            lost = max(0.0, g["cost"] - kept) if h.prefix else 0.0  # billed whole (no cancellation) or until the cut
            if h.pause:
                recovered[group] += min(kept, g["cost"])
            cause = "cut"
        else:
            lost = g["cost"]
            cause = "kills" if g.get("fault") in (None, "slow") else "faults"
        wasted[group, cause] += lost
        by_provider[g["provider"]] += lost
    out: dict[str, Any] = {"spend": dict(spend), "by_provider": dict(by_provider.most_common())}
    for group in (CANCELLING, WHOLE):
        w = {c: wasted[group, c] for c in ("kills", "faults", "cut")}
        out[group] = {"spend": spend[group], "wasted": sum(w.values()), **w, "recovered": recovered[group],
                      "share": sum(w.values()) / spend[group] if spend[group] else 0.0,
                      "share_unkept_prefixes": (sum(w.values()) + recovered[group]) / spend[group]
                      if spend[group] else 0.0}
    total = sum(spend.values())
    out["overall"] = {"spend": total, "wasted": sum(wasted.values()), "recovered": sum(recovered.values()),
                      "share": sum(wasted.values()) / total if total else 0.0,
                      "share_unkept_prefixes": (sum(wasted.values()) + sum(recovered.values())) / total
                      if total else 0.0}
    return out


def whole_share_catalog(emu_cfg: dict, whole_share: float | None, slots: int) -> dict:
    """`emu_cfg` with the job bench's catalog for `whole_share` (`throughput_bench.job_endpoints`: the two cheapest
    endpoints, which cancel, take 1 - `whole_share` of the `slots`; the rest falls back to endpoints that bill whole
    answers) laid over its scaled prices; as it is when `whole_share` is None."""
    if whole_share is None:
        return emu_cfg
    over = {e["provider"]: e for e in job_endpoints("job", whole_share, slots)}
    return {**emu_cfg, "endpoints": [{**e, **over.get(e["provider"], {})} for e in emu_cfg["endpoints"]]}


def load_truth(path: Path) -> dict[str, dict]:
    truth = {}
    for line in path.read_text().splitlines():
        g = json.loads(line)
        truth[g["generation_id"]] = g
    return truth


def kills_run(*, prompts: int, concurrency: int, kill_at: int, kills: int, stream: bool, scale: float, speed: float,
              seed: int, residual: int | None = None, timeout_s: float = 900.0, quiet: bool = False,
              whole_share: float | None = None, keep: Path | None = None, kill_after_s: float = 0.0) -> dict:
    """One measurement: `kills` SIGKILLs each at `kill_at` in flight, then a run to the end; its figures.
    `kill_after_s`: each kill that long after the run first has `kill_at` in flight (0: at once, before any answer
    has begun to stream; later: mid-answer, as a user's kill may come).
    `whole_share`: that share of the pool on endpoints that bill whole answers (`whole_share_catalog`); `keep`: work in
    this folder and leave it (the emulator's truth, the runs' output and log), else in a temporary one."""
    residual = kill_at // 5 if residual is None else residual
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) if keep is None else keep
        d.mkdir(parents=True, exist_ok=True)
        emu_cfg = whole_share_catalog(
            scaled_emulator(scale, speed, balance=10_000, seed=seed, ground_truth_file=str(d / "truth.jsonl"),
                            faults={**USUAL_FAULTS, "slow_seconds": 30 * speed}), whole_share, concurrency)
        with run_emulator(emu_cfg) as emu, httpx.Client(base_url=emu.base_url.rsplit("/api/v1", 1)[0] + "/admin/",
                                                        timeout=30) as admin:
            write_datasets(d, prompts, {"P": None})
            cmd = generate_cmd(config(d, emu.base_url, scale, concurrency=concurrency, stream=stream))
            folder = d / "out" / "datasets" / "P"
            journal = folder / "streams.jsonl"
            log = d / "generate.log"
            t0 = time.monotonic()
            killed_streams: list[list[str]] = []
            for k in range(kills):
                got = kill_at_in_flight(cmd, admin, kill_at, residual, timeout_s, log, kill_after_s)
                killed_streams.append(leftovers(journal))
                say(f"    kill {k + 1}: {'killed' if got['killed'] else 'NOT KILLED (ended)'} {got['after_s']:.1f} s "
                    f"after start ({kill_at:,} in flight first at {got['reached_s'] or 0:.1f} s) at "
                    f"{got['in_flight']:,} in flight (peak {got['peak']:,}; started with "
                    f"{got['left_before']} of earlier runs in flight after {got['waited_s']:.0f} s); "
                    f"{len(killed_streams[-1]):,} streams journaled open")
                if not got["killed"]:
                    raise RuntimeError(f"run {k + 1} ended before {kill_at} were in flight: "
                                     + log.read_text(errors="replace")[-2000:])
            t_last = time.monotonic()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            wall_last = time.monotonic() - t_last
            if done.returncode != 0:
                raise RuntimeError(f"the last run failed ({done.returncode}): {done.stderr[-3000:]}")
            while in_flight(admin) > 0 and time.monotonic() - t_last < timeout_s:  # abandoned answers still billing
                time.sleep(0.5)
            time.sleep(parse_config(emu_cfg).generation_delay + 0.5)
            wall = time.monotonic() - t0
            stats = emu.stats()
        truth = load_truth(d / "truth.jsonl")
        ex = exactness(folder, prompts, truth)
        held = ex.pop("held")
        w = waste(truth, held, emu_cfg)
        summary = json.loads((folder / "summary.json").read_text())
        before = summary["run"].get("killed_before")

        def billed(ids: list[str]) -> float:
            return sum(truth[g]["cost"] for g in ids if g in truth)

        last_ids = killed_streams[-1] if killed_streams else []
        every = sorted({g for ids in killed_streams for g in ids})
        # what the kills left that no journal names: clean generations no record holds, their id never journaled
        # (sent before the kill, named by the service only after it, or never)
        named = set(every) | set(held)
        unnamed = [g for g, t in truth.items() if g not in named and t.get("fault") in (None, "slow")]
        return {"stream": stream, "prompts": prompts, "whole_share": whole_share,
                "whole_kills": whole_kills(truth, held, set(every), emu_cfg), "kills": kills,
                "kill_at": kill_at, "kill_after_s": kill_after_s, "concurrency": concurrency,
                "wall_s": wall, "last_run_s": wall_last, "exact": ex, "waste": w, "charged_usd": stats["charged_usd"],
                "books_usd": w["overall"]["spend"], "outcomes": stats["outcomes"], "killed_before": before,
                "last_kill_streams": len(last_ids), "last_kill_billed_usd": billed(last_ids),
                "every_kill_streams": len(every), "every_kill_billed_usd": billed(every),
                "summary_wasted_usd": summary["run"].get("wasted_usd"), "stop_reason": summary["stop_reason"],
                "unnamed_streams": len(unnamed), "unnamed_usd": billed(unnamed),
                "foreign_usd": summary["run"].get("foreign_usd", 0.0), "read_back": summary["run"].get("read_back"),
                "killed_wasted_usd": summary["run"].get("killed_wasted_usd")}


def whole_kills(truth: dict[str, dict], held: dict[str, Held], journaled: set[str], emu_cfg: dict) -> dict:
    """The clean answers abandoned on endpoints that bill whole ones (the emulator's `sent_tokens`: what it had sent
    when the client went away): how many, what they cost, what the tokens never sent cost (no client can keep those);
    those a pause sample holds a prefix of (its ids against what had been sent and against the whole answer); those
    none holds, journaled by a killed run or not."""
    whole = {e.provider: e for e in parse_config(emu_cfg).endpoints if not e.stream_cancellation}
    out: Counter = Counter()
    for gid, g in truth.items():
        if g["provider"] not in whole or "sent_tokens" not in g or g.get("fault") not in (None, "slow"):
            continue
        n, sent, h = len(g["output_ids"]), g["sent_tokens"], held.get(gid)
        out["abandoned"] += 1
        out["abandoned_usd"] += g["cost"]
        out["unsent_usd"] += max(0, n - sent) * whole[g["provider"]].price_completion  # billed, never sent
        out["ids"] += n
        out["sent"] += sent
        if h is not None and h.pause:
            out["kept"] += 1
            out["kept_ids"] += h.ids
            out["kept_sent"] += sent
            out["kept_whole_ids"] += n
        else:
            which = "journaled" if gid in journaled else "unnamed"
            out[which] += 1
            out[which + "_usd"] += g["cost"]
            out[which + "_sent"] += sent
    return dict(out)


def report(r: dict) -> str:
    w, ex = r["waste"], r["exact"]
    c, o, a = w[CANCELLING], w[WHOLE], w["overall"]
    kb = r["killed_before"]
    shown = (f"summary run.killed_before: ${kb['usd']:.4f} over {kb['read']} of {kb['streams']} streams "
             f"({kb['cancelled']} cancelled, {kb['unread']} unread; the last kill's streams kept as prefixes "
             f"{kb.get('kept', 0)}, holding ${kb.get('kept_usd', 0.0):.4f}; not kept {kb.get('not_kept', {})}); "
             f"the emulator billed "
             f"${r['last_kill_billed_usd']:.4f} for the last killed run's {r['last_kill_streams']} journaled streams, "
             f"${r['every_kill_billed_usd']:.4f} "
             f"for all {r['every_kill_streams']} of the {r['kills']} killed runs'") if kb else \
        "summary run.killed_before: absent"
    return (f"{'streamed' if r['stream'] else 'JSON'}: {r['prompts']:,} prompts, {r['kills']} kills at "
            f"{r['kill_at']:,} of {r['concurrency']:,} in flight"
            + (f" (+{r['kill_after_s']:g} s)" if r.get("kill_after_s") else "")
            + f", {r['wall_s']:.0f} s (the last run "
            f"{r['last_run_s']:.0f} s)"
            f"\n    exact: {'yes' if ex['ok'] else 'NO'} ({ex['records']:,} records + {ex['failures']} failures, "
            f"{ex['duplicates']} duplicates, {ex['missing']} missing, ids exact {ex['exact_ids']:,}, text exact "
            f"{ex['exact_text']}, wrong {ex['wrong']}{' ' + str(ex['wrong_ids']) if ex['wrong_ids'] else ''}, cut "
            f"samples {ex['cut']}, of them pause samples {ex['paused']} beside the answers)"
            f"\n    spend the records do not hold: with stream cancellation {c['share']:.1%} of ${c['spend']:.2f} "
            f"(kills ${c['kills']:.2f}, faults ${c['faults']:.2f}, cut ${c['cut']:.2f}; goal <= 10 %); without "
            f"{o['share']:.1%} of ${o['spend']:.2f} (kills ${o['kills']:.2f}, faults ${o['faults']:.2f}, beyond the "
            f"kept prefixes ${o['cut']:.2f}); overall {a['share']:.1%} of ${a['spend']:.2f} (goal <= "
            f"{'25' if r.get('whole_share') is not None else '30'} %); books ${r['books_usd']:.4f} = charged "
            f"${r['charged_usd']:.4f}"
            f"\n    recovered by the kept prefixes (pause samples: prompt + prefix at the price): with stream "
            f"cancellation ${c['recovered']:.2f}, without ${o['recovered']:.2f}, overall ${a['recovered']:.2f}; "
            f"had none been kept: {c['share_unkept_prefixes']:.1%} / {o['share_unkept_prefixes']:.1%} / "
            f"{a['share_unkept_prefixes']:.1%}"
            + (f"\n    answers abandoned on endpoints that bill whole ones: {wk.get('abandoned', 0):,} "
               f"(${wk.get('abandoned_usd', 0.0):.2f}; {wk.get('sent', 0) / max(1, wk.get('ids', 0)):.1%} of their "
               f"tokens sent when the client went away; the tokens never sent ${wk.get('unsent_usd', 0.0):.2f}, "
               f"{wk.get('unsent_usd', 0.0) / max(1e-9, a['spend']):.1%} of all spend); a prefix kept of "
               f"{wk.get('kept', 0):,} (their records hold "
               f"{wk.get('kept_ids', 0) / max(1, wk.get('kept_sent', 0)):.1%} of what was sent, "
               f"{wk.get('kept_ids', 0) / max(1, wk.get('kept_whole_ids', 0)):.1%} of the whole answers); none kept of "
               f"{wk.get('journaled', 0):,} journaled (${wk.get('journaled_usd', 0.0):.2f}) and "
               f"{wk.get('unnamed', 0):,} named by no journal (${wk.get('unnamed_usd', 0.0):.2f})"
               if (wk := r.get("whole_kills")) else "")
            + "\n    wasted by provider: " + ", ".join(f"{p} ${v:.2f}" for p, v in w["by_provider"].items() if v > 0)
            + f"\n    {shown}; last run's wasted_usd ${r['summary_wasted_usd'] or 0:.4f}, stop {r['stop_reason']}"
            + f"\n    named by no journal: {r['unnamed_streams']:,} generations, ${r['unnamed_usd']:.4f} billed; the "
              f"last run's foreign_usd ${r['foreign_usd']:.4f} (of it killed_before.late_usd "
              f"${(kb or {}).get('late_usd', 0.0):.4f}); read_back {r['read_back']}"
            + f"\n    the summary's waste: run.killed_wasted_usd ${r['killed_wasted_usd'] or 0:.4f} + the last run's "
              f"wasted_usd ${r['summary_wasted_usd'] or 0:.4f} = "
              f"${(r['killed_wasted_usd'] or 0) + (r['summary_wasted_usd'] or 0):.4f}, against the emulator's "
              f"${a['wasted']:.4f} no record holds")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--kill-at", type=int, default=1500, help="SIGKILL once this many of the run are in flight")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--stream", choices=["on", "off", "both"], default="on",
                    help="on: streamed (generate's default); off: JSON answers; both: on, then off")
    ap.add_argument("--scale", type=float, default=4.0, help="answers this many times shorter, prices higher")
    ap.add_argument("--speed", type=float, default=1.5, help="emulator time scale (1.5: ~23 s an answer)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--residual", type=int, default=None,
                    help="start the next run once at most this many earlier requests are in flight (kill_at / 5)")
    ap.add_argument("--whole-share", type=float, default=None,
                    help="this share of the pool on endpoints that bill whole answers (throughput_bench's "
                         "job_endpoints; issue 60: 0.56); the default catalog when left out")
    ap.add_argument("--kill-after", type=float, default=0.0,
                    help="kill this many seconds after the run first has --kill-at in flight (0: at once, before "
                         "anything streamed; ~10: mid-answer)")
    ap.add_argument("--keep", type=Path, help="work in this folder and leave it (truth.jsonl, out/, generate.log)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    results = []
    for stream in {"on": [True], "off": [False], "both": [True, False]}[a.stream]:
        print(f"kills: {a.prompts:,} prompts, {a.kills} SIGKILLs at {a.kill_at:,} of {a.concurrency:,} in flight, "
              f"{'streamed' if stream else 'JSON answers'}, scale {a.scale:g}, speed {a.speed:g}, usual faults, "
              + (f"{a.whole_share:.0%} of the pool on endpoints that bill whole answers, "
                 if a.whole_share is not None else "")
              + f"load average {os.getloadavg()[0]:.2f}", flush=True)
        r = kills_run(prompts=a.prompts, concurrency=a.concurrency, kill_at=a.kill_at, kills=a.kills, stream=stream,
                      scale=a.scale, speed=a.speed, seed=a.seed, residual=a.residual, whole_share=a.whole_share,
                      keep=a.keep, kill_after_s=a.kill_after)
        r["load_average"] = os.getloadavg()
        print(report(r), flush=True)
        results.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["exact"]["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
