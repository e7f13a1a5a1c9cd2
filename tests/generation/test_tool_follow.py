"""A newcomer's agent dataset against the emulator (issue 44, "Tool loops that end at once").

Ten multi-step tool conversations written by another agent: their first round never is what the emulated model plans
for the task by itself. With the model following the dataset's calls (`tool_follow_rate`, 0.8 for `base_url:
emulator`) most loops go on past turn 1; with 0 every one ends at turn 1 on a mismatch, as all ten did before. The
summary and the report's sentence say how many ended so, how, and why.
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from eagledata.emulator import run_emulator
from eagledata.emulator.toolcalls import task_rounds
from eagledata.emulator_process import embedded_config
from eagledata.generation import GenerateConfig, run_generation, tool_loop_note
from eagledata.records import load_records

NAMES = ("lookup_order", "refund", "send_email")
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}}}}} for n in NAMES]


def agent_dataset(path: Path, n: int = 10) -> Path:
    """`n` conversations of 2–3 tool rounds each, each ending in the agent's plain answer then a follow-up question;
    round 1 is never the emulated model's own plan for the task (so only following can continue the loop)."""
    lines, k = [], 0
    while len(lines) < n:
        task = f"Customer {k} says order #{1000 + k} arrived broken; sort it out."
        k += 1
        plan = task_rounds(task, NAMES, parallel=False)
        first = next(name for name in NAMES if not plan or plan[0] != (name,))
        rounds = [(first,), ("refund",), ("send_email",)][: 2 + len(lines) % 2]
        msgs: list[dict] = [{"role": "system", "content": "You are a support agent."},
                            {"role": "user", "content": task}]
        idx = 0
        for r, (name,) in enumerate(rounds):
            cid = f"call_{k}_{r}"
            msgs.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps({"order_id": k})}}]})
            msgs.append({"role": "tool", "tool_call_id": cid, "content": f"{name} done for order {k} ({idx})"})
            idx += 1
        msgs += [{"role": "assistant", "content": "All sorted: refund issued and the customer told."},
                 {"role": "user", "content": "Thanks. Anything else I should check?"}]
        lines.append(json.dumps({"id": f"agent-{len(lines):02d}", "tools": TOOLS, "messages": msgs}))
    path.write_text("\n".join(lines) + "\n")
    return path


def run(tmp_path: Path, base_url: str, out: str) -> tuple[dict, dict[str, int]]:
    prompts = agent_dataset(tmp_path / "agent.jsonl")
    (tmp_path / "datasets.yaml").write_text(f"agent:\n  prompts: {prompts}\n")
    cfg = GenerateConfig(dataset="agent", datasets_file=str(tmp_path / "datasets.yaml"), base_url=base_url,
                         output_dir=str(tmp_path / out), params_dir=str(tmp_path / "params"), emulator_speed=0.0,
                         concurrency=16, progress=False, reserve_usd=0.0)
    summary = asyncio.run(run_generation(cfg))
    last: dict[str, int] = {}
    for r in load_records(tmp_path / out / "datasets" / "agent" / "records.jsonl"):
        last[r.conversation_id] = max(last.get(r.conversation_id, 0), r.turn)
    return summary, last


def test_following_the_dataset_carries_the_loops_past_turn_one(tmp_path):
    """`base_url: emulator`: the run's own emulator (seed 0) knows the dataset and follows it at 0.8 a round."""
    summary, last = run(tmp_path, "emulator", "follow")
    assert summary["stop_reason"] == "completed" and summary["failures"] == 0
    reached = Counter(last.values())
    assert sum(n for turn, n in reached.items() if turn >= 2) == 8  # 8 of 10 go on past turn 1 (seed 0)
    assert reached == {1: 2, 3: 1, 4: 4, 5: 3}  # 7 run to their end (4 asks for two rounds, 5 for three)
    tools = summary["run"]["tool_calls"]
    assert tools["mismatched"] == 3 and tools["mismatches"] == {"plain": 1, "called": 1, "other": 1}
    note = tool_loop_note(summary)
    assert note.startswith("Tool loops: 3 conversations of the 10 this run started ended on a tool-call mismatch "
                           "(1 answered plainly where the dataset called a tool; 1 called a tool where the dataset "
                           "answered plainly; 1 called other tools (or other counts of them) than the dataset): ")
    assert "none are invented" in note


def test_without_following_every_loop_ends_at_turn_one(tmp_path):
    """Rate 0: the model plans from the task alone, which this dataset never matches, as the newcomer saw."""
    config = embedded_config(speed=0, tool_datasets=[agent_dataset(tmp_path / "agent.jsonl")], tool_follow_rate=0.0)
    with run_emulator(config) as emu:
        summary, last = run(tmp_path, emu.base_url, "plan")
        assert emu.stats()["tool_rounds"] == {"own": 10}
    assert set(last.values()) == {1} and len(last) == 10
    tools = summary["run"]["tool_calls"]
    assert tools["mismatched"] == 10 and sum(tools["mismatches"].values()) == 10
    note = tool_loop_note(summary)
    assert note.startswith("Tool loops: 10 conversations of the 10 this run started ended on a tool-call mismatch")
