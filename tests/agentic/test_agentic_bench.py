"""bench/agentic_bench.py on a small scale, so it cannot rot: eight BFCL tasks over the eight backends against the
emulator (its agent slipping now and then), the generate process SIGKILLed once mid-run, each step in a contained
worker, then run to the end; every trajectory whole (each request once, token-exact, every result a fresh in-process
replay's, call ids exact). The full run (200 tasks, ten kills) is the bench's: bench/README.md."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eagledata.agentic import bfcl_code_path, read_tasks
from eagledata.agentic.verify import replay_trajectories
from eagledata.records import load_records
from eagledata.text import prompt_ids

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def agentic_bench():
    sys.path.insert(0, str(BENCH))
    try:
        import agentic_bench

        yield agentic_bench
    finally:
        sys.path.remove(str(BENCH))


def test_bfcl_tasks_through_a_sigkill_every_trajectory_whole(agentic_bench, tok, smollm2_cache, tmp_path,
                                                             bfcl_wheel_path):
    """(Planted: one trajectory's first tool result made another state's in all its records, their prompt ids
    re-rendered so that only the replay can tell: the check names that trajectory and call.)"""
    bench = agentic_bench
    report = bench.run(smollm2_cache, tmp_path, bench.SUBSET, kills=1, seed=61, concurrency=64, live=64, tok=tok,
                       speed=0.15, after_s=(0.3, 1.0))
    assert report["kills"] == 1 and report["open_at_last_kill"] >= 1, report  # the kill landed mid-trajectory
    assert report["resumed_mid_tool_loop"] >= 1, report
    assert report["tasks"] == 8 and report["ended"] == {"answered": 8}, report
    assert report["calls"] >= 30 and sum(report["error_results"].values()) >= 1, report  # slips, shown as errors
    assert report["final_run"]["reused"] > report["final_run"]["built"], report  # the pool ran most steps

    path = tmp_path / "out" / "datasets" / bench.DATASET / "records.jsonl"
    records = load_records(path)
    cid = next(r.conversation_id for r in records if r.turn > 1 and any(m["role"] == "tool" for m in r.messages))
    first = next(m for r in records if r.conversation_id == cid for m in r.messages if m["role"] == "tool")
    call_id, planted = first["tool_call_id"], json.dumps({"planted": 1})
    for r in records:
        if r.conversation_id == cid:
            for m in r.messages:
                if m.get("tool_call_id") == call_id:
                    m["content"] = planted
            r.prompt_ids = prompt_ids(tok, r.messages, tools=r.tools)
    path.write_text("".join(r.to_json() + "\n" for r in records))
    objs, _, specs = bench.prepare(tmp_path / "again", smollm2_cache, bench.SUBSET)
    with pytest.raises(AssertionError) as caught:
        bench.check(tmp_path, objs, specs, tok)
    assert caught.value.args[0][:3] == (cid, call_id, planted), caught.value.args
    # the library's own check (what `make demo` runs on its agentic dataset) names the same call, and only it
    tasks = {t.id: t for t in read_tasks(tmp_path / "again" / f"{bench.DATASET}.jsonl")}
    found = replay_trajectories(records, tasks, code_path=bfcl_code_path(smollm2_cache))
    assert found.trajectories == 8 and found.calls == report["calls"]
    assert [m[:3] for m in found.mismatches] == [(cid, call_id, planted)]
