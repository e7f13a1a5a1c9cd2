"""The engine's own scheduling, in virtual time (clock.run_virtual): a transport that answers after a simulated
latency, an account that sums what it billed. Minutes of simulated answers run in well under a second, with the same
decisions every time, and no server."""
import asyncio
import dataclasses
import json

import pytest

from eagledata.generation import GenerateConfig, Seams
from eagledata.generation.clock import InlineExecutor, run_virtual
from eagledata.generation.realtime.engine import Run
from eagledata.openrouter import Account, Completion, Kind, Outcome
from eagledata.records import Answer, Usage
from eagledata.text import prompt_ids
from tests.helpers.parts import PRICE_IN, PRICE_OUT, datasets, endpoint, routing


class Simulated:
    """Answers of `tokens` output tokens (a cycle), each after `tokens / rate` virtual seconds; bills what it served."""

    def __init__(self, tok, tokens=(40, 80, 400), rate=20.0):
        self.tok, self.tokens, self.rate = tok, tokens, rate
        self.sent = self.in_flight = self.most_in_flight = 0
        self.billed = 0.0
        self.order: list[str] = []

    async def handle_request(self, client, body, state=None):
        n = self.tokens[self.sent % len(self.tokens)]
        self.sent += 1
        self.order.append(body["messages"][-1]["content"])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(n / self.rate)
        finally:
            self.in_flight -= 1
        content = " ".join(["word"] * (n - 3))  # a few tokens of reasoning, the rest content (about a token a word)
        answer = Answer("ok so", content, "stop")
        out = len(self.tok.encode_ordinary("ok so")) + 1 + len(self.tok.encode_ordinary(content)) + 1
        cost = (20 * PRICE_IN + out * PRICE_OUT) / 1e6
        self.billed += cost
        return Outcome(Kind.OK, "ok", 200, completion=Completion(
            answer=answer, provider="Sim", model="sim", generation_id=f"gen-{self.sent}",
            usage=Usage(prompt_tokens=20, completion_tokens=out, reasoning_tokens=3, cost=cost)))

    async def account(self, client):
        return Account(self.billed, 10.0 - self.billed)


def run(tmp_path, sim, file, *, during=None, view=None, decision=None, **kw):
    cfg = GenerateConfig(**{"dataset": "all", "datasets_file": str(file), "base_url": "http://127.0.0.1:9/api/v1",
                            "output_dir": str(tmp_path / "out"), "params_dir": str(tmp_path / "params"),
                            "concurrency": 8, "max_tokens": 1000, "progress": False, "reserve_usd": 0.0,
                            "prior_output_median_tokens": 150, **kw})

    async def main():
        seams = Seams(transport=sim, account=sim.account, routing=decision or routing(), executor=InlineExecutor())
        r = await Run.start(cfg, None, api_key="k", seams=seams)
        try:
            task = asyncio.ensure_future(r.execute([None] * cfg.concurrency, view=view))
            if during is not None:
                await during(r)
            return await task, r
        finally:
            r.close()

    return run_virtual(main())


def test_the_pool_is_kept_full_and_every_prompt_recorded_once(tmp_path, tok, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 30, "B": 30}))
    assert summary["stop_reason"] == "completed" and summary["records"] == 60 and sim.sent == 60
    assert sim.most_in_flight == 8  # every slot busy while work was left
    # one pool over two datasets without targets: they take turns by prompts taken (A, B, A, B, ...)
    firsts = [o.split()[0] for o in sim.order[:8]]
    assert sorted(firsts) == ["A"] * 4 + ["B"] * 4
    assert summary["run"]["charged_usd"] == pytest.approx(sim.billed, rel=1e-9)
    for name in ("A", "B"):
        ids = [json.loads(line)["id"] for line in (tmp_path / "out/datasets" / name / "records.jsonl").open()]
        assert sorted(ids) == [f"{name}-{i:04d}" for i in range(30)]


