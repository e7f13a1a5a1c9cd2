"""The reporter without a server: the snapshot (live panel, status line) and the summaries (each dataset's
summary.json, the run's) read off the parts after a few settled attempts, and nothing they read is changed by
reading it."""
import json
from collections import Counter

import pytest

from eagledata.generation.report.progress import TIMELINE_COLUMNS, RunStats, run_figures, status_line
from eagledata.generation.report.run_report import RunHealth, plot_datasets, provider_table, summary_table
from eagledata.openrouter import Kind, Outcome
from eagledata.summaries import CONSISTENT
from tests.generation.test_engine import Simulated, run
from tests.helpers.parts import PRICE_OUT, answered, datasets, endpoint, routing, send

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
    assert [d.share for d in snap.datasets] == [0.5, tokens["B"] / 5]  # A: one answered, one failed; B past its target
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
    assert first[0]["A"]["timeline"] == [[6.0, 1, first[0]["A"]["output_tokens"], 0.002, 0, 4, 1, 0.0]]  # A: 1 answered


class Unreadable(Simulated):
    """Simulated, but every third request of dataset B comes back unreadable (a reset connection after the answer
    was generated): billed at what it served, a fraction of the bound the run books it at until a reading."""

    def __init__(self, tok, **kw):
        super().__init__(tok, **kw)
        self.b = 0

    async def handle_request(self, client, body, state=None):
        outcome = await super().handle_request(client, body)
        if body["messages"][-1]["content"].startswith("B"):
            self.b += 1
            if self.b % 3 == 0:
                return Outcome(Kind.RETRY, "connection", None, "connection reset")
        return outcome


