"""Conversations on-policy: every assistant turn is the target's answer to its own earlier answers (issue 31).

The chain logic alone (generation/conversations/turns.py), the
store's open conversations, pacing's promised turns, and the whole
job against the emulator: 300 conversations of 1–3 turns at 200 in flight with faults on, one SIGKILL and a resume.
"""
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from eagledata.emulator import run_emulator
from eagledata.errors import InputError
from eagledata.generation import GenerateConfig, generate
from eagledata.generation.conversations.store import Store
from eagledata.generation.conversations.turns import Conversation, later_turn_ids, split_asks
from eagledata.generation.realtime.pacing import Pacing
from eagledata.prompts import normalize_prompt, scan_prompts
from eagledata.records import Answer, Record, load_records
from eagledata.text import parse_output_ids, prompt_ids
from tests.helpers.kills import kill_while_writing
from tests.helpers.records import check_cut_prefixes, journaled_text, recorded_turns

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.5, "content_median": 20, "content_sigma": 0.5, "max_total": 400}
BASE = {"speed": 0, "content": SMALL, "generation_delay": 0.1, "balance": 1000}
MIX = {"rate_limit": 0.04, "upstream_rate_limit": 0.02, "bad_gateway": 0.01, "unavailable": 0.01, "timeout": 0.01,
       "error_in_choice": 0.01, "empty_content": 0.01, "truncated_json": 0.01, "connection_reset": 0.01,
       "retry_after": 0}
OLD = "OLD ANSWER"  # every answer of the dataset's own carries this: none may reach a request


def sharegpt(cid: str, asks: int, system: bool = False, trailing_answer: bool = True) -> dict:
    turns = [{"from": "system", "value": "You are terse."}] if system else []
    for j in range(1, asks + 1):
        turns.append({"from": "human", "value": f"{cid} ask {j}: what is {j} + {len(cid)}? 量子"})
        if j < asks or trailing_answer:
            turns.append({"from": "gpt", "value": f"{OLD} {cid}/{j}"})
    return {"id": cid, "conversations": turns}


# -- the chain alone ----------------------------------------------------------------------------
def test_a_conversation_is_its_asks_with_the_targets_answers_between_them():
    p = normalize_prompt(sharegpt("c", 3, system=True))
    c = Conversation.of(p, "all")
    assert c.first == 1 and c.last == 3 and c.chained
    t1 = c.turn()
    assert t1.id == "c" and t1.number == 1 and t1.later == 2
    assert [m["role"] for m in t1.messages] == ["system", "user"]
    t2 = t1.next(said("mine 1"))
    assert t2.id == "c#2" and t2.messages == [*t1.messages, {"role": "assistant", "content": "mine 1"},
                                               {"role": "user", "content": "c ask 2: what is 2 + 1? 量子"}]
    t3 = t2.next(said("mine 2"))
    assert t3.id == "c#3" and t3.later == 0 and t3.messages[:len(t2.messages)] == t2.messages
    assert [m["content"] for m in t3.messages if m["role"] == "assistant"] == ["mine 1", "mine 2"]
    assert not any(OLD in m["content"] for m in t3.messages)
    assert t3.next(said("mine 3")) is None and t3.ends(said("mine 3"))
    cut = said("cut off", "length")
    assert t1.next(cut) is None and t1.ends(cut)  # a cut turn ends its conversation
    assert c.turn([said("mine 1"), said("mine 2")]) == t3  # a resume rebuilds the same request from recorded answers
    with pytest.raises(ValueError, match=r"^conversation 'c' has 3 turns, 3 already answered$") as e:
        c.turn([said("a"), said("b"), said("c")])
    assert type(e.value) is ValueError  # the engine's own misuse, not bad input (InputError)
    assert later_turn_ids(p, "all") == ["c#2", "c#3"] and later_turn_ids(p, "last") == []


