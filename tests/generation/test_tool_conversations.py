"""The tool-call must-hold: 200 agent conversations against the emulator, faults on, one SIGKILL and a resume.

The dataset is built the way real agent data is: each conversation's tool rounds are the ones the (emulated) model
runs for its task, with the dataset's own `call_…` ids and results; a few have a round deliberately changed, so the
target's calls cannot match and the conversation must end after that tool-call turn, with no result invented.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

from eagledata.emulator import run_emulator
from eagledata.emulator.toolcalls import reserialized, task_rounds
from eagledata.records import Record, load_records
from eagledata.text import parse_output_ids, prompt_ids
from tests.helpers.kills import kill_while_writing
from tests.helpers.records import recorded_turns

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.5, "content_median": 20, "content_sigma": 0.5, "max_total": 400}
MIX = {"rate_limit": 0.04, "upstream_rate_limit": 0.02, "bad_gateway": 0.01, "unavailable": 0.01, "timeout": 0.01,
       "error_in_choice": 0.01, "empty_content": 0.01, "truncated_json": 0.01, "connection_reset": 0.01,
       "retry_after": 0}
NAMES = ("get_weather", "search_web", "run_python")
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}} for n in NAMES]
OLD = "OLD ANSWER"


def conversation(i: int, task: str, rounds: list[tuple[str, ...]], follow_up: str | None) -> dict:
    """An agent conversation with the dataset's own ids (`call_…`) and results; ends in a plain answer."""
    msgs: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]
    for r, names in enumerate(rounds):
        ids = [f"call_{i}_{r}_{j}" for j in range(len(names))]
        msgs.append({"role": "assistant", "content": OLD, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": n, "arguments": "{}"}} for cid, n in zip(ids, names)]})
        msgs += [{"role": "tool", "tool_call_id": cid, "content": f"result {i}/{r}/{j} of {n}"}
                 for j, (cid, n) in enumerate(zip(ids, names))]
    msgs.append({"role": "assistant", "content": f"{OLD} final"})
    if follow_up:
        msgs += [{"role": "user", "content": follow_up}, {"role": "assistant", "content": f"{OLD} again"}]
    return {"id": f"agent-{i:03d}", "tools": TOOLS, "messages": msgs}


def build(n: int, seed: int = 7) -> tuple[list[dict], dict[str, int]]:
    """n conversations: a third several rounds deep, the others 0–1 rounds; every ninth with a round changed (the
    turn number whose calls will not match, in `planted`)."""
    rng = random.Random(seed)
    deep, shallow, out, planted = [], [], [], {}
    k = 0
    while len(deep) < n // 3 or len(shallow) < n - n // 3:
        task = f"task {k}: {rng.choice(['plan a trip', 'debug this', 'compare prices', 'summarize news'])}"
        k += 1
        rounds = task_rounds(task, NAMES, parallel=True)
        (deep if len(rounds) >= 2 else shallow).append((task, rounds))
    for i, (task, rounds) in enumerate(deep[:n // 3] + shallow[:n - n // 3]):
        follow = next(f for f in (f"and then {i}.{v}?" for v in range(100))  # answered without tools
                      if not task_rounds(f, NAMES, parallel=True)) if i % 4 == 0 else None
        rounds = [tuple(r) for r in rounds]
        if i % 9 == 4 and rounds:  # the dataset called another tool in its first round
            changed = NAMES[(NAMES.index(rounds[0][0]) + 1) % len(NAMES)]
            rounds[0] = (changed, *rounds[0][1:])
            planted[f"agent-{i:03d}"] = 1
        out.append(conversation(i, task, rounds, follow))
    return out, planted


def expected_turns(obj: dict) -> int:
    return sum(1 for m in obj["messages"] if m["role"] == "assistant")


def check(tok, out: Path, objs: dict[str, dict], planted: dict[str, int], truth: dict[str, dict]) -> list[Record]:
    records, failures, by_conv = recorded_turns(out / "datasets" / "T")
    failed = {f.get("conversation_id", f["id"]) for f in failures}
    for cid, obj in objs.items():
        turns = by_conv.get(cid, {})
        k = len(turns)
        assert sorted(turns) == list(range(1, k + 1)), (cid, sorted(turns))
        results = {m["tool_call_id"]: m["content"] for m in obj["messages"] if m["role"] == "tool"}
        dataset_calls = [m.get("tool_calls") or [] for m in obj["messages"] if m["role"] == "assistant"]
        for j, r in turns.items():
            assert r.id == (cid if j == 1 else f"{cid}#{j}") and r.tools == TOOLS
            assert r.prompt_ids == prompt_ids(tok, r.messages, tools=TOOLS)
            assert not any(OLD in (m.get("content") or "") for m in r.messages)
            # every tool-call turn's ids are the model's own, as the emulator generated them (call_… ones rebuilt)
            true = truth[r.generation_id]
            assert [c["id"] for c in r.tool_calls or []] == [c["id"] for c in true["tool_calls"]], (cid, j)
            if r.finish_reason == "length":  # cut: what was served is a prefix of what the model wrote (a call cut
                assert true["output_ids"][:len(r.output_ids)] == r.output_ids  # in half is not served at all)
            else:
                assert r.output_ids == true["output_ids"], (cid, j)
            assert parse_output_ids(tok, r.output_ids) == r.answer
            # the history: the records of turns 1..j−1, each matched call followed by the dataset's result for it
            mine = [m for m in r.messages if m["role"] == "assistant"]
            assert len(mine) == j - 1
            for prev, m in zip((turns[i] for i in range(1, j)), mine):
                assert m["content"] == prev.content and (m.get("tool_calls") or None) == prev.tool_calls
            for pos, m in enumerate(r.messages):
                if m.get("role") == "assistant" and m.get("tool_calls"):
                    ours = [c["id"] for c in m["tool_calls"]]
                    after = r.messages[pos + 1:pos + 1 + len(ours)]
                    assert sorted(t["tool_call_id"] for t in after) == sorted(ours)
                    rnd = len([x for x in r.messages[:pos] if x.get("role") == "assistant"])
                    names = Counter(c["function"]["name"] for c in dataset_calls[rnd])
                    assert Counter(c["function"]["name"] for c in m["tool_calls"]) == names
                    by_id = {c["id"]: c["function"]["name"] for c in m["tool_calls"]}
                    for t in after:  # the dataset's own result for a call of that name, never invented
                        assert t["content"] in results.values() and by_id[t["tool_call_id"]] in t["content"]
        last = turns.get(k)
        if cid in planted and (k >= planted[cid]) and cid not in failed:
            assert k == planted[cid] and last.meta.get("ended") == "tool_mismatch", (cid, k)
            assert last.tool_calls  # the mismatched tool-call turn is still a sample
        elif k < expected_turns(obj):
            assert cid in failed or last is None or last.finish_reason == "length", (cid, k, expected_turns(obj))
        else:
            assert "ended" not in last.meta
    # a failure for good is a fault that kept coming back, never a request the service refused (a result sent
    # with an id no call of ours has is refused: 400)
    assert len(failures) <= 5 and not [f for f in failures if f["error"]["class"] == "bad_request"], failures[:3]
    return records


def test_200_tool_conversations_with_faults_a_sigkill_and_a_resume(tok, tmp_path):
    objs_list, planted = build(200)
    objs = {o["id"]: o for o in objs_list}
    prompts = tmp_path / "T.jsonl"
    prompts.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs_list))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"T:\n  prompts: {prompts}\n")
    out = tmp_path / "out"
    # The cheapest provider serves its own `call_…` ids and fills up; the next ones serve the model's ids.
    chutes = {"provider": "Chutes", "tool_call_ids": "call", "capacity": 80}
    with run_emulator(speed=0.15, content=SMALL, generation_delay=0.1, balance=1000, seed=41, faults=MIX,
                      endpoints=[chutes]) as emu:
        cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "T", "--datasets-file", str(datasets),
               "--base-url", emu.base_url, "--output-dir", str(out), "--params-dir", str(tmp_path / "params"),
               "--concurrency", "200", "--max-tokens", "300", "--progress", "false", "--reserve-usd", "0",
               "--retry-base-s", "0.01", "--retry-cap-s", "0.2"]
        kills, _ = kill_while_writing(cmd, [out / "datasets" / "T" / "records.jsonl"], random.Random(41), 1,
                                      after_s=(1.0, 2.0))
        assert kills == 1
        killed_at = load_records(out / "datasets" / "T" / "records.jsonl", tolerate_torn_tail=True)
        final = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-3000:]
        truth = {t["generation_id"]: t for t in emu.ground_truth()}
        assert "Traceback" not in emu.log()
    records = check(tok, out, objs, planted, truth)
    summary = json.loads((out / "datasets" / "T" / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0
    calls = [r for r in records if r.tool_calls]
    rebuilt = [r for r in calls if "served_tool_call_ids" in r.meta]
    assert len(calls) > 150 and len(rebuilt) > 10 and len(calls) - len(rebuilt) > 10, (len(calls), len(rebuilt))
    assert all(i.startswith("call_") for r in rebuilt for i in r.meta["served_tool_call_ids"])
    assert sum(len(r.tool_calls) > 1 for r in calls) > 5  # parallel calls, each with its own running index
    deep = [cid for cid in objs if sum(1 for r in records if r.conversation_id == cid and r.tool_calls) >= 2]
    assert len(deep) > 40, "too few loops several rounds deep went through"
    mismatched = [r for r in records if r.meta.get("ended") == "tool_mismatch"]
    assert {r.conversation_id for r in mismatched} <= set(planted) and len(mismatched) >= len(planted) - 3
    assert summary["run"]["tool_calls"]["mismatched"] == len([r for r in mismatched if r.id not in
                                                               {k.id for k in killed_at}])
    # the kill left loops half done, and the resume went on from their recorded turns
    open_at_kill = {r.conversation_id for r in killed_at} - {r.conversation_id for r in killed_at
                                                            if r.turn == expected_turns(objs[r.conversation_id])
                                                            or r.meta.get("ended") or r.finish_reason == "length"}
    resumed = [r for r in records if r.conversation_id in open_at_kill and r.id not in {k.id for k in killed_at}]
    assert len(open_at_kill) >= 10 and resumed and all(r.turn > 1 for r in resumed)
    print(f"records {len(records)}, tool-call turns {len(calls)} ({len(rebuilt)} served with call_ ids), deep loops "
          f"{len(deep)}, mismatches {len(mismatched)} of {len(planted)} planted, open at the kill {len(open_at_kill)}, "
          f"resumed turns {len(resumed)}")


def test_a_local_server_returns_the_true_ids_and_the_recipe_agrees(tok, tmp_path):
    """`backend: local` (vLLM with `--tool-call-parser kimi_k2`, the emulator standing in): the server's own ids
    are stored, its calls keep the model's ids, and the text recipe's agreement with them is reported."""
    from eagledata.generation import GenerateConfig, generate

    objs_list, _ = build(30, seed=8)
    prompts = tmp_path / "T.jsonl"
    prompts.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs_list))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"T:\n  prompts: {prompts}\n")
    with run_emulator(speed=0, content=SMALL, generation_delay=0.1, balance=1000, seed=43) as emu:
        summary = generate(GenerateConfig(dataset="T", datasets_file=str(datasets), base_url=emu.base_url,
                                          output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "p"),
                                          backend="local", concurrency=30, max_tokens=2000, progress=False,
                                          reserve_usd=0.0))
        truth = {t["generation_id"]: t for t in emu.ground_truth()}
    records = load_records(tmp_path / "out" / "datasets" / "T" / "records.jsonl")
    calls = [r for r in records if r.tool_calls]
    assert len(calls) > 15 and summary["run"]["tool_calls"]["answers"] == len(calls)
    for r in records:
        assert r.meta["ids_source"] == "server" and r.output_ids == truth[r.generation_id]["output_ids"]
        assert r.meta["prompt_ids_match"] is True and "served_tool_call_ids" not in r.meta
    assert all(r.meta["retokenized_agreement"] == 1.0 for r in calls)
    assert summary["run"]["retokenized_agreement_mean"] > 0.99
    from eagledata.generation.report.run_report import summary_table
    assert summary_table(summary)["value"]["tool-call turns"] == f"{len(calls):,}"  # a row of its own (8bdc9ad)


