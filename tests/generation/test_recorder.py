"""The recorder without a server: a record written once, a conversation's next turn made from its answer, a prompt
failed for good in failures.jsonl, refusals and suspects in the fidelity books (and the run's stop when no faithful
provider is left), every attempt's counters. Answers come as the service's classification gives them
(tests/helpers/parts.py)."""
import asyncio
import json
from collections import Counter

import pytest

from eagledata.generation.conversations.recorder import Recorded
from eagledata.generation.conversations.work import Work
from eagledata.generation.policy import rule
from eagledata.openrouter import Kind, Outcome
from eagledata.openrouter.answers import REASONING_MISSING
from eagledata.summaries import CONSISTENT, SUSPECT
from tests.helpers.parts import Scripted, answered, completion, endpoint, routing, send

BAD_GATEWAY = Outcome(Kind.RETRY, "bad_gateway", 502, "Bad gateway")
BAD_REQUEST = Outcome(Kind.FAILED, "bad_request", 400, "prompt too long")


def two():
    return routing(endpoint("Cheap"), endpoint("Dear"), provider={"sort": "price"})


def prepared(p, now: float = 0.0) -> Work:
    """The next work taken, tokenized and admitted (sent)."""
    work = p.dispatcher.take(now)
    asyncio.run(p.requester.prepare(work))
    assert p.admit(work, now) is not None
    return work


def build(p, work, c):
    return asyncio.run(p.recorder.build(work, c))


def refusal(tok, provider: str) -> Outcome:
    """Reasoning billed, none served (answers.classify_response): refused, with what it cost."""
    return Outcome(Kind.RETRY, REASONING_MISSING, 200, "3 reasoning tokens billed, no reasoning text served",
                   provider=provider, completion=completion(tok, provider=provider, reasoning="", cost=0.002))


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_record_is_written_once_and_a_second_write_of_its_turn_is_not(parts, tok):
    p = parts({"A": 2}, asks=2)
    work = prepared(p)
    c = completion(tok, "the answer", provider="Sim", cost=0.001)
    record = build(p, work, c)
    first, stop = p.recorder.record(work, record, c, 0.001)
    assert (first.tokens, first.written, first.next_turn.id, stop) == (record.output_tokens, True, "A-0000#2", None)
    again, stop = p.recorder.record(work, record, c, 0.001)  # the same turn once more (a stop signal's race):
    assert again == Recorded(tokens=record.output_tokens, written=False, next_turn=None) and stop is None  # no 2nd turn
    store = work.lane.store
    written = lines(store.files.records)
    assert [(r["id"], r["turn"], r["content"], r["provider"]) for r in written] == [("A-0000", 1, "the answer", "Sim")]
    assert written[0]["output_ids"] == record.output_ids and written[0]["prompt_ids"] == work.prompt_ids
    assert len(store.files.done_index.read_text().splitlines()) == 1
    assert (store.recorded, store.output_tokens, store.spend_usd, list(store.chains)) == \
        (1, record.output_tokens, 0.001, ["A-0000"])
    assert not lines(store.files.failures)