def test_turns_last_is_todays_single_request():
    p = normalize_prompt(sharegpt("c", 3))
    c = Conversation.of(p, "last")
    t = c.turn()
    assert (t.id, t.number, t.later, t.messages) == ("c", 3, 0, p.messages)  # the dataset's answers as history
    assert sum(OLD in m["content"] for m in t.messages) == 2 and not c.chained
    one = Conversation.of(normalize_prompt(sharegpt("o", 1)), "all").turn()
    assert (one.id, one.number, one.later) == ("o", 1, 0)
    assert one.messages == normalize_prompt(sharegpt("o", 1)).messages


def test_split_asks_edge_cases():
    u = lambda s: {"role": "user", "content": s}  # noqa: E731
    a = lambda s: {"role": "assistant", "content": s}  # noqa: E731
    sysm = {"role": "system", "content": "s"}
    # a greeting before any user turn is context; two dataset answers in a row are both dropped
    assert split_asks([a("hello"), u("1"), a("x"), a("y"), u("2")]) == ([[a("hello"), u("1")], [u("2")]], [()])
    # two user messages in a row are one ask; a system message between turns goes with the next ask
    assert split_asks([u("1"), u("1b"), a("x"), sysm, u("2")]) == ([[u("1"), u("1b")], [sysm, u("2")]], [()])
    # nothing left to ask after the last answer: answered as it stands
    assert split_asks([u("1"), a("x"), sysm]) is None


def test_a_later_turns_id_that_another_prompt_has_is_refused(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(sharegpt("a", 2)) + "\n" + json.dumps(sharegpt("a#2", 1)) + "\n")
    with pytest.raises(InputError, match=r"line 2.*'a#2'|'a#2'.*line 2") as e:
        scan_prompts(f, turn_ids=lambda p: later_turn_ids(p, "all"))
    assert "p.jsonl:1" in str(e.value)
    assert scan_prompts(f, turn_ids=lambda p: later_turn_ids(p, "last")).total == 2


# -- the store ------------------------------------------------------------------------------------
def said(content: str, finish: str = "stop") -> Answer:
    """An answer of the target's with no reasoning."""
    return Answer("", content, finish)


def _record(turn, content="x", finish="stop") -> Record:
    c = Conversation.of(normalize_prompt(sharegpt("c", 3)), "all")
    t = c.turn([said("a1"), said("a2")][:turn - 1])
    return Record(id=t.id, dataset="D", conversation_id="c", turn=turn, messages=t.messages, reasoning="r",
                  content=content, finish_reason=finish, output_ids=[1, 2], meta={"turns": 3})


def finished(store: Store) -> set[str]:
    """The finished conversations among the store's ids, each checked through the view (and its count)."""
    out = {c for c in ("one", "c", "k", "f") if c in store.finished}
    assert store.conversations_finished == len(out)
    return out


@pytest.mark.parametrize("rebuild_index", [False, True])
def test_the_store_knows_open_conversations_and_their_recorded_turns(tmp_path, rebuild_index):
    with Store.open(tmp_path / "D") as s:
        s.add_record(Record(id="one", dataset="D", messages=[], reasoning="", content="y", finish_reason="stop"))
        s.add_record(_record(1, "a1"))
        s.add_record(_record(2, "a2"))
        assert finished(s) == {"one"} and list(s.chains) == ["c"] and s.done == {"one", "c", "c#2"}
    if rebuild_index:
        (tmp_path / "D" / "done.idx").unlink()
    with Store.open(tmp_path / "D") as s:
        assert finished(s) == {"one"} and [r.content for r in s.history("c")] == ["a1", "a2"]
        assert [r.turn for r in s.history("c")] == [1, 2]
        s.add_record(_record(3, "a3"))
        assert finished(s) == {"one", "c"} and not s.chains
    with Store.open(tmp_path / "D") as s:
        assert finished(s) == {"one", "c"} and s.recorded == 4
        # a cut turn ends its conversation; a failure names conversation and turn and ends it too
        s.add_record(Record(id="k", dataset="D", conversation_id="k", turn=1, messages=[], reasoning="r",
                            content="", finish_reason="length", meta={"turns": 2}))
        s.add_record(Record(id="f", dataset="D", conversation_id="f", turn=1, messages=[], reasoning="r",
                            content="z", finish_reason="stop", meta={"turns": 2}))
        assert "k" in s.finished and "f" in s.chains and "f" not in s.finished
        s.add_failure("f#2", {"class": "context_length"}, 1, conversation_id="f", turn=2)
    with Store.open(tmp_path / "D") as s:
        assert finished(s) == {"one", "c", "k", "f"} and not s.chains and s.failed == 1
    line = json.loads((tmp_path / "D" / "failures.jsonl").read_text())
    assert (line["id"], line["conversation_id"], line["turn"]) == ("f#2", "f", 2)


