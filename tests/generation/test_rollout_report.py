"""Reporting rollouts per environment (issue 61 item 6): every record says its task's environment and the kinds of the
tool results it first carries (`meta.rollout.environment`, `.errors`), and summary.json's `rollouts` section counts,
per environment, tasks, how they ended, steps per task, calls per step, failed calls by kind, tokens and money from
the records themselves."""
from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, environments_table
from eagledata.generation.conversations.rollouts import environment_label, result_parts
from eagledata.generation.realtime.parts import Seams
from eagledata.generation.report.environments import Tally, environment_rows
from eagledata.generation.run import run_generation
from eagledata.records import load_records
from tests.helpers.rollouts import ENVIRONMENT, Executions, Shown, check_trajectories, tasks

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.5, "content_median": 15, "content_sigma": 0.5, "max_total": 300}
STEPS = 3


def _rec(cid: str, turn: int, *, calls: int = 0, errors=None, ended: str | None = None, finish: str | None = None,
         cut: str | None = None, results: int = 0, cost: float = 0.01, env: str = "a") -> dict:
    """A rollout record as records.jsonl holds it (only the fields the report reads)."""
    meta = {"rollout": {"user_turn": 1, "step": turn, "environment": env,
                        **({"errors": errors} if errors is not None else {}), **({"ended": ended} if ended else {})}}
    if cut:
        meta["cut"] = cut
    return {"id": cid if turn == 1 else f"{cid}#{turn}", "dataset": "D", "conversation_id": cid, "turn": turn,
            "messages": [{"role": "user", "content": "q"}] + [{"role": "tool", "tool_call_id": f"x{i}", "content": "r"}
                                                              for i in range(results)],
            "tool_calls": [{"id": f"functions.f:{i}"} for i in range(calls)] or None,
            "finish_reason": finish or ("tool_calls" if calls else "stop"), "prompt_ids": [1] * 10,
            "output_ids": [2] * 5, "usage": {"completion_tokens": 5, "cost": cost}, "meta": meta}


def test_the_tally_counts_whole_trajectories_per_environment_and_leaves_pause_samples_out_of_the_steps():
    """Planted and caught: a pause sample counted as a step (t1 four steps, mean 2.33), errors read from every record
    rather than the one that first carries them, or a failure of no rollout counted."""
    tally = Tally()
    for r in [
        _rec("t1", 1, calls=2), _rec("t1", 2, calls=1, errors=[None, "raised"]),
        _rec("t1", 3, errors=["timeout"], finish="cut", cut="interrupted", cost=0.5),  # a pause sample of request 3
        _rec("t1", 3, errors=["timeout"], ended="answered"),
        _rec("t2", 1, calls=1), _rec("t2", 2, errors=[None], finish="length"),  # a cut answer ends it
        _rec("t3", 1, calls=1),  # then its request 2 failed for good
        _rec("t4", 1, calls=3),  # still open
        _rec("u1", 1, calls=1, env="b"), _rec("u1", 2, results=1, ended="capped", env="b"),  # kinds not said
        {**_rec("plain", 1), "meta": {}},  # no rollout
    ]:
        tally.add(r)
    for f in [{"id": "t3#2", "conversation_id": "t3", "turn": 2, "environment": "a"},
              {"id": "t5", "conversation_id": "t5", "turn": 1, "environment": "a"},  # failed before any record
              {"id": "p2"}]:  # no rollout
        tally.fail(f, "D")
    a, b = tally.figures()["a"], tally.figures()["b"]
    assert a["tasks"] == 5 and a["ended"] == {"answered": 1, "capped": 0, "cut": 1, "failed": 2} and a["open"] == 1
    assert a["steps_per_task"] == {"mean": 1.5, "p50": 1.5, "p90": 2.7}  # t1 3, t2 2, t3 1, t5 0
    assert a["requests"] == 7 and a["calls"] == 8 and a["calls_per_step"] == round(8 / 7, 3)
    assert a["errors"] == {"raised": 1, "timeout": 1} and a["results"] == 4 and a["results_kind_unknown"] == 0
    assert a["pause_samples"] == 1 and a["usd"] == pytest.approx(0.5 + 7 * 0.01)
    assert a["prompt_tokens"] == 80 and a["output_tokens"] == 40
    assert b["ended"]["capped"] == 1 and b["results"] == 1 and b["results_kind_unknown"] == 1 and b["errors"] == {}
    merged = Tally().merge(tally).merge(tally)  # the same trajectories twice are the same trajectories
    assert merged.figures()["a"]["tasks"] == 5 and merged.figures()["a"]["calls"] == 16
    [row_a, row_b] = environment_rows(tally.figures())
    assert row_a["environment"] == "a" and row_a["errors_by_kind"] == "raised 1, timeout 1" and row_b["capped"] == 1