def test_a_target_stops_its_dataset_and_the_other_goes_on(tmp_path, tok, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 200, "B": 40}, {"A": 3000}))
    a, b = summary["datasets"]["A"], summary["datasets"]["B"]
    assert a["stop_reason"] == "target_reached" and b["stop_reason"] == "completed"
    assert 3000 <= a["output_tokens"] <= 3000 * 1.05 + 400  # at most one long answer past the promise
    assert b["records"] == 40 and a["records"] < 200
    timing = summary["run"]["timing"]  # where the wait went: A's target, then B's last answer, then the summaries
    assert timing["last_target_s"] == pytest.approx(a["run"]["target_met_s"], abs=0.05)
    assert timing["last_target_s"] <= timing["slots_end_s"] <= summary["wall_s"]
    assert timing["before_start_s"] > 0 and b["run"]["timing"] == timing  # the process's age (Linux: /proc)


def test_a_money_stop_never_spends_over_the_cap(tmp_path, tok, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 500}), max_spend_usd=0.02, budget_mode="strict")
    assert summary["stop_reason"] == "max_spend_reached"
    assert sim.billed <= 0.02 and summary["run"]["charged_usd"] == pytest.approx(sim.billed)
    assert summary["run"]["money_left"]["why"]
    assert 0 < summary["records"] < 500


