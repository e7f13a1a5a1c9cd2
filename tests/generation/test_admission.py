"""The pure controllers of the engine, in simulated time: admission, the books, congestion, the policy table."""
import heapq
import math
import random

import numpy as np
import pytest

from eagledata.generation.money.account import AccountReading, Books
from eagledata.generation.money.admission import Admission, AgeModel, bernstein_margin
from eagledata.generation.policy import retry_delay, rule
from eagledata.generation.realtime.congestion import Congestion, ProviderCooldown
from eagledata.openrouter import Kind, Outcome

BOUND = 1.0  # a request's worst case; answers cost ~1/19 of it on average, heavy-tailed


def draw(rng: np.random.Generator) -> tuple[float, float]:
    """(cost, latency): latency grows with the answer, as generation time does."""
    cost = min(BOUND, float(rng.lognormal(math.log(0.035), 0.9)))
    return cost, 2.0 + 600.0 * cost


def prior(n: int = 2000) -> list[float]:
    rng = np.random.default_rng(99)
    return [draw(rng)[0] * 1.5 for _ in range(n)]  # a pessimistic guess, as the budget model's would be


def simulate(mode: str, seed: int, limit: float, slots: int, tick: float = 2.0, failures: float = 0.0):
    """Keep `slots` requests in flight while admission allows; returns (charged, in-flight samples by spent).
    A share `failures` of attempts end at once, unbilled (429s, 502s)."""
    rng = np.random.default_rng(seed)
    adm = Admission(AgeModel(prior()), mode=mode)
    ends: list[tuple[float, int, float]] = []
    t = spent = 0.0
    next_tick = tick
    samples = []
    while True:
        while len(adm.flights) < slots and adm.fits(BOUND, spent, limit):
            cost, latency = (0.0, 0.05) if rng.random() < failures else draw(rng)
            heapq.heappush(ends, (t + latency, adm.start(t, BOUND), cost))
        if not ends:
            return spent, samples
        if ends[0][0] <= next_tick:
            t, ticket, cost = heapq.heappop(ends)
            spent += cost
            adm.end(ticket, t, cost)
        else:
            t = next_tick
            next_tick += tick
            adm.refresh(t)
            samples.append((spent, len(adm.flights)))


def test_in_flight_requests_are_booked_at_their_age_not_the_mean():
    """Long answers stay in flight longer: the plain mean under-books what is in flight about twofold."""
    rng = np.random.default_rng(1)
    model = AgeModel(prior())
    ends, flights, t = [], {}, 0.0
    for i in range(300):
        cost, latency = draw(rng)
        heapq.heappush(ends, (latency, i))
        flights[i] = (0.0, cost)
    ratios, naive = [], []
    n = 300
    while t < 3000:
        t, i = heapq.heappop(ends)
        start, cost = flights.pop(i)
        model.observe(t - start, cost)
        cost, latency = draw(rng)
        heapq.heappush(ends, (t + latency, n))
        flights[n] = (t, cost)
        n += 1
        if model.events > 2000 and model.events % 500 == 0:
            ages = np.array([t - s for s, _ in flights.values()])
            model.fit(ages)
            means, _ = model.moments(ages, np.full(ages.size, BOUND))
            truth = sum(c for _, c in flights.values())
            ratios.append(means.sum() / truth)
            naive.append(len(flights) * float(np.mean(model.sizes)) / truth)
    assert 0.85 < float(np.mean(ratios)) < 1.2, ratios
    assert float(np.mean(naive)) < 0.7, naive


@pytest.mark.parametrize("seed", range(3))
def test_portfolio_never_overshoots_and_spends_at_full_concurrency(seed):
    limit, slots = 400.0, 300  # in flight: ~$30 expected (length-biased), a $400 budget
    charged, samples = simulate("portfolio", seed, limit, slots)
    assert charged <= limit
    assert charged >= 0.97 * limit
    until_90 = [n for spent, n in samples if spent < 0.9 * limit]
    assert np.mean(until_90) >= 0.95 * slots