@pytest.mark.parametrize("rebuild_index", [False, True])
def test_a_pause_sample_leaves_its_turn_to_do_under_its_own_id(tmp_path, rebuild_index):
    """A Ctrl-C's cut sample (`meta.cut: interrupted`) is written as `<turn id>~n`: its conversation stays where it
    was (turn 1's pause: not started; turn 2's: open after turn 1), it is paid for but counts towards no target and
    no prior, and the turn's answer asked again keeps the turn's id."""
    def pause(turn: int, n: int) -> Record:
        r = _record(turn, "cut", finish="cut")
        r.id, r.meta = f"{r.id}~{n}", {**r.meta, "cut": "interrupted"}
        r.usage.cost = 0.5
        return r

    with Store.open(tmp_path / "D") as s:
        assert s.next_pause_id("c") == "c~1"
        s.add_record(pause(1, 1))
        assert s.next_pause_id("c") == "c~2" and "c" not in s.finished and not s.chains
        s.add_record(pause(1, 2))
        assert s.output_tokens == 0 and s.spend_usd == 1.0 and s.lengths == [] and len(s.paused["c"]) == 2
        s.add_record(_record(1, "a1"))
        assert list(s.chains) == ["c"] and s.next_pause_id("c#2") == "c#2~1"
        s.add_record(pause(2, 1))
    if rebuild_index:
        (tmp_path / "D" / "done.idx").unlink()
    with Store.open(tmp_path / "D") as s:
        assert [r.id for r in s.pause_samples("c")] == ["c~1", "c~2"] and s.next_pause_id("c") == "c~3"
        assert [r.id for r in s.pause_samples("c#2")] == ["c#2~1"] and s.pause_samples("c#3") == []
        assert "c" not in s.finished and [r.turn for r in s.history("c")] == [1]  # turn 2 is to do
        assert s.output_tokens == 2 and s.spend_usd == 1.5 and s.recorded == 4 and s.conversations_finished == 0
        s.add_record(_record(2, "a2"))
        s.add_record(_record(3, "a3"))
        assert finished(s) == {"c"}


# -- pacing ---------------------------------------------------------------------------------------
def test_pacing_counts_the_turns_a_started_conversation_still_has():
    pacing = Pacing([Pacing.lane("D", target=10_000, prompts=100, recorded=0, finished=0, prior_tokens=[1000] * 50)])
    lane = pacing.lanes["D"]
    pacing.hold("D", later=2)  # a conversation of three turns starts
    assert lane.expected() == pytest.approx(3000, rel=0.05)
    for _ in range(2):  # its two later turns, each counted once
        t = pacing.start("D", 0.0)
        pacing.end(t, 1.0, 1000, finished=False)
        pacing.hold("D", promised=True)
    t = pacing.start("D", 0.0)
    pacing.end(t, 1.0, 1000, finished=True)
    assert lane.promised == 0 and lane.waiting == 0 and lane.expected() == 3000
    # three more conversations of three: 9 requests of ~1000 on 3000 recorded pass the aim, but their first turns
    # (what is in hand) fall short of the target, so new ones still start: the later turns come an answer later
    for _ in range(3):
        pacing.hold("D", later=2)
    assert lane.expected() == pytest.approx(12_000, rel=0.05) and lane.open()
    for _ in range(4):  # seven first turns on 3000 recorded: one more would pass the target in hand alone
        pacing.hold("D", later=2)
    assert not lane.open() and pacing.order() == []
    pacing.forgo("D", 14)  # they were cut short
    assert lane.promised == 0
    with pytest.raises(ValueError, match=r"^pacing: D: 1 promised turns forgone, 0 promised$") as e:
        pacing.forgo("D", 1)
    assert type(e.value) is ValueError and lane.promised == 0  # refused before any count changed


