"""The same 4xx for many different prompts is a setting of the run, not the prompts (issue 44, bug 1), without a
server: the watch (policy.RejectionWatch, pure), the setting a service's message names, and the dispatcher holding
such failures until an answer (or the dataset's end) shows they are the prompts' own, or dropping them, still to do,
when the run stops on them."""
import asyncio
import json

import pytest

from eagledata.generation.policy import (
    REJECTED_PROMPTS,
    RejectionWatch,
    StopReason,
    rejected_setting,
    rejected_stop,
)
from eagledata.openrouter import Kind, Outcome
from tests.helpers.parts import Scripted, answered, attempt, send


def bad(message: str = "'temperature' must be a number in [0, 2]", status: int = 400) -> Outcome:
    return Outcome(Kind.FAILED, "bad_request", status, message)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- the watch ------------------------------------------------------------------------------------------------------
def test_the_watch_fires_on_the_same_error_for_n_prompts_that_are_most_of_what_was_sent():
    w = RejectionWatch()
    for _ in range(REJECTED_PROMPTS + 4):
        w.sending()
    assert [w.rejected(f"p{i}", bad()) for i in range(REJECTED_PROMPTS)] == [False] * (REJECTED_PROMPTS - 1) + [True]


def test_the_same_prompt_twice_counts_once():
    w = RejectionWatch()
    for _ in range(2 * REJECTED_PROMPTS):
        w.sending()
    assert not any(w.rejected("p", bad()) for _ in range(2 * REJECTED_PROMPTS))


def test_rejections_among_many_requests_in_flight_are_the_prompts_own():
    """A first wave of 2,000: the too-long prompts' 400s come back at once, long before any answer; the rest are
    in flight, so the 400s are a small share of what was sent."""
    w = RejectionWatch()
    for _ in range(2000):
        w.sending()
    assert not any(w.rejected(f"p{i}", bad("maximum context length is 262144 tokens")) for i in range(100))


def test_an_answer_starts_the_count_again_with_what_is_still_in_flight():
    w = RejectionWatch()
    for _ in range(REJECTED_PROMPTS):
        w.sending()
    assert not any(w.rejected(f"p{i}", bad()) for i in range(REJECTED_PROMPTS - 1))
    w.answered(in_flight=30)
    assert not any(w.rejected(f"q{i}", bad()) for i in range(REJECTED_PROMPTS))  # 10 of 30 in flight
    for _ in range(20):
        w.sending()
    assert w.rejected("r", bad()) is False and w.rejected("s", bad()) is False
    assert [w.rejected(f"t{i}", bad()) for i in range(20)][-1] is True  # 32 of 50


def test_messages_that_differ_only_in_numbers_are_one_error_and_others_are_not():
    w = RejectionWatch()
    for _ in range(REJECTED_PROMPTS):
        w.sending()
    for i in range(REJECTED_PROMPTS - 1):
        assert not w.rejected(f"p{i}", bad(f"you requested about {1000 + i} tokens ({i} of text input)"))
    assert not w.rejected("other", bad("a different message"))
    assert not w.rejected("other-status", bad("you requested about 7 tokens (7 of text input)", status=422))
    assert w.rejected("last", bad("you requested about 5 tokens (5 of text input)"))


@pytest.mark.parametrize("message, setting", [
    ("'temperature' must be a number in [0, 2]", "temperature"),
    ("Provider returned error: temperature must be in [0, 1] for this deployment", "temperature"),
    ("This endpoint's maximum context length is 262144 tokens. However, you requested about 300011 tokens",
     "max_tokens"),
    ("'provider.sort' must be one of ['latency', 'price', 'throughput']", "provider.sort (the routing file)"),
    ("'provider.ignor' is not a recognized provider preference", "provider.ignor (the routing file)"),
    ("moonshotai/kimi-k2.6x is not a valid model ID", "model"),
    ("something nobody foresaw", "a setting of the run (the service's message does not say which)"),
])
def test_the_setting_a_message_names(message, setting):
    assert rejected_setting(message) == setting


def test_the_stop_reason_names_the_setting_and_quotes_the_message():
    reason = rejected_stop(bad("Provider returned error: temperature must be in [0, 1]"))
    assert reason == "request_rejected: temperature: 400 Provider returned error: temperature must be in [0, 1]"
    assert reason.startswith(StopReason.REQUEST_REJECTED)


# -- the dispatcher: held, then written or left to do ---------------------------------------------------------------
def test_a_400_is_written_once_an_answer_shows_the_settings_work(parts, tok):
    p = parts({"A": 3}, concurrency=1)
    first = send(p, 0.0, bad("prompt too long"))
    store = first.lane.store
    assert not lines(store.files.failures) and store.done == set()  # held: the run's settings, or the prompt's?
    send(p, 1.0, answered(tok))
    assert [f["id"] for f in lines(store.files.failures)] == ["A-0000"] and store.failed == 1
    assert first.lane.stats.counts["failed"] == 1


def test_a_400_still_held_at_its_datasets_end_is_written_then(parts):
    p = parts({"A": 2}, concurrency=1)
    send(p, 0.0, bad("prompt too long"))
    last = send(p, 1.0, bad("prompt too long"))
    store = last.lane.store
    assert [f["id"] for f in lines(store.files.failures)] == ["A-0000", "A-0001"]
    assert last.lane.stop_reason == StopReason.ALL_FAILED == p.dispatcher.stop.reason  # nothing recorded at all


def test_the_same_400_for_many_prompts_stops_the_run_and_writes_none_of_them(parts):
    n = REJECTED_PROMPTS + 5
    p = parts({"A": n}, concurrency=1, transport=Scripted(*[bad()] * REJECTED_PROMPTS))
    works = [send(p, float(i)) for i in range(REJECTED_PROMPTS)]
    d, lane = p.dispatcher, works[0].lane
    assert d.stop.reason == "request_rejected: temperature: 400 'temperature' must be a number in [0, 2]"
    assert d.stop.fatal is not None and d.stop.fatal.message == "'temperature' must be a number in [0, 2]"
    assert not lines(lane.store.files.failures) and lane.store.done == set() and lane.stats.counts["failed"] == 0
    assert not lane.finished and lane.held == 0  # every prompt still to do: the next run sends them


def test_after_a_rejection_stop_a_late_400_is_left_to_do_too(parts):
    p = parts({"A": REJECTED_PROMPTS + 2}, concurrency=REJECTED_PROMPTS + 1,
              transport=Scripted(*[bad()] * (REJECTED_PROMPTS + 1)))
    taken = [p.dispatcher.take(0.0) for _ in range(REJECTED_PROMPTS + 1)]
    for i, work in enumerate(taken):
        asyncio.run(attempt(p, work, float(i)))
    lane = taken[0].lane
    assert p.dispatcher.stop.reason.startswith("request_rejected: ")
    assert not lines(lane.store.files.failures) and lane.held == 0