def test_stragglers_past_the_wait_are_abandoned_and_booked(tmp_path, tok, monkeypatch):
    """Every target met with answers of 500 s still in flight (JSON bodies: a stream would be cut, kept as far as it
    got, FINISH_BEFORE_CUT_S later): they get straggler_wait_s, then are cut off, booked at their bound
    (provisionally) and left for the next run."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok, tokens=(10_000,) + (300,) * 9)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 100}, {"A": 2000}), straggler_wait_s=30, concurrency=40,
                     prior_output_median_tokens=20, stream=False)
    assert summary["stop_reason"] == "target_reached"
    abandoned = summary["run"]["abandoned"]
    assert abandoned == 4 and summary["wall_s"] == pytest.approx(15 + 30, abs=1)  # met at 15 s, then the wait
    bound = r.parts.requester.worst.cost(len(prompt_ids(tok, [{"role": "user", "content": "A question 10"}])), 1000)
    assert r.ledger.books.provisional_usd == pytest.approx(abandoned * bound, rel=0.01)  # booked, to be read
    assert len(r.ledger.admission.flights) == 0 and not any(lane.flights for lane in r.dispatcher.pacing.lanes.values())
    assert summary["remaining"] == 100 - summary["records"]


def test_a_signal_drains_then_a_second_abandons(tmp_path, tok, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok, tokens=(2000,), rate=10.0)  # 200 s answers

    async def signals(r):
        await asyncio.sleep(50)
        r._on_signal()  # as SIGINT does: stop issuing, let the 8 in flight finish
        await asyncio.sleep(10)
        assert sim.in_flight == 8
        r._on_signal()  # a second: abandon them

    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 50}), during=signals, drain_timeout_s=600,
                     stream=False)  # JSON answers: the drain waits for them (a stream would be cut: the test above)
    assert summary["stop_reason"] == "interrupted" and summary["records"] == 0 and sim.sent == 8
    assert 55 < summary["wall_s"] < 70  # the second signal, not the drain's 600 s, ended it
    assert len(r.ledger.admission.flights) == 0
    assert summary["remaining"] == 50


class Streamed(Simulated):
    """Simulated answers, streamed: the first chunk names the provider (odd sends 'Cancels', even 'Bills'); counts
    the streams closed before their end."""

    def __init__(self, tok, **kw):
        super().__init__(tok, **kw)
        self.closed: dict[str, int] = {"Cancels": 0, "Bills": 0}

    async def handle_request(self, client, body, state=None):
        provider = "Cancels" if self.sent % 2 else "Bills"
        assert body["stream"] is True and state is not None
        state.provider = provider
        try:
            outcome = await super().handle_request(client, body, state)
        except asyncio.CancelledError:
            self.closed[provider] += 1
            raise
        return dataclasses.replace(outcome, completion=dataclasses.replace(outcome.completion, provider=provider))


def test_a_signal_closes_at_once_the_streams_whose_endpoints_stop_billing_and_the_rest_moments_later(
        tmp_path, tok, monkeypatch):
    """Streamed, 8 in flight on two endpoints: the first signal closes at once the 4 streams on the one with stream
    cancellation (what they would still send is not paid for) and gives the 4 on the one that bills whole answers
    FINISH_BEFORE_CUT_S to end, then closes them too: the run ends seconds after the signal, not at their end (200 s)
    or the drain's (50 + 600 s). Each closed stream keeps what it delivered as a cut sample; these delivered nothing,
    so their prompts stay to do."""
    from eagledata.generation.realtime.engine import FINISH_BEFORE_CUT_S

    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Streamed(tok, tokens=(2000,), rate=10.0)  # 200 s answers
    cancels, bills = dataclasses.replace(endpoint("Cancels"), stream_cancellation=True), endpoint("Bills")
    seen = {}

    async def signal(r):
        await asyncio.sleep(50)
        r._on_signal()
        await asyncio.sleep(1)
        seen.update(sim.closed)

    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 50}), during=signal, drain_timeout_s=600, stream=True,
                     decision=routing(cancels, bills))
    assert summary["stop_reason"] == "interrupted" and sim.sent == 8
    assert seen == {"Cancels": 4, "Bills": 0} and sim.closed == {"Cancels": 4, "Bills": 4}
    assert summary["wall_s"] == pytest.approx(50 + FINISH_BEFORE_CUT_S, abs=1)
    assert summary["records"] == 0 and summary["remaining"] == 50 and len(r.ledger.admission.flights) == 0


def test_work_waiting_for_money_when_its_dataset_meets_its_target_is_given_back_not_sent(tmp_path, tok, monkeypatch):
    """Issue 53 (15): at the six-dataset job's cut, 47 slots held their datasets' work waiting for money (the cut
    streams booked at their bounds until read back); once it freed they sent it: one dataset ended at 1.020 of its
    target and the run 20 s after its last target, waiting for those answers. Work whose dataset met its target while
    it waited is given back: still to do, never sent, its pacing and money books as if never taken."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    cfg = GenerateConfig(dataset="all", datasets_file=str(datasets(tmp_path, {"A": 20, "B": 20}, {"A": 3000})),
                         base_url="http://127.0.0.1:9/api/v1", output_dir=str(tmp_path / "out"),
                         params_dir=str(tmp_path / "params"), concurrency=8, max_tokens=1000, progress=False,
                         reserve_usd=0.0, prior_output_median_tokens=150)

    async def main():
        r = await Run.start(cfg, None, api_key="k", seams=Seams(transport=sim, account=sim.account, routing=routing(),
                                                                 executor=InlineExecutor()))
        try:
            taken = []
            while len({w.lane.name for w in taken}) < 2:
                taken.append(r.dispatcher.take(r.clock.now()))
            a = next(w for w in taken if w.lane.name == "A")
            b = next(w for w in taken if w.lane.name == "B")
            a.lane.target_met_s = 1.0  # another slot's answer brought A to its target while these waited
            got = [await r.slots._admit(a), await r.slots._admit(b)]
            for w in taken:
                r.dispatcher.release(w, r.clock.now())
            return got, r
        finally:
            r.close()

    (ticket_a, ticket_b), r = run_virtual(main())
    assert ticket_a is None and ticket_b is not None  # A's work given back; B's, short of its target, goes out
    a, b = r.dispatcher.pacing.lanes["A"], r.dispatcher.pacing.lanes["B"]
    assert a.waiting == 0 and not a.flights and len(b.flights) == 1 and r.dispatcher.holding == 0