def test_a_dataset_stops_starting_conversations_first_and_continuing_them_second():
    pacing = Pacing([Pacing.lane("D", target=10_000, prompts=100, recorded=0, finished=0, prior_tokens=[1000] * 50)])
    lane = pacing.lanes["D"]
    tickets = []

    def begin(n: int, **how) -> None:
        for _ in range(n):
            pacing.hold("D", **how)
            tickets.append(pacing.start("D", 0.0))

    begin(4, later=2)  # four conversations of three turns: 4 in flight, 8 turns to come
    assert lane.expected() == pytest.approx(12_000) and lane.open() and lane.may_continue()  # 4,000 in hand
    for t in tickets[:2]:
        pacing.end(t, 1.0, 1050, finished=False)
    begin(5, later=2)  # 2,100 recorded + 7 in flight: one more would put 10,100 in hand, past the target
    assert not lane.open() and lane.may_continue()  # no new conversation, but the chains go on (aim 10,200)
    begin(1, promised=True)  # a next turn: now the answers on their way will meet the aim
    assert not lane.may_continue()
    for t in tickets[2:]:
        pacing.end(t, 2.0, 900, finished=False)
    assert lane.recorded == 9_300 and lane.may_continue()  # short answers: under target, nothing on the way
    assert lane.promised == 17 and not lane.open()  # the promised turns go first


# -- the whole job ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emu(tokenizer_dir):
    with run_emulator(BASE) as handle:
        yield handle
        assert "Traceback" not in handle.log(), handle.log()[-3000:]


def write_conversations(tmp_path: Path, n: int, seed: int = 0) -> tuple[Path, dict[str, dict]]:
    rng = random.Random(seed)
    objs = {}
    for i in range(n):
        cid = f"conv-{i:04d}"
        objs[cid] = sharegpt(cid, rng.choice([1, 1, 2, 3]), system=i % 5 == 0, trailing_answer=i % 2 == 0)
    prompts = tmp_path / "C.jsonl"
    prompts.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs.values()))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"C:\n  prompts: {prompts}\n")
    return datasets, objs


def check_conversations(tok, out: Path, objs: dict[str, dict]) \
        -> tuple[list[Record], list[dict], dict[str, dict[int, Record]]]:
    """Every turn once; turn j's history holds exactly the records of turns 1..j−1 and none of the dataset's answers;
    a conversation stops early only at a cut turn or a failure naming it."""
    records, failures, by_conv = recorded_turns(out / "datasets" / "C")
    failed = {f.get("conversation_id", f["id"]): f for f in failures}
    for cid, obj in objs.items():
        asks = split_asks(normalize_prompt(obj).messages)[0]
        turns = by_conv.get(cid, {})
        k = len(turns)
        assert sorted(turns) == list(range(1, k + 1)), (cid, sorted(turns))
        for j, r in turns.items():
            assert r.id == (cid if j == 1 else f"{cid}#{j}")
            expected = []
            for ask, prev in zip(asks[:j - 1], [turns[i] for i in range(1, j)]):
                expected += [*ask, {"role": "assistant", "content": prev.content}]
            assert r.messages == expected + asks[j - 1], (cid, j)
            assert not any(OLD in str(m["content"]) for m in r.messages)
            assert r.prompt_ids == prompt_ids(tok, r.messages)
            back = parse_output_ids(tok, r.output_ids)
            assert (back.reasoning, back.content, back.finish_reason) == (r.reasoning, r.content, r.finish_reason)
            assert r.meta.get("turns") == (len(asks) if len(asks) > 1 else None)
        if k < len(asks):  # ended early: its last turn was cut, or its next turn failed for good
            if cid in failed:
                assert failed[cid]["id"] == (cid if k == 0 else f"{cid}#{k + 1}")
                if len(asks) > 1:
                    assert failed[cid]["turn"] == k + 1
            else:
                assert turns[k].finish_reason != "stop", (cid, k, len(asks))
    return records, failures, by_conv


