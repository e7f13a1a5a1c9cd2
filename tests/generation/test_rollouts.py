"""Rollouts (issue 61 items 2 and 3): tasks that name an environment, every user turn asked on the trajectory so far,
the model's calls executed through the injected seam and their results sent with the calls' exact ids; the records
token-exact, their ids stable, the trajectories whole through SIGKILLs."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagledata.emulator import run_emulator
from eagledata.errors import InputError
from eagledata.generation import GenerateConfig
from eagledata.generation.conversations.rollouts import ANSWERED, CAPPED, recorded_results
from eagledata.generation.conversations.store import ENDS, GOES_ON, Store
from eagledata.generation.conversations.turns import Conversation
from eagledata.generation.realtime.parts import Seams
from eagledata.generation.run import run_generation
from eagledata.prompts import normalize_prompt, scan_prompts
from eagledata.records import Answer, Record, ToolCall, load_records
from tests.helpers.kills import kill_while_writing
from tests.helpers.rollouts import (
    ENVIRONMENT,
    TOOLS,
    Executions,
    ReplayMismatch,
    check_trajectories,
    planned_steps,
    replayed,
    task,
    tasks,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.5, "content_median": 15, "content_sigma": 0.5, "max_total": 300}
STEPS = 3  # the cap per user turn in these runs: the emulated model's 3-round turns reach it


def call(name: str, idx: int, args: str = '{"key": "a"}') -> ToolCall:
    return ToolCall(f"functions.{name}:{idx}", name, args)


def calls_answer(*calls: ToolCall) -> Answer:
    return Answer("think", "", "tool_calls", calls)


def plain(text: str = "done") -> Answer:
    return Answer("think", text, "stop")


# -- the task row ------------------------------------------------------------------------------------------------------

def test_a_task_row_reads_its_environment_and_user_turns_and_bad_ones_name_the_field():
    """An agentic task file's row (docs/FORMATS.md "Agentic tasks") is a prompt: its task fields kept for the executor,
    its turns asked one by one."""
    p = normalize_prompt(task(1, 2))
    assert p.task == {"id": "task-001", "environment": ENVIRONMENT, "initial_config": {"seed": "1", "owner": "eagle"},
                      "involved_classes": [], "tools": TOOLS}
    assert p.user_turns == (({"role": "system", "content": "You keep a key-value store."},
                             {"role": "user", "content": "task 1 turn 0: keep the store tidy"}),
                            ({"role": "user", "content": "task 1 turn 1: keep the store tidy"},))
    assert [m["role"] for m in p.messages] == ["system", "user", "user"] and p.tools == TOOLS
    for change, field in [({"environment": {"kind": "kv"}}, "environment"), ({"turns": []}, "turns"),
                          ({"turns": [[{"role": "user", "content": "a"}], [{"role": "assistant", "content": "x"}]]},
                           "turns[1][0].role"),
                          ({"turns": [[{"role": "user", "content": 3}]]}, "turns[0][0].content"),
                          ({"turns": [[{"role": "system", "content": "x"}]]}, "turns[0]"),
                          ({"initial_config": []}, "initial_config"), ({"involved_classes": "A"}, "involved_classes")]:
        with pytest.raises(InputError, match=f"field '{field}'".replace("[", r"\[")):
            normalize_prompt({**task(1, 2), **change})


def test_a_task_is_a_rollout_whatever_turns_says_and_the_scan_counts_them(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in [task(0, 2), {"id": "x", "messages": [
        {"role": "user", "content": "hi"}]}]))
    scan = scan_prompts(path)
    assert scan.rollouts == 1 and scan.total == 2
    c = Conversation.of(normalize_prompt(task(0, 2)), "last", steps=4)
    assert c.rollout is not None and c.rollout.steps == 4 and len(c.asks) == 2 and c.chained


# -- a trajectory, step by step (pure) ---------------------------------------------------------------------------------

def test_steps_number_on_calls_wait_for_results_and_the_results_carry_the_calls_ids():
    c = Conversation.of(normalize_prompt(task(2, 2)), steps=3)
    t1 = c.turn()
    assert t1.id == "task-002" and t1.number == 1 and not t1.due
    assert [m["role"] for m in t1.messages] == ["system", "user"]
    a1 = calls_answer(call("put", 0), call("get", 1))
    assert not t1.ends(a1)
    t2 = t1.next(a1)
    assert t2 is not None and t2.id == "task-002#2" and t2.due == a1.tool_calls
    assert t2.replay == ((), a1.tool_calls)
    t2 = t2.with_results(["r0", "r1"])
    assert t2.messages[-2:] == [{"role": "tool", "tool_call_id": "functions.put:0", "content": "r0"},
                                {"role": "tool", "tool_call_id": "functions.get:1", "content": "r1"}]
    assert t2.messages[-3]["tool_calls"][1]["id"] == "functions.get:1" and t2.messages[-3]["reasoning"] == "think"
    assert (t2.position.user_turn, t2.position.step) == (0, 2)
    a2 = calls_answer(call("count", 2))
    t3 = t2.next(a2)
    assert t3 is not None  # the earlier calls replayed first, each with the result the model was shown
    assert t3.replay == (((a1.tool_calls[0], "r0"), (a1.tool_calls[1], "r1")), a2.tool_calls)
    t3 = t3.with_results(["r2"])
    a3 = plain("first done")
    t4 = t3.next(a3)  # the next user turn, on the whole trajectory; the loop's reasoning dropped before a plain answer
    assert t4 is not None and t4.id == "task-002#4" and not t4.due
    assert (t4.position.user_turn, t4.position.step) == (1, 1)
    assert t4.messages[-1] == {"role": "user", "content": "task 2 turn 1: keep the store tidy"}
    assert t4.messages[:2] == list(c.asks[0]) and t4.messages[0]["role"] == "system"
    assert not any("reasoning" in m for m in t4.messages)
    assert t4.later == 0 and t1.later == 1
    assert t4.ends(plain()) and t4.next(plain()) is None  # the last user turn answered
    assert t4.ends(Answer("x", "y", "length"))  # a cut answer ends it too
    # rebuilt from the records (a resume): the same request, the executed results read from the last one's messages
    answers = [a1, a2, a3]
    assert c.turn(answers, recorded_results(answers, t3.messages, "r")) == t4
    assert c.turn(answers[:2], recorded_results(answers[:2], t2.messages, "r")) == t2.next(a2)


def test_the_step_cap_ends_the_trajectory_where_the_model_still_calls():
    c = Conversation.of(normalize_prompt(task(3, 3)), steps=2)
    t = c.turn().next(calls_answer(call("put", 0)))
    assert t is not None
    t = t.with_results(["ok"])
    capped = calls_answer(call("put", 1))
    assert t.position.step == 2 and t.ends(capped) and t.next(capped) is None
    assert not t.ends(plain())  # a plain answer at the cap goes on to the next user turn


def test_a_rollout_records_ending_is_what_the_store_index_says_and_non_rollouts_read_as_before(tmp_path, tok):
    """The store's GOES_ON/ENDS of a rollout record comes from `meta.rollout.ended` (planted: drop `ended` from the
    last record and the trajectory stays open)."""
    from eagledata.text import output_ids, prompt_ids

    def rec(rid, turn, meta, finish="stop"):
        msgs = [{"role": "user", "content": rid}]
        return Record(id=rid, dataset="T", conversation_id="c", turn=turn, messages=msgs, reasoning="r", content="x",
                      finish_reason=finish, prompt_ids=prompt_ids(tok, msgs),
                      output_ids=output_ids(tok, "r", "x", finish), meta=meta)
    d = tmp_path / "T"
    with Store.open(d) as store:
        store.add_record(rec("c", 1, {"rollout": {"user_turn": 1, "step": 1}}))
        assert "c" in store.chains and "c" not in store.finished
        store.add_record(rec("c#2", 2, {"rollout": {"user_turn": 2, "step": 1, "ended": ANSWERED}}))
        assert "c" not in store.chains and "c" in store.finished
    (d / "done.idx").unlink()  # rebuilt from the records: the same
    with Store.open(d) as store:
        assert "c" in store.finished and not store.chains
    from eagledata.generation.conversations.store import _does
    assert _does(2, {"rollout": {"user_turn": 2, "step": 3}}, "tool_calls") == GOES_ON
    assert _does(2, {"rollout": {"user_turn": 2, "step": 3, "ended": CAPPED}}, "tool_calls") == ENDS
    assert _does(2, {"rollout": {"user_turn": 1, "step": 1}}, "length") == ENDS
    assert _does(2, {"turns": 3}, "stop") == GOES_ON and _does(3, {"turns": 3}, "stop") == ENDS


def test_a_fresh_replay_catches_a_result_computed_on_the_wrong_state():
    """The check itself can fail: a result recorded as if a call had run twice is caught."""
    obj = task(5, 1)
    put = call("put", 0, '{"key": "k", "value": "v"}')
    ex = Executions()
    row = normalize_prompt(obj).task
    (first,) = ex(row, (), (put,))
    (twice,) = ex(row, ((put, first),), (put,))
    assert first != twice
    with pytest.raises(ReplayMismatch):  # the executor's own check: a replay that disagrees with what was shown
        ex(row, ((put, twice),), (put,))
    msgs = [{"role": "assistant", "content": "", "tool_calls": [put.to_api()]},
            {"role": "tool", "tool_call_id": put.id, "content": twice}]
    [(cid, recorded, fresh)] = replayed(obj, msgs)
    assert recorded != fresh and fresh == first


# -- against the emulator ----------------------------------------------------------------------------------------------

def _setup(tmp_path: Path, n: int) -> tuple[dict[str, dict], Path]:
    objs = {o["id"]: o for o in tasks(n)}
    prompts = tmp_path / "K.jsonl"
    prompts.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs.values()))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"K:\n  prompts: {prompts}\n")
    return objs, datasets


def _cfg(tmp_path: Path, datasets: Path, url: str, **kw) -> dict:
    return {"dataset": "K", "datasets_file": str(datasets), "base_url": url, "output_dir": str(tmp_path / "out"),
            "params_dir": str(tmp_path / "params"), "concurrency": 40, "max_tokens": 300, "progress": False,
            "reserve_usd": 0.0, "retry_base_s": 0.01, "retry_cap_s": 0.2, "rollout_steps": STEPS, **kw}


def test_rollouts_against_the_emulator_every_step_exact_and_every_result_a_fresh_replays(tok, tmp_path):
    objs, datasets = _setup(tmp_path, 40)
    ex = Executions()
    with run_emulator(speed=0, content=SMALL, generation_delay=0.02, balance=1000, seed=61) as emu:
        cfg = GenerateConfig(**_cfg(tmp_path, datasets, emu.base_url))
        summary = asyncio.run(run_generation(cfg, seams=Seams(environments=ex)))
        truth = {t["generation_id"]: t for t in emu.ground_truth()}
        assert "Traceback" not in emu.log()
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0
    chains = check_trajectories(tok, tmp_path / "out" / "datasets" / "K", objs, truth, STEPS)
    ends = [c[-1].meta["rollout"].get("ended") for c in chains.values()]
    assert ends.count(CAPPED) >= 2 and ends.count(ANSWERED) >= 20, ends
    results = [m["content"] for c in chains.values() for m in c[-1].messages if m["role"] == "tool"]
    assert any(r.startswith("Error: unknown function 'erase'") for r in results)  # declared, no method: goes on
    assert any(r.startswith("Error: RuntimeError") for r in results)  # a method that raises
    assert sum(len(c) for c in chains.values()) > 80
    assert any(len(m["tool_calls"]) > 1 for c in chains.values() for m in c[-1].messages if m.get("tool_calls"))
    assert sum(map(len, ex.asked)) == sum(len(m["tool_calls"]) for c in chains.values() for m in c[-1].messages
                                          if m.get("tool_calls"))  # each step's calls executed once (no retries here)
    # the model's plan, step for step: a user turn with R tool rounds is R+1 requests (R+... capped at STEPS)
    for cid, chain in chains.items():
        if chain[-1].meta["rollout"].get("ended") == ANSWERED:
            assert len(chain) == sum(r + 1 for r in planned_steps(objs[cid])), cid


def test_a_run_with_tasks_and_no_executor_stops_before_any_request(tmp_path):
    """The engine's own guard (a caller of the realtime route that passes its seams; `run_generation` makes a
    contained executor for every run): no request is sent."""
    from eagledata.generation.realtime.engine import run_realtime

    objs, datasets = _setup(tmp_path, 2)
    with run_emulator(speed=0, balance=1000, seed=1) as emu:
        cfg = GenerateConfig(**_cfg(tmp_path, datasets, emu.base_url))
        with pytest.raises(InputError, match="name an environment"):
            asyncio.run(run_realtime(cfg, "k", Seams(), None, None))
        assert not emu.ground_truth()


def test_a_users_environment_runs_through_the_default_route_contained(tok, tmp_path):
    """Issue 61: a task file naming a user's class by a path relative to it (examples/agentic's key-value store,
    the file copied elsewhere with its tasks) runs from `run_generation`'s defaults as any prompt file does: each
    step in a contained worker, the emulated agent's calls slipping (unknown names, bad JSON, missing or mistyped
    arguments) and reusing what it was shown. Every tool result in the records is what a fresh environment gives when
    the recorded calls are replayed in order (in process, an independent path); each slip an error result, the
    trajectory going on."""
    import shutil

    from eagledata.agentic import InProcessEnvironments
    from eagledata.agentic.tasks import read_tasks

    examples = ROOT / "examples" / "agentic"
    folder = tmp_path / "tasks"
    folder.mkdir()
    shutil.copy(examples / "kv_store.py", folder / "kv_store.py")
    rows = [json.loads(line) for line in (examples / "kv_tasks.jsonl").read_text().splitlines() if line.strip()]
    with (folder / "K.jsonl").open("w") as f:  # twenty tasks: the examples' under other ids
        for i in range(20):
            f.write(json.dumps({**rows[i % len(rows)], "id": f"kv-{i:02d}"}) + "\n")
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"K:\n  prompts: {folder / 'K.jsonl'}\n")
    style = {"context_share": 0.7, "slips": {"unknown_name": 0.1, "bad_json": 0.1, "missing_required": 0.1,
                                             "wrong_type": 0.1}}
    with run_emulator(speed=0, content=SMALL, generation_delay=0.02, balance=1000, seed=63, tool_style=style) as emu:
        cfg = GenerateConfig(**_cfg(tmp_path, datasets, emu.base_url, tool_call_s=20.0))
        summary = asyncio.run(run_generation(cfg))
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0
    records = load_records(tmp_path / "out" / "datasets" / "K" / "records.jsonl")
    last = {r.conversation_id: r for r in sorted(records, key=lambda r: r.turn)}  # each trajectory's last request:
    # every call and result before it in its messages
    assert len(last) == 20
    tasks = {t.id: t for t in read_tasks(folder / "K.jsonl")}
    local, shown, errors = InProcessEnvironments(), 0, 0
    for cid, r in last.items():
        env = local.open(tasks[cid].spec(base=folder))
        results = {m["tool_call_id"]: m["content"] for m in r.messages if m["role"] == "tool"}
        for m in r.messages:
            for c in m.get("tool_calls") or ():
                got = env.execute(c["function"]["name"], c["function"]["arguments"])
                assert results[c["id"]] == got.text, (cid, c)
                shown, errors = shown + 1, errors + (got.error is not None)
        env.close()
    assert shown >= 30 and errors >= 5, (shown, errors)  # slips were made, shown as errors, and the runs went on


def _interrupt(cmd: list[str], records: Path, **popen) -> str:
    """A Ctrl-C (SIGINT) once the run writes: it drains and says how it stopped."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None and not (records.exists() and records.stat().st_size):
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.decode().splitlines()[-1])["stop_reason"]


