"""Exports from agentic trajectories (issue 61 item 7): speculators' and SpecForge's samples from rollout records are
made exactly as from tool-call conversations: one sample per request's record, its history (the model's own earlier
answers, the calls' exact ids and the tool results) as context with loss 0, its answer with loss 1. A run stopped by a
Ctrl-C and resumed leaves pause samples beside the answers asked again: the assembly keeps each request's answer
once, so every assistant turn of every trajectory is supervised exactly once and nothing is dropped. (Planted: a
pause sample kept beside its finished answer, by `supersedes` saying no, fails here.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from eagledata.emulator import run_emulator
from eagledata.files import iter_jsonl
from eagledata.generation.conversations.turns import pauses
from eagledata.records import load_records
from eagledata.training.assembly import AssemblyPolicy, assemble
from eagledata.training.exports import export_specforge, export_speculators
from tests.helpers.rollouts import check_trajectories, tasks

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.5, "content_median": 15, "content_sigma": 0.5, "max_total": 300}
STEPS = 3


def _cfg(tmp_path: Path, datasets: Path, url: str) -> dict:
    return {"dataset": "K", "datasets_file": str(datasets), "base_url": url, "output_dir": str(tmp_path / "out"),
            "params_dir": str(tmp_path / "params"), "concurrency": 40, "max_tokens": 300, "progress": False,
            "reserve_usd": 0.0, "retry_base_s": 0.01, "retry_cap_s": 0.2, "rollout_steps": STEPS}


def _rollout_records(tok, tmp_path: Path, n: int) -> tuple[Path, dict]:
    """A rollout dataset as a user makes it: a run Ctrl-C'd while its streams are in flight (their prefixes kept as
    pause samples), then run to the end; every trajectory checked whole."""
    objs = {o["id"]: o for o in tasks(n)}
    prompts, datasets = tmp_path / "K.jsonl", tmp_path / "datasets.yaml"
    prompts.write_text("".join(json.dumps(o) + "\n" for o in objs.values()))
    datasets.write_text(f"K:\n  prompts: {prompts}\n")
    records = tmp_path / "out" / "datasets" / "K" / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    with run_emulator(speed=0.15, content=SMALL, generation_delay=0.05, balance=1000, seed=71) as emu:
        cmd = [sys.executable, "-m", "tests.helpers.rollouts", json.dumps(_cfg(tmp_path, datasets, emu.base_url))]
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=ROOT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not (records.exists()
                                                                         and records.stat().st_size > 20_000):
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        final = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        assert final.returncode == 0, final.stderr[-3000:]
        truth = {t["generation_id"]: t for t in emu.ground_truth()}
    check_trajectories(tok, records.parent, objs, truth, STEPS)
    return records, objs


def test_trajectories_export_one_sample_per_request_with_the_history_as_context(tok, tmp_path):
    records_path, objs = _rollout_records(tok, tmp_path, 24)
    records = load_records(records_path)
    paused = [r for r in records if pauses(r.meta)]
    answers = [r for r in records if not pauses(r.meta)]
    assert len({(r.conversation_id, r.turn) for r in answers}) == len(answers)  # each request recorded once
    assert paused, "the Ctrl-C kept no prefix: the scenario is not exercised"
    assembly = assemble([records_path], tok=tok, policy=AssemblyPolicy(max_length=None))
    # nothing dropped but the pause samples, each replaced by its request's finished answer; nothing twice
    assert [r.id for r in assembly.records] == [r.id for r in answers if r.id in {a.id for a in assembly.records}]
    assert sorted(r.id for r in assembly.records) == sorted(r.id for r in answers), assembly.dropped
    assert Counter(assembly.dropped) == Counter({"replaced_by_finished": len(paused)} if paused else {})
    by_id = {r.id: r for r in answers}
    loss_tokens: Counter[str] = Counter()
    for s, r in zip(assembly.samples, assembly.records):
        assert s.input_ids == r.prompt_ids + r.output_ids and s.loss_mask == r.loss_mask and s.turn == r.turn
        loss_tokens[r.conversation_id] += sum(s.loss_mask)
        prompt_text = tok.decode(r.prompt_ids)
        for m in r.messages:  # the tool results and the model's earlier calls are context, with their exact ids
            if m["role"] == "tool":
                assert f"## Return of {m['tool_call_id']}" in prompt_text and m["content"] in prompt_text
            for c in m.get("tool_calls") or ():
                assert f"{c['id']}<|tool_call_argument_begin|>{c['function']['arguments']}" in prompt_text
        if r.turn > 1:  # in a tool loop in flight, the answer before is in the context exactly as it was generated
            prev = by_id[r.conversation_id if r.turn == 2 else f"{r.conversation_id}#{r.turn - 1}"]
            if prev.tool_calls and r.meta["rollout"]["step"] > 1:
                assert s.input_ids[:len(prev.input_ids)] == prev.input_ids, r.id
    # every assistant turn of every trajectory supervised exactly once: its own output, in its own sample
    assert loss_tokens == Counter({cid: sum(len(r.output_ids) for r in answers if r.conversation_id == cid)
                                   for cid in objs})

    spec_path, forge_path = tmp_path / "speculators.jsonl", tmp_path / "specforge.jsonl"
    export_speculators(assembly, spec_path)
    export_specforge(assembly, forge_path, tok)
    spec = [row for _, row in iter_jsonl(spec_path)]
    forge = [row for _, row in iter_jsonl(forge_path)]
    assert [row["id"] for row in spec] == [row["id"] for row in forge] == [r.id for r in assembly.records]
    for row, frow, r in zip(spec, forge, assembly.records):
        assert row["input_ids"] == frow["input_ids"] == r.input_ids and row["loss_mask"] == frow["loss_mask"]
        assert (row["conversation_id"], row["turn"]) == (frow["conversation_id"], frow["turn"]) \
            == (r.conversation_id, r.turn)
        assert frow["text"] == tok.decode(r.input_ids) and frow["tools"] == r.tools
        *history, answer = frow["conversations"]
        assert [m["role"] for m in history] == [m["role"] for m in r.messages]
        assert [m.get("tool_call_id") for m in history] == [m.get("tool_call_id") for m in r.messages]
        assert [m.get("tool_calls") for m in history] == [m.get("tool_calls") for m in r.messages]
        assert answer["role"] == "assistant" and answer["content"] == r.content \
            and answer.get("tool_calls") == r.tool_calls