def test_300_conversations_with_faults_a_sigkill_and_a_resume(emu, tok, tmp_path):
    emu.reset({**BASE, "speed": 0.15, "seed": 31, "faults": MIX})
    datasets, objs = write_conversations(tmp_path, 300)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "C", "--datasets-file", str(datasets),
           "--base-url", emu.base_url, "--output-dir", str(out), "--params-dir", str(tmp_path / "params"),
           "--concurrency", "200", "--max-tokens", "130", "--progress", "false", "--reserve-usd", "0",
           "--retry-base-s", "0.01", "--retry-cap-s", "0.2"]
    kills, _ = kill_while_writing(cmd, [out / "datasets" / "C" / "records.jsonl"], random.Random(31), 1,
                                  after_s=(1.5, 2.5))
    assert kills == 1
    killed_at = load_records(out / "datasets" / "C" / "records.jsonl", tolerate_torn_tail=True)
    open_chains = {r.conversation_id for r in killed_at if r.meta.get("turns", 1) > r.turn and
                   r.finish_reason == "stop"} - {r.conversation_id for r in killed_at if r.turn == r.meta.get("turns")}
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    records, failures, _ = check_conversations(tok, out, objs)
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0 and summary["run"]["turns"] == "all"
    multi = {cid for cid, o in objs.items() if len(split_asks(normalize_prompt(o).messages)[0]) > 1}
    assert sum(r.turn > 1 for r in records) > 100, "too few later turns to mean anything"
    assert len(open_chains) >= 10, "the kill left few conversations half done: the resume was hardly tested"
    resumed = [r for r in records if r.conversation_id in open_chains and r.id not in {k.id for k in killed_at}]
    assert resumed and all(r.turn > 1 for r in resumed)  # they went on at k+1, from the recorded answers
    assert summary["records"] + summary["pause_samples"] == len(records) and summary["failures"] == len(failures)
    assert sum(summary["run"]["by_turn"].values()) == summary["run"]["recorded"] and "3" in summary["run"]["by_turn"]
    assert len(multi) > 100


def test_a_ctrl_c_pauses_the_turns_it_cut_and_the_rerun_finishes_every_conversation(emu, tok, tmp_path):
    """Issue 60 item 1: a Ctrl-C with conversations in flight keeps each closed stream's prefix as a pause sample
    (`meta.cut: interrupted`, its own id `<turn id>~1`, an exact prefix), and the rerun asks each such turn again and
    goes on to the conversation's later turns from the finished answer: every prompt finished, every turn asked
    once, nothing twice."""
    import signal
    import time

    from eagledata.generation.conversations.turns import pauses
    from eagledata.generation.money.killed import leftovers

    emu.reset({**BASE, "speed": 0.05, "seed": 5, "content": {"reasoning_median": 300, "reasoning_sigma": 0.4,
                                                               "content_median": 80, "content_sigma": 0.4,
                                                               "max_total": 1500}})
    datasets, objs = write_conversations(tmp_path, 150, seed=5)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "C", "--datasets-file", str(datasets),
           "--base-url", emu.base_url, "--output-dir", str(out), "--params-dir", str(tmp_path / "params"),
           "--concurrency", "48", "--max-tokens", "1500", "--progress", "false", "--reserve-usd", "0",
           "--stream", "true"]
    records_file = out / "datasets" / "C" / "records.jsonl"
    journal = out / "datasets" / "C" / "streams.jsonl"

    def cut_enough() -> bool:  # a later turn can be cut, and many open streams have text to keep (load or not)
        done = len(records_file.read_text().splitlines()) if records_file.exists() else 0
        return done >= 20 and len(set(leftovers(journal)) & journaled_text(journal)) >= 15

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not cut_enough():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    first = load_records(records_file)
    paused = [r for r in first if pauses(r.meta)]
    assert len(paused) >= 10, "the Ctrl-C cut few streams: the rerun was hardly tested"
    assert {r.meta["cut"] for r in paused} == {"interrupted"}
    check_cut_prefixes(emu, paused)
    turn_ids = {r.id: r.id.rpartition("~")[0] for r in paused}
    assert all(rid == f"{t}~1" for rid, t in turn_ids.items())
    assert any(r.turn > 1 for r in paused) or any(r.meta.get("turns") for r in paused), "no conversation cut"
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["run"]["cut_samples"]["paused"] == len(paused)
    answered_first = {r.id for r in first if not pauses(r.meta)}
    assert not answered_first & set(turn_ids.values())  # a paused turn is still to do

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    records, failures, by_conv = check_conversations(tok, out, objs)
    assert not failures
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0
    assert summary["run"]["cut_samples"]["finished_after_pause"] == len(set(turn_ids.values()))
    answers = {r.id: r for r in records if not pauses(r.meta)}
    for r in paused:  # each paused turn answered by the rerun, on the same prompt, and its conversation went on
        answer = answers[turn_ids[r.id]]
        assert answer.finish_reason != "cut" and answer.prompt_ids == r.prompt_ids
        asks = len(split_asks(normalize_prompt(objs[r.conversation_id]).messages)[0])
        if answer.finish_reason == "stop" and r.turn < asks:
            assert r.turn + 1 in by_conv[r.conversation_id]
    assert len(records) == len(answers) + len(paused)  # the pause samples kept beside the answers, nothing else


