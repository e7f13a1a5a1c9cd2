"""A closed stream's cost read back by its generation id (generation/money/readback.py): booked at its bound,
then at what it cost once the service tells, so the money held at the bound frees up before any account reading
settles it."""
import asyncio

import httpx
import pytest

from eagledata.generation.money.account import AccountReading, Books
from eagledata.generation.money.readback import FIRST_ASK_S, GIVE_UP_S, MAX_GAP_S, Readback
from eagledata.generation.policy import RULES
from eagledata.openrouter.client import GenerationStats


class Service:
    """The generation endpoint: each id unknown for its first `unknown` asks (a 404), then its cost; `broken` ids
    raise a connection error once."""

    def __init__(self, costs: dict[str, float], *, unknown: int = 0, broken: set[str] | None = None):
        self.costs, self.unknown, self.broken = costs, unknown, set(broken or ())
        self.asked: list[str] = []

    async def __call__(self, client, generation_id: str) -> GenerationStats | None:
        self.asked.append(generation_id)
        if generation_id in self.broken:
            self.broken.discard(generation_id)
            raise httpx.ConnectError("reset")
        if self.asked.count(generation_id) <= self.unknown or generation_id not in self.costs:
            return None
        return GenerationStats(generation_id, self.costs[generation_id], True, 10, "Chutes")


def test_a_resolved_booking_counts_at_its_cost_before_any_reading_settles_it():
    books = Books(lag_s=5.0)
    books.read(AccountReading(0.0, usage_usd=1.0, balance_usd=10.0))
    books.book(1.0, 0.02, lane="A")
    held = books.book(2.0, 0.50, provisional=True, lane="B")  # a cut stream at its bound
    assert books.spent() == pytest.approx(0.52) and books.at_bound() == pytest.approx(0.50)
    books.read(AccountReading(3.0, usage_usd=1.0, balance_usd=10.0))  # the account has not billed either yet (lag)
    books.resolve(held, 0.004)
    assert books.spent() == pytest.approx(0.024) and books.at_bound() == 0.0
    assert books.pending_reconciliation() is None  # nothing left for a reading to settle
    assert books.known_by_lane == {"A": pytest.approx(0.02), "B": pytest.approx(0.004)}
    assert books.provisional_usd == pytest.approx(0.0) and books.provisional_by_lane["B"] == pytest.approx(0.0)
    books.resolve(held, 0.004)  # once only
    assert books.known_usd == pytest.approx(0.024)
    # another spender's $0.30 was hidden under the bound; with the truth booked, it shows
    books.read(AccountReading(10.0, usage_usd=1.324, balance_usd=9.676))
    assert books.foreign_usd == pytest.approx(0.30) and books.spent() == pytest.approx(0.324)


def test_a_booking_a_reading_already_covered_moves_from_bound_to_cost_without_counting_twice():
    books = Books(lag_s=1.0)
    books.read(AccountReading(0.0, usage_usd=1.0, balance_usd=10.0))
    held = books.book(1.0, 0.50, provisional=True)
    books.read(AccountReading(5.0, usage_usd=1.004, balance_usd=9.996))  # the reading settled it first
    assert books.spent() == pytest.approx(0.004)
    books.resolve(held, 0.004)
    assert books.spent() == pytest.approx(0.004) and books.known_usd == pytest.approx(0.004)
    assert books.foreign_usd == 0.0


def test_ids_the_service_does_not_know_yet_are_asked_again_then_left_to_the_account():
    books = Books()
    rb = Readback(books, Service({"g1": 0.01, "g2": 0.02}, unknown=2, broken={"g2"}))
    b1, b2, b3 = (books.book(0.0, 0.5, provisional=True) for _ in range(3))
    rb.add("g1", b1, 0.0)
    rb.add("g2", b2, 0.0)
    rb.add("g3", b3, 0.0)  # never known: its stream's answer is lost upstream
    rb.add("g3", b3, 0.0)  # an id is read once
    assert not rb.due(FIRST_ASK_S - 0.01)
    now = FIRST_ASK_S
    reads = []
    while rb.pending and now < GIVE_UP_S + 2 * MAX_GAP_S:
        reads.append(asyncio.run(rb.read(None, now)))
        now = min(c.due for c in rb.pending.values()) if rb.pending else now
    assert sum(reads) == 2 and not rb.pending
    assert rb.reader.asked.count("g1") == 3  # two 404s, then its cost
    assert rb.reader.asked.count("g2") == 3  # a reset, a 404, then its cost
    assert rb.figures() == {"streams": 3, "read": 2, "cancelled": 2, "usd": 0.03, "bound_usd": 1.5, "unread": 1}
    assert books.known_usd == pytest.approx(0.03) and books.provisional_usd == pytest.approx(0.5)
    assert rb.reader.asked.count("g3") < 30  # asked at doubling intervals, not every tick for five minutes


def test_the_ledger_frees_a_cut_streams_bound_as_soon_as_its_cost_is_read(parts):
    p = parts({"A": 10}, max_spend_usd=0.05, budget_mode="strict")
    ledger = p.ledger
    assert ledger.readback is not None
    ledger.readback.reader = Service({"gen-cut": 0.001})
    first, second = ledger.admit(0.02, 0.0), ledger.admit(0.02, 0.0)
    assert isinstance(first, int) and isinstance(second, int) and ledger.admit(0.02, 0.0) is None
    ledger.settle(first, RULES["cancelled"], None, 0.02, 1.0, "gen-cut")  # closed mid-stream: at its bound
    ledger.settle(second, RULES["cancelled"], None, 0.02, 1.0)  # never named by the service: the account's to settle
    assert ledger.books.spent() == pytest.approx(0.04) and ledger.admit(0.02, 1.0) is None
    asyncio.run(ledger.read_back(None, 1.0 + FIRST_ASK_S))
    assert ledger.books.spent() == pytest.approx(0.021)
    assert isinstance(ledger.admit(0.02, 2.0), int)  # the money the bound held is back
    assert ledger.readback.figures()["streams"] == 1
