"""The pool's meter (realtime/pool.py), pure: slot-seconds per state, idle ones under the dispatcher's cause, the
figures up to the last target and the thinned timeline."""
import pytest

from eagledata.generation.realtime.pool import IDLE, IN_FLIGHT, POINTS, PREPARING, RECORDING, PoolMeter


def test_slot_seconds_go_to_each_state_and_idle_ones_to_the_cause_at_the_time():
    m = PoolMeter(2, t0=10.0)            # both slots start preparing
    m.move(PREPARING, IN_FLIGHT, 11.0)   # slot 1: 1 s preparing, then in flight
    m.cause("paced", 11.0)
    m.move(PREPARING, IDLE, 12.0)        # slot 2: 2 s preparing, then idle: paced 2 s, done 1 s
    m.cause("done", 14.0)
    m.move(IN_FLIGHT, RECORDING, 15.0)   # slot 1: 4 s in flight
    m.mark(15.0)
    until = m.figures(15.0)["until_last_target"]
    assert until["seconds"] == 5.0 and until["in_flight_share"] == pytest.approx(0.4)
    assert until["mean"] == {"in_flight": 0.8, "preparing": 0.6, "money": 0.0, "recording": 0.0, "idle_paced": 0.4,
                             "idle_retry": 0.0, "idle_turn": 0.0, "idle_congestion": 0.0, "idle_done": 0.2}


def test_a_slot_cannot_leave_a_state_no_slot_is_in_and_causes_are_named():
    m = PoolMeter(1, t0=0.0)
    with pytest.raises(ValueError, match="none there"):
        m.move(IN_FLIGHT, RECORDING, 1.0)
    with pytest.raises(ValueError, match="unknown idle cause"):
        m.cause("lunch", 1.0)


def test_the_meter_stops_when_every_slot_has_ended():
    m = PoolMeter(1, t0=0.0)
    m.move(PREPARING, IN_FLIGHT, 0.0)
    m.move(IN_FLIGHT, "ended", 4.0)
    m.sample(9.0)  # the summaries' own work after the slots' end is no slot time
    whole = m.figures(9.0)["whole_run"]
    assert whole["seconds"] == 4.0 and whole["mean"]["in_flight"] == 1.0
    assert m.figures(9.0)["timeline"] == [[4.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]


def test_the_timeline_is_thinned_to_windows_of_their_mean_slots():
    m = PoolMeter(4, t0=0.0)
    for _ in range(4):
        m.move(PREPARING, IN_FLIGHT, 0.0)
    for k in range(1, 1001):  # 1,000 samples of 0.1 s: one slot recording for the first half
        t = k / 10
        if k == 1:
            m.move(IN_FLIGHT, RECORDING, 0.0)
        if k == 501:
            m.move(RECORDING, IN_FLIGHT, 50.0)
        m.sample(t)
    rows = m.figures(100.0)["timeline"]
    assert len(rows) <= POINTS and rows[-1][0] == 100.0
    assert all(sum(r[1:]) == pytest.approx(4) for r in rows)
    first, last = rows[0], rows[-1]
    assert first[1:5] == [3.0, 0.0, 0.0, 1.0] and last[1:5] == [4.0, 0.0, 0.0, 0.0]