def test_turns_last_keeps_todays_records(emu, tok, tmp_path):
    """`turns: last` answers the last ask on the dataset's answers, one record per prompt with the prompt's id; a
    one-turn prompt's record is the same under either setting."""
    emu.reset({**BASE, "seed": 32})
    datasets, objs = write_conversations(tmp_path, 40, seed=1)
    common = dict(dataset="C", datasets_file=str(datasets), base_url=emu.base_url, params_dir=str(tmp_path / "p"),
                  concurrency=20, max_tokens=400, progress=False, reserve_usd=0.0)
    generate(GenerateConfig(**common, output_dir=str(tmp_path / "last"), turns="last"))
    last = {r.id: r for r in load_records(tmp_path / "last" / "datasets" / "C" / "records.jsonl")}
    assert set(last) == set(objs)
    for cid, obj in objs.items():
        p = normalize_prompt(obj)
        r = last[cid]
        assert (r.conversation_id, r.messages, r.turn) == (cid, p.messages, len(split_asks(p.messages)[0]))
        assert "turns" not in r.meta and r.prompt_ids == prompt_ids(tok, p.messages)
    emu.reset({**BASE, "seed": 32})
    generate(GenerateConfig(**common, output_dir=str(tmp_path / "all")))
    every = {r.id: r for r in load_records(tmp_path / "all" / "datasets" / "C" / "records.jsonl")}
    ones = [cid for cid, o in objs.items() if len(split_asks(normalize_prompt(o).messages)[0]) == 1]
    assert ones and len(every) > len(last)
    for cid in ones:
        a, b = last[cid].to_dict(), every[cid].to_dict()
        for volatile in ("generation_id", "provider", "model", "usage", "meta"):
            a.pop(volatile), b.pop(volatile)
        assert a == b
    # one setting per dataset: continuing the `all` records with `last` is refused, naming the setting
    with pytest.raises(InputError, match="turns") as e:
        generate(GenerateConfig(**common, output_dir=str(tmp_path / "all"), turns="last"))
    assert "summary.json" in str(e.value)


def test_a_turns_answer_depends_on_its_whole_history(emu, tok):
    """The emulator answers a turn as the real service would: on everything it was sent."""
    import httpx

    emu.reset({**BASE, "seed": 33})
    ask = [{"role": "user", "content": "and then?"}]
    h1 = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "one"}]
    h2 = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "two"}]

    def answer(messages):
        r = httpx.post(f"{emu.base_url}/chat/completions", json={"model": "moonshotai/kimi-k2.5", "messages": messages,
                                                                 "max_tokens": 400, "seed": 1},
                       headers={"Authorization": "Bearer sk-test"}, timeout=30)
        body = r.json()
        return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]

    c1, n1 = answer(h1 + ask)
    c2, n2 = answer(h2 + ask)
    assert c1 != c2
    assert n1 == len(prompt_ids(tok, h1 + ask))