@pytest.mark.parametrize("seed", range(3))
def test_no_overshoot_when_money_is_short_and_failures_come_back_first(seed):
    """2,000 slots on $10: the first answers are free failures and short ones, which must not make a new
    request look cheap (every request in flight is censored data, not just the one being admitted)."""
    charged, _ = simulate("portfolio", seed, 10.0, 2000, tick=0.5, failures=0.1)
    assert 0.8 * 10.0 <= charged <= 10.0


def test_first_free_failures_do_not_make_a_new_request_look_free():
    """The requests still in flight are censored data: ten quick unbilled failures among a hundred say little
    about what the next request costs."""
    adm = Admission(AgeModel(prior()))
    tickets = [adm.start(0.0, BOUND) for _ in range(100)]
    for ticket in tickets[:10]:
        adm.end(ticket, 0.05, 0.0)
    adm.refresh(0.5)
    new_mean, _ = adm.model.new_request(BOUND)
    assert new_mean >= 0.8 * float(np.mean(prior()))


def test_strict_commits_every_worst_case():
    charged, samples = simulate("strict", 0, 20.0, 300, tick=20.0)
    assert charged <= 20.0 and charged >= 20.0 - BOUND
    assert max(n for _, n in samples) <= 20  # never more than limit / worst case in flight


def test_one_request_with_nothing_in_flight_commits_its_worst_case():
    adm = Admission(AgeModel(prior()))
    assert adm.commitment(BOUND) == pytest.approx(BOUND)
    assert adm.fits(BOUND, spent=0.0, limit=BOUND) and not adm.fits(BOUND, spent=0.01, limit=BOUND)


@pytest.mark.parametrize("in_flight", [0, 1, 3, 50])
def test_portfolio_never_admits_less_than_strict(in_flight):
    """Whatever the estimates say, a request that fits every worst case in flight plus its own is admitted."""
    adm = Admission(AgeModel([BOUND] * 100))  # a prior that says every answer costs its bound
    for _ in range(in_flight):
        adm.start(0.0, BOUND)
    adm.refresh(1.0)
    limit = (in_flight + 1) * BOUND
    assert adm.fits(BOUND, spent=0.0, limit=limit) and not adm.fits(BOUND, spent=1e-9, limit=limit)


def test_a_money_stop_waits_for_the_reading_that_settles_provisional_bookings():
    books = Books(lag_s=2.0)
    books.read(AccountReading(0.0, usage_usd=1.0, balance_usd=10.0))
    assert books.pending_reconciliation() is None
    books.book(5.0, 0.1, provisional=True)
    books.book(6.0, 0.02)
    books.book(7.0, 0.1, provisional=True)
    assert books.pending_reconciliation() == 9.0  # the newest provisional booking + the lag
    books.read(AccountReading(8.0, usage_usd=1.05, balance_usd=9.95))  # too early for the one at 7.0
    assert books.pending_reconciliation() == 9.0
    books.read(AccountReading(9.5, usage_usd=1.07, balance_usd=9.93))
    assert books.pending_reconciliation() is None and books.spent() == pytest.approx(0.07)
    blind = Books(lag_s=2.0)  # readings without usage cannot settle anything: never wait for them
    blind.read(AccountReading(0.0, usage_usd=None, balance_usd=10.0))
    blind.book(1.0, 0.1, provisional=True)
    assert blind.pending_reconciliation() is None