def test_an_environment_is_labelled_by_bfcls_classes_or_the_users_class_and_kinds_are_never_guessed():
    assert environment_label({"environment": "bfcl", "involved_classes": ["MathAPI", "TwitterAPI"]}) \
        == "bfcl:MathAPI,TwitterAPI"
    assert environment_label({"environment": "/tmp/x/kv_store.py:KeyValueStore"}) == "kv_store.py:KeyValueStore"
    assert environment_label({"environment": "pkg.mod:Env"}) == "pkg.mod:Env"
    assert result_parts(["a", "Error during execution: boom"]) == (("a", "Error during execution: boom"), None)
    assert result_parts([Shown("a"), Shown("E", "raised")]) == (("a", "E"), (None, "raised"))
    with pytest.raises(TypeError):
        result_parts(["a", Shown("E", "raised")])


def _run(tmp_path: Path, prompts: Path, seams: Seams | None, seed: int, **emu) -> dict:
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"K:\n  prompts: {prompts}\n")
    with run_emulator(speed=0, content=SMALL, generation_delay=0.02, balance=1000, seed=seed, **emu) as e:
        cfg = GenerateConfig(dataset="K", datasets_file=str(datasets), base_url=e.base_url,
                             output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), concurrency=40,
                             max_tokens=300, progress=False, reserve_usd=0.0, retry_base_s=0.01, retry_cap_s=0.2,
                             rollout_steps=STEPS, tool_call_s=20.0)
        summary = asyncio.run(run_generation(cfg, seams=seams))
        truth = {t["generation_id"]: t for t in e.ground_truth()}
    summary["truth"] = truth
    return summary


def test_a_run_reports_per_environment_what_its_records_hold(tok, tmp_path):
    """Against the emulator with an executor that says its kinds: every request that carries results keeps their
    kinds in order, and summary.json's `rollouts` is what the records and the executor say (tasks, endings, steps per
    task, calls, errors by kind, tokens, money)."""
    objs = {o["id"]: o for o in tasks(30)}
    prompts = tmp_path / "K.jsonl"
    prompts.write_text("".join(json.dumps(o) + "\n" for o in objs.values()))
    ex = Executions(kinds=True)
    summary = _run(tmp_path, prompts, Seams(environments=ex), seed=61)
    d = tmp_path / "out" / "datasets" / "K"
    chains = check_trajectories(tok, d, objs, summary.pop("truth"), STEPS)
    records = [r for chain in chains.values() for r in chain]
    by_id = {r.id: r for r in records}
    for r in records:
        assert r.meta["rollout"]["environment"] == ENVIRONMENT
        if r.turn > 1 and (prev := by_id[f"{r.conversation_id}#{r.turn - 1}" if r.turn > 2 else r.conversation_id]) \
                .tool_calls:
            shown = r.messages[-len(prev.tool_calls):]
            assert [m["tool_call_id"] for m in shown] == [c["id"] for c in prev.tool_calls]
            assert [k is not None for k in r.meta["rollout"]["errors"]] == [m["content"].startswith("Error")
                                                                             for m in shown]
        else:
            assert "errors" not in r.meta["rollout"]
    figures = summary["rollouts"][ENVIRONMENT]
    assert json.loads((d / "summary.json").read_text())["rollouts"] == summary["rollouts"]
    lengths = [len(c) for c in chains.values()]
    ends = Counter(c[-1].meta["rollout"].get("ended") for c in chains.values())
    assert figures["tasks"] == 30 and figures["open"] == 0
    assert figures["ended"] == {"answered": ends["answered"], "capped": ends["capped"], "cut": 0, "failed": 0}
    assert figures["steps_per_task"]["mean"] == round(sum(lengths) / 30, 3) and figures["requests"] == sum(lengths)
    assert figures["steps_per_task"]["p90"] >= figures["steps_per_task"]["p50"] >= min(lengths)
    capped = sum(len(c[-1].tool_calls) for c in chains.values() if c[-1].meta["rollout"].get("ended") == "capped")
    assert figures["calls"] == sum(len(r.tool_calls or ()) for r in records) == sum(map(len, ex.asked)) + capped
    assert figures["results"] == sum(map(len, ex.asked))  # a capped answer's calls are made, never executed
    assert figures["errors"] == dict(sorted(ex.errors.items())) and len(ex.errors) >= 2, ex.errors
    assert figures["results_kind_unknown"] == 0
    assert figures["output_tokens"] == sum(r.output_tokens for r in records)
    assert figures["usd"] == pytest.approx(sum(r.usage.cost or 0 for r in records))
    table = environments_table(summary)  # the report's table
    assert list(table.index) == [ENVIRONMENT] and table.loc[ENVIRONMENT, "tasks"] == 30