def test_arguments_a_provider_reserializes_show_in_the_count_agreement(tok, tmp_path):
    """A provider that re-serializes the model's arguments serves a string whose tokens are not the model's: its count
    against `usage.completion_tokens` (the model's true ids) is off, so such an answer is refused (`count_disagrees`,
    retried elsewhere) and the fidelity judge sees the provider as it sees any that alters the text. What is kept is
    what was served, never "repaired" into the model's spacing, and its count agrees."""
    from eagledata.generation import GenerateConfig, generate
    from eagledata.generation.conversations.recording import COUNT_TOLERANCE

    objs_list, _ = build(60, seed=9)
    prompts = tmp_path / "T.jsonl"
    prompts.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs_list))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"T:\n  prompts: {prompts}\n")
    redump = {"provider": "Chutes", "quirks": {"arguments_reserialized": 1.0}}
    with run_emulator(speed=0, content=SMALL, generation_delay=0.1, balance=1000, seed=44, endpoints=[redump]) as emu:
        summary = generate(GenerateConfig(dataset="T", datasets_file=str(datasets), base_url=emu.base_url,
                                          output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "p"),
                                          concurrency=20, max_tokens=2000, progress=False, reserve_usd=0.0,
                                          stream=False))  # every answer served reaches the count check (a
        # suspect's streams are closed mid-answer, so a streamed run judges one fewer now and then)
        truth = {t["generation_id"]: t for t in emu.ground_truth()}
    records = load_records(tmp_path / "out" / "datasets" / "T" / "records.jsonl")
    kept = {r.generation_id for r in records}
    served_calls = [g for g in truth.values() if g["provider"] == "Chutes" and g["tool_calls"]]
    redumped = [g for g in served_calls
                if [reserialized(c["function"]["arguments"]) for c in g["tool_calls"]]
                != [c["function"]["arguments"] for c in g["tool_calls"]]]
    assert len(served_calls) >= 20 and len(redumped) >= 0.8 * len(served_calls)
    refused = [g for g in redumped if g["generation_id"] not in kept]
    assert len(refused) >= 0.8 * len(redumped), (len(refused), len(redumped))
    for r in records:
        if r.provider == "Chutes" and r.tool_calls:  # kept: what was served, its count within the tolerance
            served = [c["function"]["arguments"] for c in r.tool_calls]
            model = [c["function"]["arguments"] for c in truth[r.generation_id]["tool_calls"]]
            assert served in (model, [reserialized(a) for a in model]), r.id
        offset = -1 if r.provider == "Parasail" and r.finish_reason in ("stop", "tool_calls") else 0
        assert abs(r.meta["fidelity"]["completion_diff"] - offset) <= COUNT_TOLERANCE, r.id
    plain = [r for r in records if not r.tool_calls and r.finish_reason == "stop"]
    assert plain and all(r.meta["fidelity"]["completion_diff"] == 0 for r in plain if r.provider != "Parasail")
    verdict = summary["fidelity"]["providers"]["Chutes"]
    assert verdict["verdict"] == "suspect" and verdict["count_refused"] >= len(refused)
    assert summary["run"]["errors"]["count_disagrees"] >= len(refused)