def test_a_reading_under_way_settles_nothing_until_it_comes_back():
    """The ticker starts an account reading and does not wait for it (engine `_reading`). While it is under way, a
    request that no longer fits must wait, not stop the run on books that still hold provisional bookings at their
    bounds: under load the reading took seconds, and a fresh `make test` stopped a run at its cap with the account
    charged 0.55 of it. Planted: settling at the reading's start (the old `_read_at`) stops here."""
    import asyncio

    from eagledata.generation.money.ledger import Ledger
    from eagledata.openrouter.client import Account

    async def go() -> None:
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        readings = [Account(0.0, 10.0)]

        async def reader(client):
            return readings.pop(0) if readings else await answer

        ledger = Ledger(Admission(AgeModel(prior())), Books(lag_s=1.0), paid=True, max_spend_usd=2.0,
                        reserve_usd=0.0, concurrency=4, refresh_s=60.0, reader=reader)
        await ledger.read(None, 0.0, strict=True)
        ticket = ledger.admit(BOUND, 1.0)
        assert isinstance(ticket, int)
        ledger.settle(ticket, rule(Outcome(Kind.RETRY, "connection", None, "lost after billing")), None, BOUND,
                      2.0)  # billed, never read: booked at its bound
        assert ledger.admit(1.5, 2.5) is None  # does not fit; the reading that settles it is due at 3.0
        assert ledger.reading_due(3.5)
        under_way = asyncio.ensure_future(ledger.read(None, 3.5))
        await asyncio.sleep(0)  # the reading has started and waits for the service
        assert ledger.admit(1.5, 3.6) is None  # no stop on the books while the reading is out
        answer.set_result(Account(0.05, 9.95))  # the account charged 0.05 for the lost answer
        await under_way
        assert ledger.books.spent() == pytest.approx(0.05)
        assert isinstance(ledger.admit(1.5, 3.7), int)  # the money was there all along

    asyncio.run(go())


def test_usage_nobody_in_the_run_booked_is_foreign():
    books = Books(lag_s=0.0)
    books.read(AccountReading(0.0, usage_usd=5.0, balance_usd=20.0))
    books.book(1.0, 1.0)
    books.book(1.5, 0.3, provisional=True)  # booked at its bound: it may have cost less, never more
    books.read(AccountReading(2.0, usage_usd=6.2, balance_usd=18.8))
    assert books.foreign_usd == 0.0  # 1.2 charged ≤ 1.3 booked
    books.read(AccountReading(3.0, usage_usd=8.3, balance_usd=16.7))
    assert books.foreign_usd == pytest.approx(2.0)  # 3.3 charged, 1.3 of it ours


def test_bernstein_margin_solves_the_tail_bound():
    v, m, p = 0.37, 2.0, 1e-6
    t = bernstein_margin(v, m, math.log(1 / p))
    assert math.exp(-t * t / (2 * v + 2 * m * t / 3)) == pytest.approx(p, rel=1e-9)


def test_provisional_bookings_are_replaced_by_the_account():
    books = Books(lag_s=1.0)
    books.read(AccountReading(0.0, usage_usd=10.0, balance_usd=50.0))
    books.book(1.0, 0.2)
    books.book(2.0, 1.0, provisional=True)  # a cut answer, booked at its worst case
    assert books.spent() == pytest.approx(1.2)
    books.read(AccountReading(5.0, usage_usd=10.25, balance_usd=49.75))  # it cost 0.05 in truth
    assert books.charged_usd == pytest.approx(0.25) and books.spent() == pytest.approx(0.25)
    books.book(5.6, 0.1)
    assert books.spent() == pytest.approx(0.35)
    # The reading may lag: what was booked within lag_s before it counts again (never under-booked).
    books.book(6.0, 0.3)
    books.read(AccountReading(6.5, usage_usd=10.35, balance_usd=49.65))
    assert books.spent() == pytest.approx(0.35 + 0.3 + 0.1)
    assert books.limit(None, reserve_usd=5.0) == pytest.approx(0.35 + 49.65 - 5.0)
    assert books.limit(0.5, reserve_usd=5.0) == 0.5


def test_books_without_a_usage_reading_count_their_own():
    books = Books()
    books.book(0.0, 0.4)
    books.book(0.1, 1.0, provisional=True)
    assert books.spent() == pytest.approx(1.4) and books.charged_usd is None and books.limit(None, 0) == math.inf


