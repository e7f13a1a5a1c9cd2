"""The batch route (issue 43) against the emulator's Batch API: conversations in rounds through failing lines, a
SIGKILL while a batch is in progress and a resume; a target met in top-up rounds; the money never over the cap; bad
input refused before anything is uploaded; Ctrl-C leaving the batches running for the rerun to pick up."""
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig
from eagledata.moonshot.facts import BATCH_MODELS, PROVIDER
from eagledata.records import load_records
from tests.generation.test_conversations import SMALL, check_conversations, write_conversations

# speed 0.0005: validation 15 ms, queue 0.3 s, 2 lines/s → 1 ms a line, finalizing 15 ms; a window of 24 h, 43 s
BATCH = {"speed": 0.0005, "content": SMALL, "seed": 43, "balance": 1000,
         "batch": {"balance": 50.0, "line_error_rate": 0.06}}
PRICE = BATCH_MODELS["kimi-k2.5"]


@pytest.fixture(scope="module")
def emu(tokenizer_dir):
    with run_emulator(BATCH) as handle:
        yield handle
        assert "Traceback" not in handle.log(), handle.log()[-3000:]


def moonshot(emu) -> str:
    return emu.base_url.removesuffix("/api/v1") + "/moonshot/v1"


def batch_lines(emu) -> list[dict]:
    return httpx.get(f"{emu.admin_url}/batch_lines", timeout=30).json()["data"]


def balance(emu) -> float:
    r = httpx.get(f"{moonshot(emu)}/users/me/balance", headers={"Authorization": "Bearer k"}, timeout=30)
    return r.json()["data"]["available_balance"]


def command(tmp_path: Path, emu, datasets: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "eagledata.generate", "--dataset", "C", "--datasets-file", str(datasets),
            "--route", "batch", "--batch-base-url", moonshot(emu), "--output-dir", str(tmp_path / "out"),
            "--params-dir", str(tmp_path / "params"), "--max-tokens", "130", "--progress", "false",
            "--reserve-usd", "0", "--batch-poll-s", "0.05", *extra]


def env() -> dict[str, str]:
    return {**os.environ, "MOONSHOT_API_KEY": "sk-test-batch"}


def journal(out: Path) -> list[dict]:
    path = out / "datasets" / "C" / "batches.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def sent_twice_without_cause(lines: list[dict]) -> dict[str, list[str]]:
    """custom_id → its lines' statuses, for every turn sent again although its earlier line did not fail."""
    by_id: dict[str, list[str]] = defaultdict(list)
    for ln in lines:
        by_id[ln["custom_id"]].append(ln["status"])
    return {cid: st for cid, st in by_id.items() if any(s not in ("failed", "expired", "cancelled") for s in st[:-1])}