def test_an_answer_makes_its_conversations_next_turn_and_a_cut_one_ends_it(parts, tok):
    p = parts({"A": 2}, asks=2)
    work = prepared(p)
    assert work.turn.id == "A-0000" and work.turn.messages == [{"role": "user", "content": "A question 0"}]
    c = completion(tok, "first answer")
    recorded, _ = p.recorder.record(work, build(p, work, c), c, 0.001)
    nxt = recorded.next_turn
    assert recorded.written and nxt.id == "A-0000#2" and nxt.number == 2
    assert nxt.messages == [{"role": "user", "content": "A question 0"},
                            {"role": "assistant", "content": "first answer"},  # the target's, not the dataset's
                            {"role": "user", "content": "A question 0 part 2"}]
    store = work.lane.store
    assert list(store.chains) == ["A-0000"] and store.conversations_finished == 0  # still open
    p.dispatcher.answered(work, 0.0, recorded.tokens, written=True, next_turn=nxt)  # as parts.settle hands it on
    p.dispatcher.release(work, 0.0)
    # its last turn, taken next: recorded, and the conversation is finished
    last = prepared(p)
    assert last.source == "next" and last.turn is nxt
    c = completion(tok, "second answer")
    done, _ = p.recorder.record(last, build(p, last, c), c, 0.001)
    assert done.written and done.next_turn is None
    assert not store.chains and store.conversations_finished == 1
    # an answer cut at max_tokens ends its conversation at turn 1
    cut = prepared(p)
    c = completion(tok, "cut sho", finish="length")
    ended, _ = p.recorder.record(cut, build(p, cut, c), c, 0.001)
    assert cut.turn.id == "A-0001" and ended.written and ended.next_turn is None
    assert store.conversations_finished == 2
    assert [(r["id"], r["conversation_id"], r["turn"], r["finish_reason"], r["meta"]["turns"])
            for r in lines(store.files.records)] == [("A-0000", "A-0000", 1, "stop", 2),
                                                     ("A-0000#2", "A-0000", 2, "stop", 2),
                                                     ("A-0001", "A-0001", 1, "length", 2)]


def test_a_prompt_failed_for_good_goes_to_failures_with_its_last_error_and_tries(parts):
    p = parts({"A": 1}, max_attempts=2, transport=Scripted(BAD_GATEWAY, BAD_GATEWAY))
    send(p, 0.0)  # retried
    work = send(p, 5.0)  # the retry, due by then: its second attempt, the last one allowed
    store = work.lane.store
    assert lines(store.files.failures) == [{"id": "A-0000", "attempts": 2, "error": {
        "class": "bad_gateway", "status": 502, "message": "Bad gateway", "gave_up_after": "max_attempts"}}]
    assert store.done == {"A-0000"} and store.failed == 1 and store.conversations_finished == 1
    assert not lines(store.files.records)
    assert work.lane.stats.counts == Counter({"retried": 1, "failed": 1})
    assert work.lane.stop_reason == "all_failed"  # its one prompt failed: nothing recorded is not `completed`


def test_a_later_turn_failed_for_good_names_its_conversation_and_turn(parts, tok):
    p = parts({"A": 1}, asks=2, transport=Scripted(answered(tok, "first answer"), BAD_REQUEST))
    first, second = send(p, 0.0), send(p, 1.0)
    assert (first.turn.id, second.turn.id, second.source) == ("A-0000", "A-0000#2", "next")
    store = first.lane.store
    assert lines(store.files.failures) == [{"id": "A-0000#2", "conversation_id": "A-0000", "turn": 2, "attempts": 1,
                                            "error": {"class": "bad_request", "status": 400,
                                                      "message": "prompt too long"}}]
    assert [r["id"] for r in lines(store.files.records)] == ["A-0000"]
    assert not store.chains and store.conversations_finished == 1  # the failure ends the conversation


def test_a_refused_answer_is_avoided_for_its_prompt_and_counted_against_its_provider(parts, tok):
    p = parts({"A": 1}, routing=two())
    work = prepared(p)
    assert p.recorder.refused(work, BAD_GATEWAY) is None and work.avoid == set()  # only a refusal is
    assert p.recorder.fidelity.providers == {}
    assert p.recorder.refused(work, refusal(tok, "Dear")) is None
    assert work.avoid == {"Dear"}
    books = {"answers": 1, "repaired": 0, "refused": 1, "count_mismatch": 0, "count_refused": 0, "count_unchecked": 0,
             "verdict": CONSISTENT, "evidence": ""}
    assert p.recorder.fidelity.providers["Dear"].to_dict() == books  # the run's judge
    assert work.lane.fidelity.providers["Dear"].to_dict() == books  # and the dataset's books