def test_status_lines_come_every_status_interval_on_the_runs_clock(tmp_path, tok, monkeypatch):
    """No widget frontend: a status line through logging every `status_interval_s` (10 s, the default) on a fixed
    schedule, at the first tick past each, on the run's own clock (here virtual: each line at its exact time,
    whatever the machine's load), then the final line."""
    import logging

    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    lines: list[tuple[float, str]] = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append((asyncio.get_running_loop().time(), record.getMessage()))

    handler, logger = Lines(), logging.getLogger("eagledata.generate")
    logger.addHandler(handler)
    try:
        summary, r = run(tmp_path, Simulated(tok), datasets(tmp_path, {"A": 60}), progress=True)
    finally:
        logger.removeHandler(handler)
    status = [(t, text) for t, text in lines if text.startswith("A: ")]
    interval, end = r.cfg.status_interval_s, summary["run"]["timing"]["slots_end_s"]
    assert interval == 10.0 and end > 5 * interval, end  # the run lasts several intervals
    *running, (t_final, final) = status
    # one at the first tick (every TICK_S = 0.5 s) past each multiple of the interval while the slots ran, no other
    assert [int(t // interval) for t, _ in running] == list(range(1, int(end // interval) + 1)), running
    assert all(t % interval <= 0.5 + 1e-9 for t, _ in running), running
    for _, text in running:
        assert "/60 prompts (" in text and " output tok/s | charged $" in text and " | ETA " in text
    assert final.startswith("A: 60/60 prompts (100.0%)") and "ended after" in final
    assert t_final == pytest.approx(summary["wall_s"], abs=0.01)


# -- where the pool's slots are (realtime/pool.py, summary.json's run.pool) ------------------------------------------
def pool_of(summary, key="whole_run"):
    """The pool's figures: mean slots per state over `key`, its seconds, and the timeline's first window."""
    pool = summary["run"]["pool"]
    cols = pool["timeline_columns"]
    first = dict(zip(cols, pool["timeline"][0]))
    return pool[key], first


def test_the_pool_counts_every_slot_second_in_flight_exactly_once(tmp_path, tok, monkeypatch):
    """30 answers of 2, 4 and 20 s (a cycle) over 8 slots, no target: the slot-seconds in flight are exactly the
    answers' times (tokenizing takes no virtual time), the states add up to the 8 slots, and what is left is idle with
    nothing to take (the prompts all taken, the last answers still coming)."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 30}))
    assert summary["records"] == 30
    whole, first = pool_of(summary)
    seconds, mean = whole["seconds"], whole["mean"]
    assert mean["in_flight"] * seconds == pytest.approx(10 * (2 + 4 + 20), rel=1e-3)
    assert sum(mean.values()) == pytest.approx(8, abs=0.02)
    assert mean["idle_done"] * seconds == pytest.approx(8 * seconds - 260, rel=1e-2)
    assert mean["money"] == mean["idle_paced"] == mean["idle_retry"] == mean["idle_turn"] == 0
    assert first["in_flight"] == 8 and summary["run"]["pool"]["until_last_target"] is None  # no target
    assert seconds == pytest.approx(summary["run"]["timing"]["slots_end_s"], abs=0.01)


def test_slots_waiting_for_money_are_counted_as_such(tmp_path, tok, monkeypatch):
    """Strict budget, a cap three worst cases wide: 3 of 8 slots in flight, the other 5 hold tokenized work waiting
    for admission from the first moment (not idle, not preparing)."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    bound = (20 * 0.5 + 1000 * 2.0) / 1e6  # a prompt of ~20 tokens, max_tokens 1000 at tests/helpers' prices
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 40}), max_spend_usd=3.2 * bound, budget_mode="strict")
    whole, first = pool_of(summary)
    assert first["in_flight"] == 3 and first["money"] == 5
    assert whole["mean"]["money"] > 1 and whole["mean"]["in_flight"] <= 3


