"""The reporter without a server: the snapshot (live panel, status line) and the summaries (each dataset's
summary.json, the run's) read off the parts after a few settled attempts, and nothing they read is changed by
reading it."""
import json
from collections import Counter

import pytest

from eagledata.openrouter import Kind, Outcome
from eagledata.summaries import CONSISTENT
from tests.helpers.parts import PRICE_OUT, answered, endpoint, routing, send

BAD_REQUEST = Outcome(Kind.FAILED, "bad_request", 400, "prompt too long")
PROVIDER = {"sort": "price"}


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def settled(parts, tok):
    """A (2 prompts, no target) and B (3 prompts, a target of 5 output tokens): B's first answer meets its target,
    A's first prompt fails for good and its second is answered; the run has nothing left to do."""
    p = parts({"A": 2, "B": 3}, targets={"B": 5}, routing=routing(endpoint("Cheap"), endpoint("Dear"),
                                                                  provider=PROVIDER),
              max_spend_usd=1.0, prior_output_median_tokens=20)
    works = [send(p, 0.0, answered(tok, "the answer of B", provider="Cheap", cost=0.001), latency_s=2.0),
             send(p, 3.0, BAD_REQUEST, latency_s=0.5),
             send(p, 4.0, answered(tok, "an answer of A", provider="Dear", cost=0.002), latency_s=3.0)]
    assert [w.turn.id for w in works] == ["B-0000", "A-0000", "A-0001"]  # B furthest behind its target first
    assert p.dispatcher.stop.reason == "completed"
    tokens = {name: sum(len(r["output_ids"]) for r in lines(lane.store.files.records))
              for name, lane in p.dispatcher.lanes.items()}
    assert tokens["B"] >= 5 and tokens["A"] > 0
    return p, tokens


def test_the_snapshot_reads_counts_tokens_spend_and_each_dataset(settled):
    p, tokens = settled
    snap = p.reporter.snapshot(10.0)
    assert (snap.t, snap.in_flight, snap.limit, snap.cap, snap.money_limit, snap.usable, snap.foreign) == \
        (10.0, 0, 4, 1.0, 1.0, float("inf"), 0.0)
    assert snap.spent == pytest.approx(0.003) and snap.stop_reason is None
    assert snap.suspects == () and snap.verdicts == {"Cheap": CONSISTENT, "Dear": CONSISTENT}
    assert snap.planned_usd_per_m is None  # B has a target and no budget plan
    assert snap.stats.counts == Counter({"recorded": 2, "failed": 1})
    assert snap.stats.errors == Counter({"bad_request": 1})
    assert snap.stats.output_tokens == tokens["A"] + tokens["B"] and snap.stats.booked_usd == pytest.approx(0.003)
    assert [(d.name, d.done, d.total_prompts, d.tokens, d.target, d.in_flight) for d in snap.datasets] == \
        [("A", 2, 2, tokens["A"], None, 0), ("B", 1, 3, tokens["B"], 5, 0)]
    assert [d.share for d in snap.datasets] == [0.5, 1.0]  # A: one prompt answered, one failed for good
    assert p.reporter.snapshot(10.0, final=True).stop_reason == "completed"