def test_200_conversations_in_rounds_with_failing_lines_a_sigkill_mid_batch_and_a_resume(emu, tok, tmp_path):
    # each batch queued 2 s (not 0.3 s): the kill lands while round 2 waits, however late a loaded machine lets
    # this test see it created
    emu.reset({**BATCH, "batch": {**BATCH["batch"], "queue_s": 4000.0}})
    start = balance(emu)
    datasets, objs = write_conversations(tmp_path, 200, seed=43)
    out = tmp_path / "out"
    cmd = command(tmp_path, emu, datasets, "--max-spend-usd", "0.5")
    proc = subprocess.Popen(cmd, env=env(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the kill: round 2's batch created, its answers not recorded yet
        events = journal(out)
        if events and events[-1]["event"] == "created" and any(e["event"] == "settled" for e in events):
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = journal(out)
    assert killed[-1]["event"] == "created"  # a batch in progress at the kill
    final = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    records, failures, _ = check_conversations(tok, out, objs)
    assert len({r.id for r in records}) == len(records)  # nothing doubled
    assert sum(r.turn > 1 for r in records) > 60 and {r.turn for r in records} == {1, 2, 3}
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0
    assert summary["records"] == len(records) and summary["failures"] == len(failures)
    # the batch in progress at the kill was adopted: polled and recorded, never sent again
    lines = batch_lines(emu)
    assert sent_twice_without_cause(lines) == {}
    assert any(s == "failed" for s in (ln["status"] for ln in lines))  # the planted failures happened
    killed_batch = killed[-1]["batch_id"]
    assert sum(ln["batch_id"] == killed_batch for ln in lines) > 0
    created = [e for e in journal(out) if e["event"] == "created"]
    assert len({e["batch_id"] for e in created}) == len(created)
    prepared = [e for e in journal(out) if e["event"] == "prepared"]
    # turn j goes in round j (later after a failed line), never before: its history does not exist until then
    assert all(e["round"] >= ln["turn"] for e in prepared for ln in e["lines"])
    assert sum(e["round"] == ln["turn"] for e in prepared for ln in e["lines"]) > 0.8 * len(records)
    # exact ids against the emulator's ground truth, the batch provider, the batch price
    for r in random.Random(0).sample(records, 25):
        truth = emu.ground_truth(r.generation_id)
        assert r.output_ids == truth["output_ids"] and r.generation_id.startswith("chatcmpl-")
        assert r.provider == PROVIDER
        assert r.usage.cost == pytest.approx(PRICE.cost(r.usage.prompt_tokens, r.usage.completion_tokens), abs=1e-12)
    charged = start - balance(emu)
    assert charged <= 0.5 + 1e-9  # never over the cap
    kept = sum(r.usage.cost for r in records)
    assert kept == pytest.approx(summary["spend_usd"], rel=1e-6)
    assert charged == pytest.approx(kept, rel=1e-6)  # a failed line costs nothing; every answer was kept


def test_a_target_is_met_in_top_up_rounds_within_five_percent(emu, tmp_path):
    emu.reset({**BATCH, "batch": {"balance": 50.0}})
    datasets, _ = write_conversations(tmp_path, 400, seed=7)
    datasets.write_text(datasets.read_text() + "  target_output_tokens: 9000\n")
    cmd = command(tmp_path, emu, datasets, "--turns", "last", "--prior-output-median-tokens", "120",
                  "--prior-output-sigma", "0.5")  # a guess on the long side: the first round falls short
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "target_reached"
    assert 9000 <= summary["output_tokens"] <= 9000 * 1.05, summary["output_tokens"]
    rounds = summary["run"]["batches"]
    assert len(rounds) >= 2 and rounds[0]["lines"] > rounds[-1]["lines"]  # the estimate first, then a smaller top-up
    assert summary["records"] < 400


def test_bad_input_is_refused_before_anything_is_uploaded(emu, tmp_path):
    emu.reset(BATCH)
    datasets, _ = write_conversations(tmp_path, 5)
    no_key = {k: v for k, v in os.environ.items() if k != "MOONSHOT_API_KEY"}
    for extra, environ, says in [((), no_key, "MOONSHOT_API_KEY"),
                                 (("--batch-model", "kimi-k2"), env(), "batch_model"),
                                 (("--batch-window", "2h"), env(), "batch_window")]:
        done = subprocess.run(command(tmp_path, emu, datasets, *extra), env=environ, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert emu.stats()["batch"]["files"] == 0 and batch_lines(emu) == []


def test_ctrl_c_leaves_the_batches_running_and_the_rerun_picks_them_up(emu, tmp_path):
    # a round takes ~3 s (a queue of 3 s, not 1.2 s): the Ctrl-C lands while it is in progress, however late a loaded
    # machine lets this test see it created
    emu.reset({**BATCH, "speed": 0.002, "batch": {"balance": 50.0, "queue_s": 1500.0}})
    datasets, objs = write_conversations(tmp_path, 30, seed=3)
    out = tmp_path / "out"
    cmd = command(tmp_path, emu, datasets)
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(e["event"] == "created" for e in journal(out)):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    assert "rerun the same command" in stderr
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and len(summary["run"]["batches_running"]) == 1
    running = summary["run"]["batches_running"][0]
    again = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    lines = batch_lines(emu)
    assert sent_twice_without_cause(lines) == {}
    answered = {ln["custom_id"] for ln in lines if ln["batch_id"] == running and ln["status"] == "answered"}
    records = {r.id for r in load_records(out / "datasets" / "C" / "records.jsonl")}
    assert answered and answered <= records  # the batch left running was adopted: its answers are records
    assert json.loads((out / "datasets" / "C" / "summary.json").read_text())["stop_reason"] == "completed"


def test_an_expired_batch_keeps_its_answered_lines_and_the_rest_go_again(emu, tmp_path):
    emu.reset({**BATCH, "speed": 0.0002, "batch": {"balance": 50.0, "expire_rate": 0.5}})  # a 12 h window: 8.6 s
    datasets, objs = write_conversations(tmp_path, 40, seed=11)
    out = tmp_path / "out"
    done = subprocess.run(command(tmp_path, emu, datasets, "--turns", "last", "--batch-window", "12h"), env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = batch_lines(emu)
    expired = {ln["batch_id"] for ln in lines if ln["status"] == "expired"}
    assert expired, "no batch expired: the planted fault never happened"
    kept = {ln["custom_id"] for ln in lines if ln["batch_id"] in expired and ln["status"] == "answered"}
    records = {r.id: r for r in load_records(out / "datasets" / "C" / "records.jsonl")}
    assert set(records) == set(objs) and kept <= set(records)  # every prompt once; an expired batch's answers kept
    assert all(records[ln["custom_id"]].generation_id == ln["generation_id"] for ln in lines
               if ln["custom_id"] in kept and ln["batch_id"] in expired and ln["status"] == "answered")
    assert sent_twice_without_cause(lines) == {}


# -- in process: the seams a test can reach ---------------------------------------------------------------------------
class DiesAfter(httpx.AsyncBaseTransport):
    """Sends every request; right after the service answers the `method path` call, the run dies (as a SIGKILL
    between the service making something and the journal saying so). Counts the calls."""

    def __init__(self, method: str, path: str | None):
        self.inner, self.method, self.path, self.calls = httpx.AsyncHTTPTransport(), method, path, defaultdict(int)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        key = f"{request.method} {request.url.path.rsplit('/v1/', 1)[-1]}"
        self.calls[key] += 1
        if self.path is not None and key == f"{self.method} {self.path}":
            self.path = None
            await response.aread()
            raise Died(key)
        return response


class Died(Exception):
    pass

def batch_cfg(tmp_path: Path, emu, datasets: Path, **kw):

    return GenerateConfig(dataset="C", datasets_file=str(datasets), route="batch", batch_base_url=moonshot(emu),
                          output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), max_tokens=130,
                          progress=False, reserve_usd=0.0, batch_poll_s=0.05, **kw)


@pytest.mark.parametrize("dies_after", ["POST files", "POST batches"])
def test_an_upload_or_a_batch_the_journal_never_saw_is_adopted_not_made_again(emu, tmp_path, monkeypatch, dies_after):
    import asyncio

    from eagledata.generation.batch.route import run_batch_route

    monkeypatch.setenv("MOONSHOT_API_KEY", "sk-test-batch")
    emu.reset({**BATCH, "batch": {"balance": 50.0}})
    datasets, objs = write_conversations(tmp_path, 20, seed=5)
    cfg = batch_cfg(tmp_path, emu, datasets, turns="last")
    method, path = dies_after.split()
    dying = DiesAfter(method, path)
    with pytest.raises(Died):
        asyncio.run(run_batch_route(cfg, transport=dying))
    events = journal(tmp_path / "out")
    assert [e["event"] for e in events] == (["prepared"] if path == "files" else ["prepared", "uploaded"])
    died = json.loads((tmp_path / "out" / "datasets" / "C" / "summary.json").read_text())
    assert died["stop_reason"] == f"error: Died: {dies_after}" and died["records"] == 0  # written all the same
    again = DiesAfter("", None)
    summary = asyncio.run(run_batch_route(cfg, transport=again))
    assert summary["stop_reason"] == "completed" and summary["records"] == 20
    # the upload (or the batch) the dead run made was found by name and used: made once, never twice
    assert dying.calls["POST files"] + again.calls["POST files"] == 1
    assert dying.calls["POST batches"] + again.calls["POST batches"] == 1
    lines = batch_lines(emu)
    assert len(lines) == 20 and len({ln["batch_id"] for ln in lines}) == 1 and sent_twice_without_cause(lines) == {}


def test_the_money_stops_at_the_cap_and_never_over(emu, tmp_path):
    emu.reset({**BATCH, "batch": {"balance": 50.0}})
    start = balance(emu)
    datasets, _ = write_conversations(tmp_path, 200, seed=9)
    cap = 0.01  # a line's worst case at the batch price is ~$0.0003: about 30 lines of 200 fit
    done = subprocess.run(command(tmp_path, emu, datasets, "--turns", "last", "--max-spend-usd", str(cap)),
                          env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "max_spend_reached" and 0 < summary["records"] < 200
    assert "does not fit the $" in done.stderr and "max_spend_reached" in done.stderr  # the money's stop, said
    charged = start - balance(emu)
    assert 0 < charged <= cap and summary["run"]["charged_usd"] == pytest.approx(charged, abs=1e-9)
    rounds = summary["run"]["batches"]
    assert len(rounds) >= 2  # the first round's answers cost less than their worst cases: the money left went on
    for k, r in enumerate(rounds):  # when each batch went, what was spent plus its worst cases fitted under the cap
        assert sum(x["usd"] for x in rounds[:k]) + r["booked_usd"] <= cap + 1e-12


def test_tool_loops_go_round_by_round_with_the_models_ids_and_their_reasoning(emu, tok, tmp_path):
    from eagledata.text import prompt_ids
    from tests.helpers.prompts import TOOLS, dataset

    prompts = tmp_path / "agents.jsonl"
    objs = [{**dataset(), "id": f"agent-{i}"} for i in range(12)]
    prompts.write_text("".join(json.dumps(o) + "\n" for o in objs))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"C:\n  prompts: {prompts}\n")
    emu.reset({**BATCH, "batch": {"balance": 50.0}, "tool_datasets": [str(prompts)], "tool_follow_rate": 1.0})
    done = subprocess.run(command(tmp_path, emu, datasets, "--max-tokens", "400"), env=env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = load_records(tmp_path / "out" / "datasets" / "C" / "records.jsonl")
    by_conv = defaultdict(dict)
    for r in records:
        by_conv[r.conversation_id][r.turn] = r
    assert sum(len(t) >= 3 for t in by_conv.values()) >= 8  # the loops went on: calls, results, next turn
    line_round = {ln["custom_id"]: e["round"] for e in journal(tmp_path / "out") if e["event"] == "prepared"
                  for ln in e["lines"]}
    for turns in by_conv.values():
        for j, r in turns.items():
            assert r.prompt_ids == prompt_ids(tok, r.messages, tools=TOOLS)
            assert line_round[r.id] >= j  # turn j never goes before round j (its history did not exist)
            if r.tool_calls:
                assert all(c["id"].startswith("functions.") for c in r.tool_calls)
            loop = [m for m in r.messages if m["role"] == "assistant" and m.get("tool_calls")]
            if j > 1 and loop and not any(m["role"] == "assistant" and not m.get("tool_calls")
                                          for m in r.messages[r.messages.index(loop[0]):]):
                assert all(m.get("reasoning_content") for m in loop)  # the loop in flight: its reasoning sent
            assert not any("reasoning" in m or "reasoning_details" in m for m in r.messages)
    summary = json.loads((tmp_path / "out" / "datasets" / "C" / "summary.json").read_text())
    assert summary["fidelity"]["providers"][PROVIDER]["answers"] == len(records)


def test_ctrl_c_with_batch_cancel_on_stop_cancels_them_and_keeps_what_they_answered(emu, tmp_path):
    emu.reset({**BATCH, "speed": 0.01, "batch": {"balance": 50.0}})  # a queue of 6 s, then 5 ms a line
    datasets, objs = write_conversations(tmp_path, 30, seed=4)
    out = tmp_path / "out"
    proc, stderr = interrupted_once_created(
        command(tmp_path, emu, datasets, "--turns", "last", "--batch-cancel-on-stop", "true"), out)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["run"]["batches_running"] == []
    assert summary["run"]["batches"][0]["status"] == "cancelled"
    lines = batch_lines(emu)
    assert {ln["status"] for ln in lines} == {"cancelled"}  # cancelled in the queue: nothing answered, nothing billed
    assert summary["remaining"] == 30 and [e["event"] for e in journal(out)][-1] == "settled"


def interrupted_once_created(cmd: list[str], out, environ: dict[str, str] | None = None,
                             timeout_s: float = 60) -> tuple[subprocess.Popen, str]:
    """Run `cmd`, Ctrl-C it once its first batch is created at the service; (the process, what it printed)."""
    proc = subprocess.Popen(cmd, env=environ or env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(e["event"] == "created" for e in journal(out)):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=timeout_s)
    return proc, stderr


# -- issue 53 ---------------------------------------------------------------------------------------------------------
def test_a_batch_the_service_no_longer_knows_is_settled_as_vanished_and_its_lines_go_again(emu, tmp_path):
    """Item 6: a journaled batch that 404s (expired from the service's records, deleted, another account) must not
    block the dataset: its unanswered lines go again, journaled as such, and the run goes on."""
    # a queue of 3 s (not 1.2 s): the Ctrl-C lands while the batch is in progress, however late a loaded machine lets
    # this test see it created
    emu.reset({**BATCH, "speed": 0.002, "batch": {"balance": 50.0, "queue_s": 1500.0}})
    datasets, objs = write_conversations(tmp_path, 30, seed=3)
    out = tmp_path / "out"
    cmd = command(tmp_path, emu, datasets, "--turns", "last")
    proc, stderr = interrupted_once_created(cmd, out)
    assert proc.returncode == 0 and "rerun the same command" in stderr, stderr[-3000:]
    left = json.loads((out / "datasets" / "C" / "summary.json").read_text())["run"]["batches_running"]
    assert len(left) == 1
    emu.reset({**BATCH, "speed": 0.002, "batch": {"balance": 50.0}})  # the service forgets every batch and file
    again = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"does not know batch {left[0]}" in again.stderr
    settled = [e for e in journal(out) if e["event"] == "settled"]
    assert settled[0]["batch_status"] == "vanished" and set(settled[0]["outcomes"].values()) == {"resend"}
    records = load_records(out / "datasets" / "C" / "records.jsonl")
    assert sorted(r.id for r in records) == sorted(objs)  # every prompt once, the vanished batch's lines sent again
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["run"]["batches_vanished"] == left
    assert [b["status"] for b in summary["run"]["batches"]][0] == "vanished"
    # each round's row names its own batch (the rows once took the next round's id)
    assert [b["batch_id"] for b in summary["run"]["batches"]] == [e["batch_id"] for e in journal(out)
                                                                  if e["event"] == "created"]


def test_with_base_url_emulator_a_ctrl_c_leaves_no_batch_behind_and_a_rerun_resumes(tmp_path):
    """Item 6: the embedded emulator stops with the run, so a batch left running there could never be adopted: a
    stop cancels it (its answered lines recorded), and a rerun of the same command goes on to the end."""
    datasets, objs = write_conversations(tmp_path, 12, seed=8)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "C", "--datasets-file", str(datasets),
           "--route", "batch", "--base-url", "emulator", "--emulator-speed", "0.01", "--batch-poll-s", "5",
           "--output-dir", str(out), "--params-dir", str(tmp_path / "params"), "--max-tokens", "130",
           "--progress", "false", "--turns", "last"]
    no_key = {k: v for k, v in os.environ.items() if k != "MOONSHOT_API_KEY"}
    proc, stderr = interrupted_once_created(cmd, out, no_key, timeout_s=120)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["run"]["batches_running"] == []
    again = subprocess.run(cmd, env=no_key, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    records = load_records(out / "datasets" / "C" / "records.jsonl")
    assert sorted(r.id for r in records) == sorted(objs)
    assert json.loads((out / "datasets" / "C" / "summary.json").read_text())["stop_reason"] == "completed"


def test_an_upload_the_service_no_longer_knows_is_made_again_from_batch_inputs(emu, tmp_path, monkeypatch):
    """Item 6: a run killed between the upload and the batch (journal: uploaded), its upload then gone at the
    service (deleted, an emulator that stopped): the rerun uploads the kept input file again and goes on."""
    import asyncio

    from eagledata.generation.batch.route import run_batch_route

    monkeypatch.setenv("MOONSHOT_API_KEY", "sk-test-batch")
    emu.reset({**BATCH, "batch": {"balance": 50.0}})
    datasets, objs = write_conversations(tmp_path, 10, seed=6)
    cfg = batch_cfg(tmp_path, emu, datasets, turns="last")
    with pytest.raises(Died):
        asyncio.run(run_batch_route(cfg, transport=DiesAfter("POST", "batches")))
    assert [e["event"] for e in journal(tmp_path / "out")] == ["prepared", "uploaded"]
    emu.reset({**BATCH, "batch": {"balance": 50.0}})  # the upload (and the batch the dead run made) forgotten
    again = DiesAfter("", None)
    summary = asyncio.run(run_batch_route(cfg, transport=again))
    assert summary["stop_reason"] == "completed" and summary["records"] == 10
    assert again.calls["POST files"] == 1 and again.calls["POST batches"] == 2  # the stale id refused, then anew
    uploads = [e["file_id"] for e in journal(tmp_path / "out") if e["event"] == "uploaded"]
    assert len(uploads) == 2 and uploads[0] != uploads[1]


def test_a_run_outside_the_emulator_shows_its_rounds_and_its_status_lines(emu, tmp_path):
    """Item 7: against a standalone service (as against the real API) the command's log shows each round, and status
    lines (tokens of the target, the batch's lines answered of its total, the window's end, an ETA, the money). Their
    cadence, every `status_interval_s` between polls too, is the next test's, in virtual time: counted here against the
    wall clock it depended on the machine's load."""
    emu.reset({**BATCH, "speed": 0.002, "batch": {"balance": 50.0}})  # a round takes ~1.3 s
    datasets, _ = write_conversations(tmp_path, 20, seed=12)
    done = subprocess.run([*command(tmp_path, emu, datasets, "--turns", "last"), "--batch-poll-s", "1.0",
                           "--status-interval-s", "0.2"], env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"C round 1\b[^:]*: 20 lines submitted", done.stderr), done.stderr[-2000:]
    status = [ln for ln in done.stderr.splitlines() if "lines answered" in ln]
    assert status and all("window ends" in ln and "ETA" in ln and "booked" in ln for ln in status), status[:3]
    assert any("/20 lines answered" in ln for ln in status)


@pytest.mark.parametrize("shown", ["status lines", "live panel"])
def test_the_status_is_shown_every_status_interval_between_polls(tok, tmp_path, monkeypatch, shown):
    """Item 7: a batch is polled every `batch_poll_s` (60 s by default), and the status (the log's status line, or in
    JupyterLab the panel's headline and its table of rounds) is shown every `status_interval_s` (10 s) between polls
    too. The emulator's Batch API in process and the route on one virtual clock (clock.run_virtual) at the defaults
    and the service's real latencies (speed 1: validation 30 s, a queue of 600 s): each show and each poll at its
    exact time, whatever the machine's load."""
    import logging
    import uuid

    from eagledata.emulator import create_app, parse_config
    from eagledata.generation.batch.route import run_batch_route
    from eagledata.generation.clock import LoopClock, run_virtual
    from eagledata.generation.report.panel import BatchPanel

    clock = LoopClock()
    polls: list[float] = []  # when the route asked for a batch's status
    shows: list[tuple[float, str]] = []  # when the status was shown, and what it said

    class Counted(httpx.AsyncBaseTransport):
        def __init__(self, inner: httpx.AsyncBaseTransport):
            self.inner = inner

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "GET" and re.search(r"/batches/[^/]+$", request.url.path):
                polls.append(clock.now())
            return await self.inner.handle_async_request(request)

    class Panel(BatchPanel):
        def update(self, headline, rounds):
            super().update(headline, rounds)
            shows.append((clock.now(), headline))

    class Lines(logging.Handler):
        def emit(self, record):
            if "lines answered" in record.getMessage():
                shows.append((clock.now(), record.getMessage()))

    monkeypatch.setenv("MOONSHOT_API_KEY", f"sk-virtual-{uuid.uuid4().hex}")  # an account of its own: no lock shared
    datasets, _ = write_conversations(tmp_path, 10, seed=13)
    cfg = GenerateConfig(dataset="C", datasets_file=str(datasets), route="batch", batch_base_url="http://emu/moonshot/v1",
                         output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), max_tokens=130,
                         reserve_usd=0.0, turns="last", progress=shown == "live panel")
    poll, interval = cfg.batch_poll_s, cfg.status_interval_s
    assert (poll, interval) == (60.0, 10.0)  # the defaults
    handler, logger = Lines(), logging.getLogger("eagledata.generate")
    logger.addHandler(handler)

    async def main():  # the service's clock is the loop's: made on it
        app = create_app(parse_config({**BATCH, "speed": 1.0, "batch": {"balance": 50.0}}), tok, clock=clock.now)
        return await run_batch_route(cfg, transport=Counted(httpx.ASGITransport(app=app)), clock=clock.now,
                                     panel=lambda: Panel(show=lambda w: None))

    try:
        summary = run_virtual(main())
    finally:
        logger.removeHandler(handler)
    assert summary["records"] == 10 and summary["stop_reason"] == "completed"
    assert summary["wall_s"] > 10 * poll  # the queue alone is 600 s: the batch waited through many polls
    assert all("window ends" in text and "ETA" in text for _, text in shows[:-1])
    times = [t for t, _ in shows]
    # between two polls a minute apart the status was shown at each of the five status ticks in between, not only at
    # the polls (a status shown only at the polls fails here, and on the gaps below)
    assert len(polls) >= 10 and all(b - a == pytest.approx(poll) for a, b in zip(polls, polls[1:]))
    for a, b in zip(polls, polls[1:]):
        assert sum(a < t < b for t in times) == round(poll / interval) - 1, (a, b, times)
    # from the first show to the run's end, never longer than one interval without one (a wait between ticks
    # that lands a hair short of the schedule shows 10 ms later)
    assert max(b - a for a, b in zip(times, times[1:])) <= interval + 0.011
    assert times[-1] == pytest.approx(summary["wall_s"], abs=0.01)  # and once more at the end


@pytest.mark.parametrize("seed", [0, 1])
def test_the_demos_datasets_reach_their_targets_in_the_planned_rounds(emu, tmp_path, seed):
    """Item 8: demo-a (60k, conversations of up to 2 turns: 3 rounds planned) took 10 rounds of 7, 4, 2, ... lines and
    demo-tools (20k, tool loops of up to 4 turns: 5 planned) 12 rounds of one line. A round the plan counts on now
    sends what reaches the target (the length distribution's spread, the chains' turns counted); the summary and
    the log say the rounds used against the planned."""
    root = Path(__file__).resolve().parents[2]
    emu.reset({"seed": seed, "speed": 0.002, "tool_datasets": [str(root / "examples/prompts/demo-tools.jsonl")],
               "batch": {"balance": 50.0}})
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "eagledata.generate", "--dataset", "demo-a", "demo-tools",
                           "--datasets-file", str(root / "params/datasets.yaml"), "--route", "batch",
                           "--batch-base-url", moonshot(emu), "--output-dir", str(out), "--params-dir",
                           str(tmp_path / "params"), "--progress", "false", "--batch-poll-s", "0.1"],
                          env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, planned in (("demo-a", 3), ("demo-tools", 5)):
        summary = json.loads((out / "datasets" / name / "summary.json").read_text())
        run = summary["run"]
        assert len(run["batches"]) <= planned, [b["lines"] for b in run["batches"]]
        assert summary["stop_reason"] == "target_reached" and run["rounds_planned"] == planned
        assert run["rounds_used"] == len(run["batches"]) <= planned, [b["lines"] for b in run["batches"]]
        assert f"{name} round 1 of {planned} planned" in done.stderr
        assert f"{name} {summary['output_tokens']:,}/" in done.stderr and f"of {planned} planned" in done.stderr


def test_the_batch_summary_has_a_timeline_and_money_figures_that_agree(emu, tmp_path, monkeypatch):
    """Item 9: the report's health figure said "charged $0.0000" beside a table of $0.11 and drew empty panels: the
    batch route wrote no timeline. Now it samples one (what the settled lines cost, tokens, lines waiting), and its
    charged, recorded, wasted and $/M agree."""
    import asyncio

    from eagledata.generation.batch.route import run_batch_route
    from eagledata.generation.report.progress import TIMELINE_COLUMNS
    from eagledata.generation.report.run_report import RunHealth, summary_table

    monkeypatch.setenv("MOONSHOT_API_KEY", "sk-test-batch")
    emu.reset({**BATCH, "speed": 0.002, "batch": {"balance": 50.0}})
    datasets, _ = write_conversations(tmp_path, 20, seed=21)
    summary = asyncio.run(run_batch_route(batch_cfg(tmp_path, emu, datasets, turns="all")))
    run, tl, cols = summary["run"], summary["timeline"], summary["timeline_columns"]
    assert cols == TIMELINE_COLUMNS and len(tl) >= 3
    col = {c: [row[i] for row in tl] for i, c in enumerate(cols)}
    assert col["t_s"] == sorted(col["t_s"]) and col["spend_usd"] == sorted(col["spend_usd"])
    assert col["spend_usd"][-1] == pytest.approx(run["charged_usd"], abs=1e-6) and run["charged_usd"] > 0
    assert col["output_tokens"][-1] == run["output_tokens"] and max(col["in_flight"]) > 0
    assert run["wasted_usd"] == pytest.approx(run["charged_usd"] - run["recorded_usd"], abs=1e-8)
    assert run["usd_per_m_output"] >= PRICE.completion_per_m  # the batch price, and the prompts on top
    health = RunHealth.of_summary(summary)
    assert f"charged ${run['charged_usd']:,.4f}" in health.headline()
    table = summary_table(summary)["value"]  # the table says the same, and where the batch route's charge comes from
    assert table["charged this run (lines settled, batch price)"] == f"${run['charged_usd']:,.4f}"
    assert table["the account's balance delta this run"] == f"${run['account_delta_usd']:,.4f}"


def test_an_adopted_batchs_lines_are_charged_to_the_run_that_settles_them(emu, tmp_path):
    """Item 9: a rerun adopting a batch the service answered meanwhile read its balance after those lines were
    charged: its charged (the balance delta) came out below what its records cost ($/M under the batch price,
    nothing wasted). charged is what the service charged for the lines the run settled; the delta is beside it."""
    emu.reset({**BATCH, "speed": 0.002, "batch": {"balance": 50.0}})
    datasets, _ = write_conversations(tmp_path, 20, seed=22)
    out = tmp_path / "out"
    cmd = command(tmp_path, emu, datasets, "--turns", "last")
    proc, stderr = interrupted_once_created(cmd, out)
    assert proc.returncode == 0, stderr[-3000:]
    batch_id = json.loads((out / "datasets" / "C" / "summary.json").read_text())["run"]["batches_running"][0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the service answers (and charges) the lines before the rerun
        got = httpx.get(f"{moonshot(emu)}/batches/{batch_id}", headers={"Authorization": "Bearer k"}, timeout=30)
        if got.json()["status"] == "completed":
            break
        time.sleep(0.05)
    again = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    run = json.loads((out / "datasets" / "C" / "summary.json").read_text())["run"]
    assert run["recorded"] == 20 and run["charged_usd"] == pytest.approx(run["recorded_usd"], rel=1e-9)
    assert run["wasted_usd"] == 0 and run["usd_per_m_output"] >= PRICE.completion_per_m
    assert run["account_delta_usd"] < run["charged_usd"]  # the balance moved before this run read it


def test_a_cap_under_one_lines_worst_case_is_refused_before_anything_is_uploaded_naming_the_cap_that_works(emu,
                                                                                                          tmp_path):
    """Item 10: `max_spend_usd 0.05` at max_tokens 32768 (a line's worst case ~$0.059 at the batch price) stopped
    on max_spend_reached at $0.0000 saying nothing. It is an input error, before any upload, naming the cap that
    would send a line."""
    emu.reset(BATCH)
    datasets, _ = write_conversations(tmp_path, 5, seed=23)
    done = subprocess.run(command(tmp_path, emu, datasets, "--max-tokens", "32768", "--max-spend-usd", "0.05"),
                          env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    worst = PRICE.cost(0, 32768)  # $0.0590 before its prompt
    assert "max_spend_usd" in done.stderr and f"at least ${math.ceil(worst * 100) / 100:.2f}" in done.stderr
    assert emu.stats()["batch"]["files"] == 0 and batch_lines(emu) == []
    # a cap that holds one line's worst case goes on
    ok = subprocess.run(command(tmp_path, emu, datasets, "--max-tokens", "32768", "--max-spend-usd", "0.06",
                                "--turns", "last"), env=env(), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and batch_lines(emu), ok.stderr[-2000:]


def test_a_batch_model_of_another_release_than_the_tokenizer_is_refused(emu, tmp_path, tokenizer_dir):
    """Item 11: `batch_model kimi-k2.6` was accepted beside K2.5's tokenizer: the records would hold another model's
    answers. Each batch model names its release (facts.py); the tokenizer's directory says its own: they must agree,
    before anything is uploaded. A tokenizer of that release is accepted."""
    import shutil

    emu.reset(BATCH)
    datasets, _ = write_conversations(tmp_path, 5, seed=24)
    done = subprocess.run(command(tmp_path, emu, datasets, "--batch-model", "kimi-k2.6"), env=env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "batch_model" in done.stderr and "moonshotai/Kimi-K2.6" in done.stderr and "kimi-k2.5" in done.stderr
    assert emu.stats()["batch"]["files"] == 0 and batch_lines(emu) == []
    k26 = tmp_path / "tokenizers" / "Kimi-K2.6"  # K2.6's tokenizer, as its release names it
    shutil.copytree(tokenizer_dir, k26)
    ok = subprocess.run(command(tmp_path, emu, datasets, "--batch-model", "kimi-k2.6", "--tokenizer", str(k26),
                                "--turns", "last"), env=env(), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    records = load_records(tmp_path / "out" / "datasets" / "C" / "records.jsonl")
    assert records and {emu.ground_truth(r.generation_id)["model"] for r in records} == {"kimi-k2.6"}