def test_background_429s_never_cut_concurrency():
    rng = random.Random(0)
    c = Congestion(2000)
    for i in range(200_000):  # 100 answers/s for 2,000 s, 6% of them 429s
        c.observe(i / 100, rng.random() < 0.06)
    assert c.allowed == 2000 and c.history


def test_congestion_lowers_then_recovers():
    c = Congestion(2000)
    t = 0.0
    for _ in range(6000):  # 60 s of mostly 429s
        t += 0.01
        c.observe(t, random.random() < 0.6)
    low = c.allowed
    assert low < 1000
    for _ in range(20000):
        t += 0.01
        c.observe(t, False)
    assert c.allowed == 2000


def test_a_provider_answering_mostly_429s_cools_off_but_never_all():
    cd = ProviderCooldown(cooldown_s=30)
    for i in range(100):  # noise: 2% 429s on A
        cd.observe(i * 0.05, "A", i % 50 == 0)
    assert cd.cooling(5.0, ["A", "B"]) == []
    for i in range(20):
        cd.observe(5.0 + i * 0.01, "B", True)
    assert cd.cooling(5.5, ["A", "B"]) == ["B"] and cd.cooling(40.0, ["A", "B"]) == []
    for i in range(40):
        cd.observe(6.0 + i * 0.01, "A", True)
    assert cd.cooling(6.5, ["A", "B"]) == []  # everyone is congested: leave routing to OpenRouter


def test_policy_table():
    assert not rule(Outcome(Kind.RETRY, "rate_limit")).counts and rule(Outcome(Kind.RETRY, "rate_limit")).rate_limited
    assert rule(Outcome(Kind.RETRY, "malformed")).cost == "unknown" and rule(Outcome(Kind.RETRY, "bad_gateway")).counts
    rng = random.Random(1)
    ra = Outcome(Kind.RETRY, "rate_limit", 429, retry_after=2.0)
    delays = [retry_delay(ra, 1, 1, base_s=1, cap_s=60, rng=rng) for _ in range(200)]
    assert 2.0 <= min(delays) and max(delays) <= 3.0 and len(set(delays)) > 100  # Retry-After, jittered
    assert 8.0 <= retry_delay(ra, 1, 3, base_s=1, cap_s=60, rng=rng) <= 12.0  # doubled for each 429 in a row
    assert retry_delay(ra, 1, 20, base_s=1, cap_s=60, rng=rng) <= 90.0


def fitted(events: int = 3000, seed: int = 5, **kw) -> Admission:
    """Admission whose estimate has seen `events` finished answers (nothing in flight)."""
    rng = np.random.default_rng(seed)
    adm = Admission(AgeModel(prior()), **kw)
    for _ in range(events):
        cost, latency = draw(rng)
        adm.end(adm.start(0.0, BOUND), latency, cost)
    adm.refresh(0.0)
    return adm


def test_near_the_end_the_money_carries_many_requests_at_the_set_risk():
    """Five worst cases of money left, nothing in flight: Bernstein's margin (~4.6 worst cases at 1e-6) admits what
    strict admits, five; the Chernoff bound on the estimated distribution carries dozens. Checked by sampling: the
    admitted requests overshoot the money no more often than promised."""
    p = 1e-3  # a risk sampling can check
    adm = fitted(overshoot_probability=p)
    left = 5 * BOUND
    n = 0
    while adm.fits(BOUND, spent=0.0, limit=left):
        adm.start(0.0, BOUND)
        n += 1
    assert n >= 40, n  # strict and Bernstein: 5
    rng = np.random.default_rng(11)
    totals = np.minimum(BOUND, rng.lognormal(math.log(0.035), 0.9, (200_000, n))).sum(axis=1)
    assert float(np.mean(totals > left)) <= p
    assert adm.capacity(BOUND, left) == n  # what the money buys with nothing in flight, as admission counts it