def test_the_default_executor_says_its_kinds_and_they_are_a_fresh_replays(tmp_path):
    """agentic's executor (in process here) returns each result with its kind: the records' kinds are what a fresh
    environment gives when the recorded calls are replayed (examples/agentic's store, the agent's slips on), and the
    summary counts them per kind under the user class's label."""
    from eagledata.agentic import InProcessEnvironments
    from eagledata.agentic.executor import RolloutExecutor
    from eagledata.agentic.tasks import read_tasks

    examples, folder = ROOT / "examples" / "agentic", tmp_path / "tasks"
    folder.mkdir()
    shutil.copy(examples / "kv_store.py", folder / "kv_store.py")
    rows = [json.loads(line) for line in (examples / "kv_tasks.jsonl").read_text().splitlines() if line.strip()]
    with (folder / "K.jsonl").open("w") as f:
        for i in range(16):
            f.write(json.dumps({**rows[i % len(rows)], "id": f"kv-{i:02d}"}) + "\n")
    style = {"context_share": 0.7, "slips": {"unknown_name": 0.15, "bad_json": 0.15, "missing_required": 0.1,
                                             "wrong_type": 0.1}}
    summary = _run(tmp_path, folder / "K.jsonl", Seams(environments=RolloutExecutor(InProcessEnvironments())),
                   seed=63, tool_style=style)
    records = load_records(tmp_path / "out" / "datasets" / "K" / "records.jsonl")
    last = {r.conversation_id: r for r in sorted(records, key=lambda r: r.turn)}
    specs, local, kinds = {t.id: t for t in read_tasks(folder / "K.jsonl")}, InProcessEnvironments(), Counter()
    recorded = Counter(k for r in records for k in r.meta["rollout"].get("errors") or () if k is not None)
    for cid, r in last.items():
        env = local.open(specs[cid].spec(base=folder))
        for m in r.messages:
            for c in m.get("tool_calls") or ():
                got = env.execute(c["function"]["name"], c["function"]["arguments"])
                kinds[got.error] += got.error is not None
        env.close()
    kinds += Counter()  # drop the zero counts
    assert sum(kinds.values()) >= 4 and recorded == kinds, (recorded, kinds)
    [(label, figures)] = summary["rollouts"].items()
    assert label == "kv_store.py:KeyValueStore" and figures["errors"] == dict(sorted(kinds.items()))
    assert figures["tasks"] == 16 and figures["results_kind_unknown"] == 0