def test_a_refusal_is_retried_on_another_provider(parts, tok):
    p = parts({"A": 1}, routing=two(), transport=Scripted(refusal(tok, "Dear"), answered(tok, provider="Cheap")))
    send(p, 0.0)
    work = send(p, 5.0)
    sent = p.requester.transport.sent
    assert sent[0]["provider"] == {"sort": "price"} and sent[1]["provider"] == {"sort": "price", "ignore": ["Dear"]}
    assert [(r["id"], r["provider"], r["meta"]["attempts"]) for r in lines(work.lane.store.files.records)] == \
        [("A-0000", "Cheap", 2)]
    assert work.lane.stats.counts == Counter({"retried": 1, "recorded": 1})
    assert work.lane.stats.errors == Counter({REASONING_MISSING: 1})


def test_a_provider_turning_suspect_stops_the_run_only_when_none_eligible_is_left(parts, tok):
    p = parts({"A": 1}, routing=two())
    work = prepared(p)
    verdicts = [p.recorder.refused(work, refusal(tok, "Dear")) for _ in range(20)]
    assert verdicts == [None] * 20 and p.recorder.fidelity.suspects == ["Dear"]  # Cheap is still faithful
    assert p.recorder.fidelity.providers["Dear"].verdict == SUSPECT
    verdicts = [p.recorder.refused(work, refusal(tok, "Cheap")) for _ in range(20)]
    assert verdicts == [None] * 19 + ["no_faithful_providers"]  # the 20th leaves none
    assert p.recorder.fidelity.suspects == ["Cheap", "Dear"]
    assert work.lane.fidelity.providers["Cheap"].verdict == CONSISTENT  # the dataset's books do not judge


def test_answers_whose_counts_are_off_make_the_only_provider_suspect_and_stop_the_run(parts, tok):
    p = parts({"A": 20}, concurrency=20)  # one provider, Sim, counting 7 tokens more than the answer has, every time
    faithful = completion(tok, "an answer").usage.completion_tokens  # the ids the record holds
    stops = []
    for _ in range(20):
        work = prepared(p)
        c = completion(tok, "an answer", completion_tokens=faithful + 7)
        stops.append(p.recorder.record(work, build(p, work, c), c, 0.001)[1])
    assert stops == [None] * 19 + ["no_faithful_providers"]
    assert p.recorder.fidelity.providers["Sim"].to_dict()["count_mismatch"] == 20
    assert work.lane.store.recorded == 20  # recorded all the same: the training set leaves a suspect's out


def test_a_local_backend_never_stops_for_fidelity(parts, tok):
    p = parts({"A": 1}, backend="local")
    work = prepared(p)
    assert [p.recorder.refused(work, refusal(tok, "Sim")) for _ in range(20)] == [None] * 20
    assert p.recorder.fidelity.suspects == ["Sim"]


def test_every_attempt_is_counted_for_its_provider_with_its_error_and_booking(parts, tok):
    p = parts({"A": 1}, routing=two())
    work = prepared(p)
    ok = answered(tok, provider="Cheap", cost=0.001)
    limited = Outcome(Kind.RETRY, "upstream_rate_limit", 429, "Provider returned error", provider="Dear")
    cut = Outcome(Kind.RETRY, "connection", None, "connection reset")  # no provider answered
    refused = refusal(tok, "Dear")  # an answer (read, paid for), refused
    for outcome, latency, booked in ((ok, 2.0, 0.001), (limited, 0.5, 0.0), (cut, 30.0, work.bound),
                                     (refused, 4.0, 0.002)):
        p.recorder.attempt(work, outcome, rule(outcome), latency, booked)
    stats = work.lane.stats
    assert {name: ps.figures() for name, ps in stats.by_provider.items()} == {
        "Cheap": {"attempts": 1, "answers": 1, "errors": 0, "rate_limited": 0, "median_latency_s": 2.0},
        "Dear": {"attempts": 2, "answers": 1, "errors": 1, "rate_limited": 1, "median_latency_s": 2.25},
        "-": {"attempts": 1, "answers": 0, "errors": 1, "rate_limited": 0, "median_latency_s": 30.0}}
    assert stats.errors == Counter({"upstream_rate_limit": 1, "connection": 1, REASONING_MISSING: 1})
    assert stats.booked_usd == pytest.approx(0.003 + work.bound)
    p.recorder.retried(work)
    p.recorder.retried(work)
    assert stats.counts == Counter({"retried": 2})