def test_no_answer_seen_yet_means_no_more_than_strict():
    """Before any answer the estimate is the prior mixed with a pseudo-answer at the bound of weight 1: all of it."""
    adm = Admission(AgeModel(prior()))
    assert adm.capacity(BOUND, 5 * BOUND) == 5
    assert adm.fits(BOUND, 0.0, BOUND) and not adm.fits(BOUND, 0.001, BOUND)


def test_trickle_is_when_the_money_left_after_what_is_in_flight_buys_too_little():
    adm = fitted()
    for _ in range(30):
        adm.start(0.0, BOUND)
    adm.refresh(1.0)
    in_flight = float(adm._sums[0])
    assert adm.capacity(BOUND, 20 * BOUND) > 200
    assert not adm.trickle(BOUND, 0.0, in_flight + 20 * BOUND, min_requests=100, max_share=1.0)
    assert adm.trickle(BOUND, 0.0, in_flight + 1.5 * BOUND, min_requests=100, max_share=1.0)
    # not while the money left is a large share of the limit (a small budget buys few requests from the start) …
    assert not adm.trickle(BOUND, 0.0, in_flight + 1.5 * BOUND, min_requests=100, max_share=0.02)
    # … nor while the pool is still full (what it will cost leans on the prior's tail: it settles first)
    assert not adm.trickle(BOUND, 0.0, in_flight + 1.5 * BOUND, min_requests=10, max_share=1.0)
    # … nor before the estimate rests on 20 x min_requests answers
    assert not fitted(events=1000).trickle(BOUND, 0.0, 1.5 * BOUND, min_requests=100, max_share=1.0)


def test_hours_of_starts_and_finishes_never_break_the_running_sums(seed=0):
    """Three simulated hours of 2,000-token answers, a sixth of attempts failing at once, 60 slots over two datasets:
    pacing's and admission's running sums (added at start, taken off at finish, recomputed each refresh) stay
    non-negative and equal to what the flights add up to, and the bounds they feed never raise."""
    from eagledata.generation.realtime.pacing import Pacing

    rng = random.Random(seed)
    tokens_prior = list(np.minimum(np.random.default_rng(seed).lognormal(math.log(3000), 0.9, 5000), 32768))
    pace = Pacing(Pacing.lane(n, target=10 ** 12, prompts=10 ** 9, recorded=0, finished=0,
                              prior_tokens=tokens_prior) for n in "AB")
    adm = Admission(AgeModel([t * 2e-6 for t in tokens_prior]))
    bound, ends, t, next_tick, tick = 32768 * 2.8e-6, [], 0.0, 30.0, 30.0  # a refresh every 30 s: drift has room
    while t < 3 * 3600:
        while len(ends) < 60:
            name = pace.order()[0]
            pace.hold(name)
            fault = rng.random() < 0.15
            n = 0 if fault else min(32768, round(rng.lognormvariate(math.log(1800), 1.1)))
            latency = rng.random() * 0.5 if fault else 0.4 * (1.5 + n / 40)
            adm.fits(bound, 0.0, 1e9)
            heapq.heappush(ends, (t + latency, pace.start(name, t), adm.start(t, bound), n))
        if ends[0][0] <= next_tick:
            t, pace_ticket, ticket, n = heapq.heappop(ends)
            pace.end(pace_ticket, t, n, finished=n > 0)
            adm.end(ticket, t, n * 2.2e-6)
            assert all(min(lane._sums) >= 0 and lane.waiting == 0 for lane in pace.lanes.values())
            assert adm._sums.min() >= 0
        else:
            t, next_tick = next_tick, next_tick + tick
            pace.refresh(t)
            adm.refresh(t)
            for lane in pace.lanes.values():
                lane.upper(1)
                assert lane._sums[1] == pytest.approx(sum(f.tokens_var for f in lane.flights.values()), rel=1e-9)
            assert adm._sums[0] == pytest.approx(sum(f.mean for f in adm.flights.values()), rel=1e-9)