def test_slots_with_only_next_turns_to_come_are_idle_for_the_turn(tmp_path, tok, monkeypatch):
    """4 conversations of two turns on 8 slots: while the first turns are in flight the other 4 slots have nothing to
    take but the second turns, which wait for those answers."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 4}, asks=2))
    assert summary["records"] == 8
    whole, first = pool_of(summary)
    assert first["in_flight"] == 4 and first["idle_turn"] == 4
    assert whole["mean"]["idle_turn"] > 0 and whole["mean"]["idle_paced"] == 0


class Refusing(Simulated):
    """Its first `refuse` requests are answered 502 with Retry-After `after` s, the rest as Simulated."""

    def __init__(self, tok, refuse, after, **kw):
        super().__init__(tok, **kw)
        self.refuse, self.after, self.calls = refuse, after, 0

    async def handle_request(self, client, body, state=None):
        self.calls += 1
        if self.calls <= self.refuse:
            return Outcome(Kind.RETRY, "bad_gateway", 502, "upstream error", retry_after=self.after)
        return await super().handle_request(client, body, state)


def test_slots_with_only_retries_not_due_are_idle_for_the_retry(tmp_path, tok, monkeypatch):
    """2 prompts on 4 slots, both refused at once with Retry-After 10 s: every slot waits for the retries (10-15 s),
    counted as such."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Refusing(tok, refuse=2, after=10.0)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 2}), concurrency=4)
    assert summary["records"] == 2
    whole, first = pool_of(summary)
    assert first["idle_retry"] == 4
    assert whole["mean"]["idle_retry"] * whole["seconds"] >= 4 * 10


def test_slots_pacing_holds_back_are_idle_paced_until_the_target(tmp_path, tok, monkeypatch):
    """One dataset with a target: near it pacing holds the dataset back (its bound), so slots are idle paced before
    the target, and nothing is counted done before it (the dataset still has prompts)."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = Simulated(tok)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 200}, {"A": 3000}), stream=False)
    until, _ = pool_of(summary, "until_last_target")
    assert summary["stop_reason"] == "target_reached"
    assert until["seconds"] == pytest.approx(summary["run"]["timing"]["last_target_s"], abs=0.01)
    assert until["mean"]["idle_paced"] > 0 and until["mean"]["idle_done"] == 0
    assert sum(until["mean"].values()) == pytest.approx(8, abs=0.02)


class SlowAccount(Simulated):
    """Simulated answers; the account answers each reading `slow_s` late (a service under load)."""

    def __init__(self, tok, slow_s, **kw):
        super().__init__(tok, **kw)
        self.slow_s, self.readings = slow_s, 0

    async def account(self, client):
        self.readings += 1
        if self.readings > 1:  # the first, at the start, before any request
            await asyncio.sleep(self.slow_s)
        return await super().account(client)


def test_a_slow_account_reading_does_not_hold_the_ticker(tmp_path, tok, monkeypatch):
    """Issue 60: the account was read inside the ticker, so a reading that took seconds (1-3 s in the job bench under
    load, once 45 s) held pacing's refresh, the cuts, the wake-ups and the timeline's samples that long. The readings
    now go apart: the ticks keep their pace through a reading of 30 s."""
    from eagledata.generation.realtime.engine import TICK_S

    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    sim = SlowAccount(tok, slow_s=30.0)
    summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 40}), account_refresh_s=5.0)
    assert summary["records"] == 40 and sim.readings >= 3
    end = summary["run"]["timing"]["slots_end_s"]  # (then the last reading, 30 s, and the summaries)
    t = [row[0] for row in summary["timeline"] if row[0] <= end]
    assert end > 40 and max(b - a for a, b in zip(t, t[1:])) <= TICK_S + 1e-6
