"""The dispatcher and the ledger without a server: their calls in the order the engine makes them, `now` passed in
(the `parts` fixture: tests/generation/conftest.py)."""
import pytest

from eagledata.generation.conversations.work import State
from eagledata.generation.money.ledger import MoneyStop
from eagledata.generation.policy import RULES, rule
from eagledata.generation.realtime.dispatcher import Stopped, Wait
from eagledata.openrouter import Kind, Outcome


def test_a_retry_waits_for_its_due_time_and_goes_first_then(parts):
    p = parts({"A": 3}, concurrency=1)
    d = p.dispatcher
    taken = [work := d.take(0.0)]
    work.bound = 0.01
    assert p.admit(work, 0.0) is not None and work.state is State.SENT
    assert isinstance(d.take(0.0), Wait)  # the one slot is held
    bad_gateway = Outcome(Kind.RETRY, "bad_gateway", 502)
    assert d.not_ok(work, 1.0, bad_gateway, rule(bad_gateway)) == "retry"
    p.ledger.settle(work.ticket, rule(bad_gateway), None, work.bound, 1.0)
    assert 1.0 <= work.due <= 3.0 and work.attempts == 1
    assert work.state is State.RETRIED
    d.release(work, 1.0)
    assert work.state is State.QUEUED and d.holding == 0
    taken.append(nxt := d.take(1.0))  # the retry is not due yet: the next prompt goes
    assert nxt.turn.id == "A-0001" and nxt.source == "new"
    d.release(nxt, 1.0)  # given back unstarted
    taken.append(again := d.take(work.due))
    assert again is work and again.source == "retry"
    assert [w.turn.id for w in taken] == ["A-0000", "A-0001", "A-0000"]


def test_an_illegal_move_raises(parts):
    p = parts({"A": 1})
    work = p.dispatcher.take(0.0)
    with pytest.raises(RuntimeError, match="queued -> sent is not a move"):
        p.dispatcher.sent(work, 0.0)


def test_the_first_stop_wins(parts):
    d = parts({"A": 2}).dispatcher
    assert d.stop.set("max_spend_reached") and not d.stop.set("interrupted")
    assert d.take(0.0) == Stopped("max_spend_reached")


def test_the_ledger_stops_at_the_cap_naming_it_and_books_a_cancel_at_its_bound(parts):
    p = parts({"A": 10}, max_spend_usd=0.05, budget_mode="strict")
    ledger = p.ledger
    tickets = []
    while isinstance(t := ledger.admit(0.02, 0.0), int):
        tickets.append(t)
    assert len(tickets) == 2 and t is None  # two in flight fit 0.05 at their bound; wait for one to settle
    ledger.settle(tickets[0], RULES["cancelled"], None, 0.02, 1.0)  # cut off: booked at its bound
    assert ledger.books.provisional_usd == pytest.approx(0.02) and ledger.in_flight == 1
    ledger.settle(tickets[1], RULES["ok"], 0.02, 0.02, 1.0)
    verdict = ledger.admit(0.02, 1.0)
    assert isinstance(verdict, MoneyStop) and verdict.reason == "max_spend_reached"
    assert ledger.money_left["why"] == verdict.why == "nothing in flight, and one more request does not fit"


def test_a_retry_near_the_target_goes_when_nothing_else_is_in_flight(parts):
    """A dataset of two-turn conversations 5 tokens short of its target, nothing in flight, a retried first turn
    whose second turn pacing counts as promised. Gated as a new conversation, that retry waited on its own promised
    turn for good (the run hung with one slot); it is a started conversation and goes."""
    p = parts({"B": 4}, targets={"B": 100}, asks=2, concurrency=1, max_attempts=4)
    d = p.dispatcher
    first = d.take(0.0)
    first.bound = 0.01
    assert p.admit(first, 0.0) is not None
    d.answered(first, 1.0, 95, written=True, next_turn=None)  # 95 of 100 recorded, its conversation cut
    p.ledger.settle(first.ticket, RULES["ok"], 0.001, first.bound, 1.0)
    d.release(first, 1.0)
    second = d.take(1.0)
    assert second.turn.id == "B-0001"
    second.bound = 0.01
    assert p.admit(second, 1.0) is not None
    bad_gateway = Outcome(Kind.RETRY, "bad_gateway", 502)
    assert d.not_ok(second, 2.0, bad_gateway, rule(bad_gateway)) == "retry"
    p.ledger.settle(second.ticket, rule(bad_gateway), None, second.bound, 2.0)
    d.release(second, 2.0)
    lane = d.pacing.lanes["B"]
    assert lane.promised == 1 and not lane.flights and not lane.open()  # a new conversation would overshoot
    again = d.take(second.due)
    assert again is second and again.source == "retry"
