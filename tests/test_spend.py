from hypothesis import given, settings, strategies as st

from eagledata.generation.spend import Admit, SpendGuard

P_IN, P_OUT = 0.6e-6, 3.0e-6


def test_admit_wait_no():
    g = SpendGuard(P_IN, P_OUT, max_tokens=1000, max_spend_usd=0.011)
    worst = g.worst_case(100)  # 100 * 0.6e-6 + 1000 * 3e-6 = 0.00306
    assert worst == 100 * P_IN + 1000 * P_OUT
    held = [g.reserve(100) for _ in range(3)]
    assert g.admit(100) is Admit.WAIT  # 4 x 0.00306 > 0.011 only because 3 are in flight
    g.settle(held[0], 0.0001)
    assert g.admit(100) is Admit.YES
    g.spent_usd = 0.0085
    g.reserved_usd, g.in_flight = 0, 0
    assert g.admit(100) is Admit.NO and g.admit(0) is Admit.NO  # not even an empty prompt fits


def test_balance_and_reserve_limit():
    g = SpendGuard(P_IN, P_OUT, max_tokens=1000, balance_usd=1.0, reserve_usd=0.995)
    assert g.admit(0) is Admit.YES  # 0.003 <= 0.005
    g.spend = g.settle(g.reserve(0), 0.003)
    assert g.admit(0) is Admit.NO
    g.update_balance(5.0, spent_since=0.003)  # a higher reading never raises the limit
    assert g.balance_usd == 1.0
    g.update_balance(0.5, spent_since=0.003)  # someone else spent: the limit drops
    assert g.balance_usd == 0.503


@settings(max_examples=300, deadline=None)
@given(cap=st.floats(0.001, 1.0), steps=st.lists(st.tuples(st.integers(0, 5000), st.floats(0, 1)), max_size=200))
def test_never_over_cap(cap, steps):
    """Whatever each request really costs (up to its worst case), booked spend never passes the cap."""
    g = SpendGuard(P_IN, P_OUT, max_tokens=2000, max_spend_usd=cap)
    pending = []
    for prompt_tokens, frac in steps:
        if g.admit(prompt_tokens) is Admit.YES:
            pending.append((g.reserve(prompt_tokens), frac))
        elif pending:
            held, f = pending.pop(0)
            g.settle(held, held * f)
        assert g.spent_usd + g.reserved_usd <= cap + 1e-12
    for held, f in pending:
        g.settle(held, held * f)
    assert g.spent_usd <= cap + 1e-12