@pytest.fixture(scope="module")
def unreadable(tmp_path_factory, tok):
    """A and B, 30 prompts each, no targets, in virtual time, with an account read every 2 s (1 s lag): B's
    unreadable answers are booked at their bound and cost far less. The summary, the run, the simulation and every
    status line the run showed."""
    tmp_path, lines = tmp_path_factory.mktemp("unreadable"), []
    sim = Unreadable(tok)

    class Lines:
        def update(self, snap):
            lines.append(status_line(snap))

        def close(self, snap, summary=None):
            lines.append(status_line(snap))

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPENROUTER_API_KEY", "k")
        summary, r = run(tmp_path, sim, datasets(tmp_path, {"A": 30, "B": 30}), view=lambda snap: Lines(),
                         account_refresh_s=2.0, account_lag_s=1.0)
    assert summary["stop_reason"] == "completed" and summary["run"]["errors"] == {"connection": sim.b // 3}
    assert summary["run"]["charged_usd"] == pytest.approx(sim.billed, rel=1e-9)
    assert r.ledger.books.provisional_usd > sim.billed - summary["run"]["recorded_usd"] > 0  # bounds over the truth
    return summary, r, sim, lines


def test_the_charged_line_never_falls_and_ends_at_the_accounts_delta(unreadable):
    """Bookings at a bound exceed what the account later says they cost: the books fall when a reading settles
    them, and once drew the charged line (and the status line's "charged") down from a peak. Charged is the
    account's, never falling, ending at `run.charged_usd`; the bookings at a bound are a column apart."""
    summary, _, _, lines = unreadable
    spend = TIMELINE_COLUMNS.index("spend_usd")
    line = [row[spend] for row in summary["timeline"]]
    assert all(b >= a for a, b in zip(line, line[1:])), f"the charged line fell: peak {max(line)}, end {line[-1]}"
    assert line[-1] == pytest.approx(summary["run"]["charged_usd"], abs=1e-6)
    said = [float(x.split("charged $")[1].split()[0].replace(",", "")) for x in lines]
    assert len(said) > 10 and all(b >= a for a, b in zip(said, said[1:])), "the status line's charged fell"
    assert said[-1] == pytest.approx(summary["run"]["charged_usd"], abs=1e-4)
    bound = TIMELINE_COLUMNS.index("at_bound_usd")
    assert max(row[bound] for row in summary["timeline"]) > 0  # shown apart, while unread
    assert any("booked at a bound, not yet read" in x for x in lines)
    for d in summary["datasets"].values():  # each dataset's line too
        own = [row[spend] for row in d["timeline"]]
        assert all(b >= a - 1e-9 for a, b in zip(own, own[1:])) and own[-1] == pytest.approx(d["run"]["charged_usd"])


def test_each_datasets_part_of_the_account_is_at_least_what_its_answers_cost(unreadable):
    """The account's delta was apportioned by what each dataset's attempts were booked at: B's bounds, far over
    what its unreadable answers cost, took A's money, and A showed a negative waste (the demo's -$0.0087). A keeps
    what its answers cost; the rest of the delta goes by the bookings at a bound; the parts add up to the run's."""
    summary, r, _, _ = unreadable
    per = {n: d["run"] for n, d in summary["datasets"].items()}
    for d in per.values():
        assert d["charged_usd"] >= d["recorded_usd"] - 1e-9 and d["wasted_usd"] >= 0
    assert per["A"]["charged_usd"] == pytest.approx(per["A"]["recorded_usd"], abs=1e-8)  # all read and kept
    assert per["A"]["wasted_usd"] == pytest.approx(0, abs=1e-8) and per["B"]["wasted_usd"] > 0
    assert sum(d["charged_usd"] for d in per.values()) == pytest.approx(summary["run"]["charged_usd"], abs=1e-7)


def test_a_run_that_ended_shows_no_eta(unreadable):
    """The last status line said "ETA 2h57m (money)" on a run that had ended: it says why it stopped instead."""
    _, _, _, lines = unreadable
    assert "ETA" in lines[0] and "ETA" not in lines[-1] and "stopped: completed" in lines[-1]


def test_a_dataset_without_a_target_is_measured_in_prompts_not_records(parts, tok):
    """Two-turn conversations without a target: a prompt finished is two records. Its share over the run counted
    records against prompts (2.0 at the end); where it ended was an empty bar."""
    p = parts({"A": 2}, asks=2)
    for i in range(4):  # each prompt's two turns
        send(p, float(i), answered(tok, cost=0.001), latency_s=0.5)
        p.reporter.sample(i + 1.0)
    p.reporter.sample(5.0, final=True)
    _, summary = p.reporter.summaries(5.0)
    a = summary["datasets"]["A"]
    assert (a["records"], a["remaining"], a["target_output_tokens"]) == (4, 0, None)
    fig = plot_datasets(summary)
    over, ended = fig.axes
    shares = [y for line in over.get_lines() if "prompts" in str(line.get_label()) for y in line.get_ydata()]
    assert shares and max(shares) == pytest.approx(1.0) and all(y <= 1.0 for y in shares)
    heights = [bar.get_height() for bar in ended.patches]
    assert heights == [pytest.approx(1.0)]
    assert [t.get_text() for t in ended.texts] == ["100.0% of prompts"]


def test_the_summary_table_reads_whole_in_a_text_log(settled):
    """papermill's log prints the table as text, where pandas cuts a label past 50 characters: the tool loops' row
    was "tool-call turns (calls; served with other ids, ..." over "14 (19; 0; 10)". Each figure has its own row."""
    p, _ = settled
    p.dispatcher.lanes["A"].stats.tool_calls.update(answers=14, calls=19, mismatched=10)
    _, summary = p.reporter.summaries(10.0)
    table = summary_table(summary)
    assert all(len(label) <= 50 for label in table.index), [x for x in table.index if len(x) > 50]
    assert "..." not in repr(table)
    value = table["value"].to_dict()
    assert (value["tool-call turns"], value["tool calls"], value["tool-call ids served otherwise, rebuilt"],
            value["tool loops ended on a mismatch"]) == ("14", "19", "0", "10")


def test_no_waste_is_zero_not_minus_zero():
    """An account that charged exactly what the kept answers cost differs from their float sum by a rounding
    error: wasted rounded to -0.0 and printed "$-0.0000". (A sign, not an accounting error.)"""
    stats = RunStats(recorded_usd=0.1 + 0.2)  # 0.30000000000000004
    figures = run_figures(stats, wall_s=1.0, charged=0.3, spent=0.3)
    assert figures["wasted_usd"] == 0.0 and str(figures["wasted_usd"]) == "0.0"
    assert run_figures(stats, wall_s=1.0, charged=0.25, spent=0.3)["wasted_usd"] == 0.0  # an account behind us


def test_attempts_no_provider_answered_are_named_so(settled):
    """The provider table's row for attempts that never reached a provider (a connection or gateway error) was
    named "-"."""
    p, _ = settled
    _, summary = p.reporter.summaries(10.0)
    assert "-" in summary["run"]["provider_health"]  # summary.json keeps its name (docs/FORMATS.md)
    table = provider_table(RunHealth.of_summary(summary))
    assert list(table.index) == ["(no provider: connection or gateway error)", "Cheap", "Dear"]