def test_a_turn_over_the_context_limit_ends_its_conversation(emu, tok, tmp_path):
    """Histories grow: where turn 3 no longer fits the context, it fails for good, `failures.jsonl` names the
    conversation and the turn, and turns 1–2 stay recorded."""
    from eagledata.emulator.catalog import default_endpoints

    eps = [{"provider": e.provider, "context_length": 700} for e in default_endpoints()]
    emu.reset({**BASE, "seed": 34, "endpoints": eps})
    long_ask = " ".join(["why"] * 150)  # ~150 tokens an ask: turn 3's prompt + max_tokens passes 700
    objs = {}
    for i in range(6):
        cid = f"long-{i}"
        objs[cid] = {"id": cid, "messages": [m for j in (1, 2, 3) for m in (
            {"role": "user", "content": f"{cid} ask {j}: {long_ask}"}, {"role": "assistant", "content": OLD})][:-1]}
    prompts = tmp_path / "C.jsonl"
    prompts.write_text("".join(json.dumps(o) + "\n" for o in objs.values()))
    (tmp_path / "datasets.yaml").write_text(f"C:\n  prompts: {prompts}\n")
    summary = generate(GenerateConfig(dataset="C", datasets_file=str(tmp_path / "datasets.yaml"),
                                      base_url=emu.base_url, output_dir=str(tmp_path / "out"),
                                      params_dir=str(tmp_path / "p"), concurrency=10, max_tokens=200, progress=False,
                                      reserve_usd=0.0))
    records, failures, _ = check_conversations(tok, tmp_path / "out", objs)
    assert summary["stop_reason"] == "completed" and summary["open_conversations"] == 0
    went_on = {r.conversation_id for r in records if r.turn == 2 and r.finish_reason == "stop"}
    assert {(f["conversation_id"], f["turn"]) for f in failures} == {(cid, 3) for cid in went_on}
    assert failures and all(f["error"]["class"] == "bad_request" for f in failures)
    assert all(len(r.prompt_ids) + 200 <= 700 for r in records)


def test_split_answered_gives_split_asks_asks_and_the_datasets_answers_in_one_walk():
    """`split_answered` (the quality experiment's asks and the data set's answers): the asks `split_asks` gives for
    the conversation without its trailing assistant messages, and after each ask the first assistant message that
    follows it (None at the end), on random conversations of every role. Planted: the last assistant message of a
    run instead of the first, or the asks of the whole conversation, fail."""
    import random

    from eagledata.generation.conversations.turns import split_answered

    def oracle(messages):
        end = len(messages)
        while end and messages[end - 1]["role"] == "assistant":
            end -= 1
        split = split_asks(messages[:end])
        if split is None:
            return None
        answers, asking = [], False
        for m in messages:
            if m["role"] in ("user", "tool"):
                asking = True
            elif m["role"] == "assistant" and asking:
                answers.append(m["content"])
                asking = False
        answers += [None] * (len(split[0]) - len(answers))
        return split[0], answers

    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        roles = [rng.choice(["user", "assistant", "assistant", "system"]) for _ in range(rng.randint(1, 8))]
        messages = [{"role": r, "content": f"{r}{i}"} for i, r in enumerate(roles)]
        assert split_answered(messages) == oracle(messages), messages
        checked += split_answered(messages) is not None
    assert checked > 500

    def u(s):
        return {"role": "user", "content": s}

    def a(s):
        return {"role": "assistant", "content": s}

    assert split_answered([u("1"), a("x"), a("y"), u("2"), a("z"), a("w")]) == ([[u("1")], [u("2")]], ["x", "z"])
    assert split_answered([a("hello"), u("1")]) == ([[a("hello"), u("1")]], [None])
    assert split_answered([u("1"), a("x"), {"role": "system", "content": "s"}]) is None