def test_each_datasets_summary_and_the_runs(settled):
    p, tokens = settled
    per, run = p.reporter.summaries(10.0)
    a, b = per["A"], per["B"]
    assert {k: a[k] for k in ("dataset", "stop_reason", "fatal_error", "output_tokens", "spend_usd", "records",
                              "failures", "prompts", "remaining", "open_conversations", "target_output_tokens")} == \
        {"dataset": "A", "stop_reason": "completed", "fatal_error": None, "output_tokens": tokens["A"],
         "spend_usd": 0.002, "records": 1, "failures": 1, "prompts": 2, "remaining": 0, "open_conversations": 0,
         "target_output_tokens": None}
    assert (b["stop_reason"], b["records"], b["failures"], b["remaining"], b["target_output_tokens"],
            b["run"]["target_met_s"]) == ("target_reached", 1, 0, 2, 5, 2.0)  # met when its answer came, at 2 s
    assert {k: a["run"][k] for k in ("recorded", "failed", "retried", "errors", "providers", "charged_usd",
                                     "recorded_usd", "spend_usd", "shared_with", "provider_health")} == \
        {"recorded": 1, "failed": 1, "retried": 0, "errors": {"bad_request": 1}, "providers": {"Dear": 1},
         "charged_usd": None, "recorded_usd": 0.002, "spend_usd": 0.002, "shared_with": ["B"],
         "provider_health": {
             "-": {"attempts": 1, "answers": 0, "errors": 1, "rate_limited": 0, "median_latency_s": 0.5},
             "Dear": {"attempts": 1, "answers": 1, "errors": 0, "rate_limited": 0, "median_latency_s": 3.0}}}
    assert b["fidelity"]["providers"]["Cheap"]["answers"] == 1 and "Dear" not in b["fidelity"]["providers"]
    total = tokens["A"] + tokens["B"]
    assert {k: run[k] for k in ("stop_reason", "fatal_error", "records", "failures", "prompts", "remaining",
                                "output_tokens", "spend_usd", "target_output_tokens", "wall_s")} == \
        {"stop_reason": "completed", "fatal_error": None, "records": 2, "failures": 1, "prompts": 5, "remaining": 2,
         "output_tokens": total, "spend_usd": 0.003, "target_output_tokens": None, "wall_s": 10.0}
    assert list(run["datasets"]) == ["A", "B"] and run["datasets"]["A"] is a
    figures = {k: run["run"][k] for k in ("recorded", "failed", "charged_usd", "wasted_usd", "recorded_usd",
                                          "spend_usd", "output_tokens_per_s", "usd_per_m_output", "concurrency",
                                          "max_spend_usd", "cheapest_eligible_usd_per_m_output")}
    assert figures == {"recorded": 2, "failed": 1, "charged_usd": None, "wasted_usd": None, "recorded_usd": 0.003,
                       "spend_usd": 0.003, "output_tokens_per_s": round(total / 10.0, 1),
                       "usd_per_m_output": round(1e6 * 0.003 / total, 4), "concurrency": 4, "max_spend_usd": 1.0,
                       "cheapest_eligible_usd_per_m_output": PRICE_OUT}
    assert run["routing"] == {"provider": PROVIDER, "source": "test"}
    assert sorted(run["fidelity"]["providers"]) == ["Cheap", "Dear"]


def test_one_dataset_named_alone_is_the_runs_summary(parts, tok):
    p = parts({"A": 1}, dataset="A")
    send(p, 0.0, answered(tok, cost=0.004), latency_s=1.0)
    per, run = p.reporter.summaries(5.0)
    assert run is per["A"] and run["dataset"] == "A" and "shared_with" not in run["run"]
    assert (run["stop_reason"], run["records"], run["spend_usd"], run["run"]["spend_usd"]) == \
        ("completed", 1, 0.004, 0.004)


def fingerprint(p) -> str:
    """Everything the reporter reads, as text: the datasets' counters, stores and files, the money, the stop state,
    the fidelity books, congestion."""
    lanes = {}
    for name, lane in p.dispatcher.lanes.items():
        s, store = lane.stats, lane.store
        lanes[name] = {
            "stats": [dict(s.counts), dict(s.errors), dict(s.providers), dict(s.finish), dict(s.turns),
                      dict(s.tool_calls), {n: ps.figures() for n, ps in s.by_provider.items()}, s.output_tokens,
                      s.prompt_tokens, s.recorded_usd, s.booked_usd, s.in_flight, s.abandoned, s.timeline],
            "store": [store.recorded, store.failed, store.output_tokens, store.spend_usd, sorted(store.done),
                      store.conversations_finished, dict(store.chains)],
            "files": {f.name: f.read_text() for f in sorted(store.files.directory.iterdir()) if f.is_file()},
            "lane": [lane.stop_reason, lane.target_met_s, lane.holding, len(lane.ready), len(lane.retries)]}
    books = p.ledger.books
    return json.dumps({"lanes": lanes, "money": [books.spent(), books.provisional_usd, books.charged_usd,
                                                 books.foreign_usd, p.ledger.money_left, p.ledger.in_flight],
                       "stop": [p.dispatcher.stop.reason, p.dispatcher.holding],
                       "fidelity": p.recorder.fidelity.summary(), "allowed": p.dispatcher.congestion.allowed,
                       "timeline": p.reporter.timeline}, sort_keys=True, default=str)


def test_reading_changes_nothing(settled):
    p, _ = settled
    p.reporter.sample(6.0)  # the timelines' one point (their writer)
    before = fingerprint(p)
    first = p.reporter.summaries(10.0)
    snaps = [p.reporter.snapshot(10.0), p.reporter.snapshot(10.0, final=True)]
    second = p.reporter.summaries(10.0)
    assert fingerprint(p) == before
    assert not any(lane.store.files.summary.exists() for lane in p.dispatcher.lanes.values())  # the engine writes it

    def steady(summary):  # the clock's reading aside
        return json.dumps({**summary, "ended_at": None, "datasets": None}, sort_keys=True, default=str)

    assert steady(first[1]) == steady(second[1]) and all(steady(first[0][n]) == steady(second[0][n]) for n in "AB")
    assert snaps[0].stats.counts == snaps[1].stats.counts == Counter({"recorded": 2, "failed": 1})
    assert first[0]["A"]["timeline"] == [[6.0, 1, first[0]["A"]["output_tokens"], 0.002, 0, 4]]
