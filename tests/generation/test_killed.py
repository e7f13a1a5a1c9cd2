"""The streams a killed run left (issue 42): journaled as they start, read back from the generation endpoint by the
next run, shown as `run.killed_before`."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from eagledata.emulator import run_emulator
from eagledata.generation.money.killed import Baseline, KilledBefore, StreamJournal, baseline, leftovers, read_killed
from eagledata.openrouter.client import LOCAL_KEY
from tests.helpers.records import journaled_text

NOTHING_KEPT = {"kept": 0, "kept_usd": 0.0, "not_kept": {}}  # no text journaled: no prefix kept


def test_the_journal_keeps_what_started_and_never_ended(tmp_path):
    path = tmp_path / "streams.jsonl"
    j = StreamJournal(path)
    assert j.before == []
    j.started("gen-1", "a", "a")
    j.started("gen-2", "b#2", "b")
    j.started("gen-2", "b#2", "b")  # seen twice: written once
    j.append_text([{"text": "gen-2", "provider": "P", "model": "m", "reasoning": "I think "},
                   {"text": "gen-1", "reasoning": "ended anyway"}])
    j.append_text([{"text": "gen-2", "reasoning": "so.", "content": "Yes "}])
    j.ended("gen-1")
    j.ended("gen-9")  # never started here: nothing written
    with path.open("ab") as f:
        f.write(b'{"start": "gen-')  # a kill mid-write
    assert leftovers(path) == ["gen-2"] and len(path.read_text().splitlines()) == 7
    again = StreamJournal(path)
    assert again.before == ["gen-2"] and path.read_text().endswith('{"end": "gen-1"}\n')  # the torn line cut off
    d = again.delivered["gen-2"]  # what the stream left without an end had delivered, its pieces in order
    assert list(again.delivered) == ["gen-2"] and (d.conversation_id, d.turn_id, d.provider, d.model) == \
        ("b", "b#2", "P", "m")
    assert d.delta() == {"reasoning": "I think so.", "content": "Yes "}
    again.started("gen-3", "c", "c")
    again.rewrite(["gen-2"])  # gen-2 still unknown to the service; gen-3 still open in this run
    assert leftovers(path) == ["gen-2", "gen-3"] and StreamJournal(path).delivered == {}  # text read once


def test_reasoning_served_only_in_reasoning_details_is_journaled_and_its_prefix_kept(tmp_path):
    """A provider that serves reasoning only in `reasoning_details` (`reasoning` null: SiliconFlow's quirk, 5 % of its
    answers) delivers text too: the journal keeps it and the next run rebuilds the cut prefix from it, as from a
    `reasoning` field (kill_bench: 47 of 49 killed streams on SiliconFlow kept nothing while it did not). A stream
    that serves both fields is journaled once."""
    from eagledata.generation.realtime.salvage import rebuilt
    from eagledata.openrouter.stream import NO_MARK, StreamState, cut_completion

    def piece(text: str, reasoning: bool = False) -> dict:
        return {"id": "gen-1", "provider": "SiliconFlow", "model": "m", "choices": [{"delta": {
            "role": "assistant", "content": "", "reasoning": text if reasoning else None,
            "reasoning_details": [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]}}]}

    path = tmp_path / "streams.jsonl"
    journal, state = StreamJournal(path), StreamState()
    journal.started("gen-1", "t", "t")
    mark = NO_MARK
    for text in ("First I read ", "the question, then"):  # two flushes
        state.chunk(piece(text))
        delta, mark = state.delivered_since(mark)
        journal.append_text([{"text": "gen-1", "provider": "SiliconFlow", "model": "m", **delta}])
    completion, why = cut_completion(rebuilt(StreamJournal(path).delivered["gen-1"]))
    assert completion is not None and completion.answer.reasoning == "First I read the question,", why
    both = StreamState()
    both.chunk(piece("I think ", reasoning=True))
    assert both.delivered_since(NO_MARK)[0] == {"reasoning": "I think "}


def test_the_first_killed_runs_baseline_is_kept_until_a_summary_is_written(tmp_path):
    path = tmp_path / "streams.jsonl"
    first = StreamJournal(path)
    first.begin(Baseline(10.0, 1.0, ("A",)))
    first.started("gen-1", "t", "t")  # killed
    second = StreamJournal(path)
    assert second.killed == Baseline(10.0, 1.0, ("A",))
    second.rewrite(["gen-1"])  # it read what was left: the baseline stays
    second.begin(Baseline(12.0, 1.5, ("A",)))  # the chain's first is kept, not this run's
    assert baseline(path) == Baseline(10.0, 1.0, ("A",)) and leftovers(path) == ["gen-1"]
    third = StreamJournal(path)  # killed again: the next run measures from the first killed run's start
    assert third.killed.wasted(13.0, {"A": 1.8, "B": 9.0}) == pytest.approx(3.0 - 0.8)
    assert third.killed.wasted(13.0, {"B": 9.0}) is None  # its dataset is not in this run: unknown
    third.rewrite([], summarized=True)
    assert baseline(path) is None and StreamJournal(path).killed is None
    fourth = StreamJournal(path)
    fourth.begin(Baseline(20.0, 3.0, ("A",)))
    assert baseline(path) == Baseline(20.0, 3.0, ("A",))
    fresh = StreamJournal(tmp_path / "other.jsonl")
    fresh.rewrite([], summarized=True)  # a run that journaled nothing leaves no file behind
    assert not (tmp_path / "other.jsonl").exists()


def test_a_killed_runs_streams_are_read_back_shown_and_what_they_delivered_kept(tokenizer_dir, tmp_path):
    """A run streaming at speed 1 is SIGKILLed with its streams in flight; the next run reads what they cost (those on
    providers with stream cancellation: cancelled, billed until the kill) and its summary shows it. What each had
    delivered by the journal's last flush is kept as a pause sample (`meta.cut: killed`, `<id>~1`): an exact prefix
    of the answer the service was generating, carrying what the service billed for it; its prompt is asked again
    (issue 60 item 6)."""
    from eagledata.records import load_records
    from tests.helpers.records import check_cut_prefixes

    prompts = tmp_path / "C.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                               for i in range(24)))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"C:\n  prompts: {prompts}\n")
    out = tmp_path / "out"
    with run_emulator({"speed": 0.3, "balance": 100, "generation_delay": 0.1}) as emu:
        cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "C", "--datasets-file", str(datasets),
               "--base-url", emu.base_url, "--output-dir", str(out), "--params-dir", str(tmp_path / "params"),
               "--concurrency", "20", "--max-tokens", "600", "--progress", "false", "--reserve-usd", "0",
               "--stream", "true"]
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        journal = out / "datasets" / "C" / "streams.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (len(leftovers(journal)) < 20 or len(journaled_text(journal, 2)) < 10):
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = leftovers(journal)
        assert len(killed) == 20, proc.stderr.read()[-2000:]
        time.sleep(1.0)  # the cancelling providers have stopped; the others generate on
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
        before = summary["run"]["killed_before"]
        assert before["streams"] == 20 and before["read"] + before["unread"] == 20 and before["read"] > 0
        cancelled = [g for g in killed if emu_generation(emu, g)["cancelled"]]
        assert before["cancelled"] == len(cancelled) > 0
        assert before["usd"] == pytest.approx(sum(emu_generation(emu, g)["total_cost"] for g in killed
                                                  if emu_generation(emu, g) is not None), rel=1e-6)
        kept = [r for r in load_records(out / "datasets" / "C" / "records.jsonl") if r.meta.get("cut") == "killed"]
        assert len(kept) == before["kept"] >= 5, before
        check_cut_prefixes(emu, kept)
        assert {r.generation_id for r in kept} <= set(killed) and all(r.id == f"{r.conversation_id}~1" for r in kept)
        costs = {g: emu_generation(emu, g) for g in killed}
        assert before["kept_usd"] == pytest.approx(sum(r.usage.cost for r in kept), abs=1e-9)
        # each holds its prompt and prefix at its provider's price, never more than the service billed for it
        assert all(0 < r.usage.cost <= (costs[r.generation_id] or {}).get("total_cost", 1.0) + 1e-12 for r in kept)
        assert not journaled_text(journal)  # read once: the text lines went with the journal's rewrite
        # every prompt answered by the run, the kept prefixes beside the answers
        assert summary["records"] == 24 and summary["pause_samples"] == len(kept)
        assert leftovers(journal) == []  # every stream of this run ended in it
        # by the account: the killed run's charge when this one began (100 in credits less the balance then), less
        # what its records cost (the store's total less this run's)
        run = summary["run"]
        charged_before = 100 - run["balance_start_usd"]
        assert run["killed_wasted_usd"] == pytest.approx(
            charged_before - (summary["spend_usd"] - run["recorded_usd"]), abs=1e-6)
        # the streams it named among it, less what the kept prefixes' records hold now
        assert run["killed_wasted_usd"] >= before["usd"] - before["late_usd"] - before["kept_usd"] - 1e-9
        assert baseline(journal) is None  # a summary is written: the next kill starts a chain of its own


def emu_generation(emu, gid: str) -> dict | None:
    r = httpx.get(f"{emu.base_url}/generation", params={"id": gid}, headers={"Authorization": f"Bearer {LOCAL_KEY}"})
    return r.json()["data"] if r.status_code == 200 else None


def test_reading_costs_survives_an_unknown_id(tokenizer_dir):
    with run_emulator({"speed": 0}) as emu:
        async def main() -> KilledBefore:
            async with httpx.AsyncClient(base_url=emu.base_url + "/",
                                         headers={"Authorization": f"Bearer {LOCAL_KEY}"}) as client:
                return await read_killed(client, ["gen-unknown"])
        found = asyncio.run(main())
    assert found.figures() == {"streams": 1, "read": 0, "cancelled": 0, "usd": 0.0, "unread": 1, "late_usd": 0.0,
                               **NOTHING_KEPT}


def test_an_id_unknown_at_the_start_and_read_at_the_end_was_billed_during_the_run():
    """An answer a killed run left on an endpoint that bills whole ones is generated on upstream: unknown to the
    generation endpoint at the next run's start, read at its end. Billed meanwhile, it is in that run's account delta
    too: `late_usd` says how much of `usd` that is."""
    asks: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        gid = request.url.params["id"]
        asks.append(gid)
        if gid == "gen-whole" and asks.count(gid) == 1:  # still generating at the start
            return httpx.Response(404, json={"error": {"code": 404, "message": "not found"}})
        cost, cancelled = (0.2, False) if gid == "gen-whole" else (0.1, True)
        return httpx.Response(200, json={"data": {"id": gid, "total_cost": cost, "cancelled": cancelled}})

    async def main() -> KilledBefore:
        async with httpx.AsyncClient(base_url="http://127.0.0.1:9/api/v1/",
                                     transport=httpx.MockTransport(service)) as client:
            start = await read_killed(client, ["gen-cut", "gen-whole"])
            assert start.unread == ["gen-whole"] and start.late_usd == 0.0
            return await read_killed(client, [], start)

    end = asyncio.run(main())
    assert end.figures() == {"streams": 2, "read": 2, "cancelled": 1, "usd": pytest.approx(0.3), "unread": 0,
                             "late_usd": 0.2, **NOTHING_KEPT}


def test_the_report_says_what_the_killed_run_wasted_and_what_closed_streams_cost():
    from eagledata.generation import summary_table

    run = {"recorded": 1, "failed": 0, "output_tokens": 10, "usd_per_m_output": 1.0,
           "cheapest_eligible_usd_per_m_output": 1.0, "max_spend_usd": None, "charged_usd": 0.5, "recorded_usd": 0.4,
           "wasted_usd": 0.1, "output_tokens_per_s": 1.0, "retried": 0,
           "killed_before": {"streams": 20, "read": 18, "cancelled": 12, "usd": 0.0123, "unread": 2, "late_usd": 0.01},
           "foreign_usd": 0.0151, "killed_wasted_usd": 0.0311,
           "read_back": {"streams": 30, "read": 29, "cancelled": 29, "usd": 0.019, "bound_usd": 0.126, "unread": 1}}
    table = summary_table({"stop_reason": "completed", "records": 1, "failures": 0, "remaining": 0, "prompts": 1,
                           "output_tokens": 10, "target_output_tokens": None, "wall_s": 1.0, "run": run})
    assert table.loc["wasted by the killed run before (streams)", "value"] == \
        "$0.0123 over 18 of 20 streams (12 cancelled at the kill, 2 not known yet; $0.0100 of it billed during " \
        "this run)"
    assert table.loc["billed during this run, not booked by it", "value"] == "$0.0151"
    assert table.loc["wasted by the killed runs before (account)", "value"] == "$0.0311"
    assert table.loc["closed streams, cost read by id", "value"] == "$0.0190 over 29 of 30"
    assert table.loc["closed streams, booked at / left to the account", "value"] == "$0.1260 / 1 streams"


def test_what_a_run_read_and_could_not_show_is_carried_to_the_next_summary(tmp_path):
    """Killed runs in a row: each reads what its predecessor's streams cost and is killed in turn before its summary.
    The journal carries what was read (never read twice), so the run that lives to write a summary shows them all."""
    path = tmp_path / "streams.jsonl"
    first = StreamJournal(path)
    for gid in ("gen-1", "gen-2", "gen-3"):
        first.started(gid, "t", "t")  # killed with three streams open
    second = StreamJournal(path)
    assert second.before == ["gen-1", "gen-2", "gen-3"] and second.carried is None
    read = KilledBefore(streams=3, read=2, cancelled=1, usd=0.25, unread=["gen-3"])  # gen-3 not known yet
    second.rewrite(read.unread, carry=read)
    second.started("gen-4", "t", "t")  # killed too, before its summary
    third = StreamJournal(path)
    assert third.before == ["gen-3", "gen-4"]
    assert third.carried.figures() == {"streams": 2, "read": 2, "cancelled": 1, "usd": 0.25, "unread": 0,
                                       "late_usd": 0.0, **NOTHING_KEPT}
    shown = KilledBefore(streams=2, read=2, cancelled=2, usd=0.5).add(third.carried)  # gen-3 and gen-4 read now
    assert shown.figures() == {"streams": 4, "read": 4, "cancelled": 3, "usd": 0.75, "unread": 0, "late_usd": 0.0,
                               **NOTHING_KEPT}
    third.rewrite([], carry=shown)
    assert StreamJournal(path).carried.usd == 0.75  # killed again before its summary: still carried
    third.rewrite([])  # its summary shows them: carried no more
    assert StreamJournal(path).carried is None and leftovers(path) == []