def test_sigkills_mid_trajectory_resume_at_the_exact_step_and_every_trajectory_is_whole(tok, tmp_path):
    """A Ctrl-C and three SIGKILLs while rollouts are in flight (streams, faults on), then a run to the end: every
    trajectory whole (each step once, each result a fresh replay's, ids exact), the ones open at a stop continued at
    their next step. (Planted: a resume one step early, or a due call run on a state that already held it, fails
    here.)"""
    objs, datasets = _setup(tmp_path, 60)
    faults = {"rate_limit": 0.03, "bad_gateway": 0.02, "timeout": 0.01, "connection_reset": 0.01, "retry_after": 0}
    records = tmp_path / "out" / "datasets" / "K" / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    with run_emulator(speed=0.15, content=SMALL, generation_delay=0.05, balance=1000, seed=62, faults=faults) as emu:
        cmd = [sys.executable, "-m", "tests.helpers.rollouts", json.dumps(_cfg(tmp_path, datasets, emu.base_url))]
        assert _interrupt(cmd, records, env=env, cwd=ROOT) == "interrupted"
        kills, sizes = kill_while_writing(cmd, [records], random.Random(62), 3, after_s=(0.3, 1.2), env=env,
                                          cwd=ROOT)
        assert kills >= 2, sizes
        at_kills = load_records(records, tolerate_torn_tail=True)
        final = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        assert final.returncode == 0, final.stderr[-3000:]
        truth = {t["generation_id"]: t for t in emu.ground_truth()}
        assert "Traceback" not in emu.log()
    summary = json.loads((records.parent / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0
    chains = check_trajectories(tok, records.parent, objs, truth, STEPS)
    killed = {r.id for r in at_kills}
    open_at_kill = {r.conversation_id for r in at_kills if "ended" not in r.meta["rollout"]
                    and r.finish_reason in ("stop", "tool_calls")} - {r.conversation_id for r in at_kills
                                                                       if "ended" in r.meta["rollout"]}
    resumed = [r for cid in open_at_kill for r in chains[cid] if r.id not in killed]
    assert open_at_kill and resumed and all(r.turn > 1 for r in resumed)
    assert any(chains[cid][0].id in killed and r.meta["rollout"]["step"] > 1 for cid in open_at_kill
               for r in chains[cid] if r.id not in killed), "no trajectory resumed mid tool loop"
    print(f"kills {kills}, trajectories {len(chains)}, records {sum(map(len, chains.values()))}, open at a kill "
          f"{len(open_at_kill)}, resumed steps {len(resumed)}")

