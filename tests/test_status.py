"""Headless progress: the status line's content, its cadence under a fake clock, and where it is written."""
import io
import logging
import math
import sys
from collections import Counter

import pytest

from eagledata.generation.report.panel import make_progress
from eagledata.generation.report.progress import DatasetSnapshot, RunSnapshot, RunStats, StatusLines, status_line
from eagledata.status import StatusLog, duration, ensure_log_handler, eta_s, widget_frontend


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def stats(output_tokens=0, errors=None) -> RunStats:
    s = RunStats()
    s.output_tokens = output_tokens
    s.errors = Counter(errors or {})
    return s


def test_one_line_per_interval_on_a_fixed_schedule(caplog):
    clock = FakeClock()
    log = StatusLog(10.0, "eagledata.test", clock=clock)
    times = []
    with caplog.at_level(logging.INFO, logger="eagledata.test"):
        while clock.t < 1060.0:  # a 60 s run polled every 0.5 s, as the engine's ticker does
            clock.t += 0.5
            if log.maybe(lambda: f"at {clock.t - 1000:.1f}"):
                times.append(clock.t - 1000)
    assert times == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert [r.getMessage() for r in caplog.records] == [f"at {t:.1f}" for t in times]


def test_a_late_poll_does_not_shift_the_schedule_or_burst():
    clock = FakeClock()
    log = StatusLog(10.0, clock=clock)
    clock.t += 10.4
    assert log.maybe(lambda: "a")        # 10.4: the line due at 10
    clock.t += 25.0                      # 35.4: the slots at 20 and 30 were missed: one line, not two
    assert log.maybe(lambda: "b") and not log.maybe(lambda: "c")
    clock.t = 1000 + 39.9
    assert not log.maybe(lambda: "d")
    clock.t = 1000 + 40.0                # back on the 10 s grid
    assert log.maybe(lambda: "e") and log.lines == 3


def test_the_line_is_built_only_when_due():
    clock = FakeClock()
    log = StatusLog(10.0, clock=clock)
    built = []
    log.maybe(lambda: built.append(1) or "x")
    assert built == []


def one(name, *, t, done, total_prompts, tokens, in_flight, limit, spent, run_stats, target=None, done_before=0,
        tokens_before=0, **money):
    d = DatasetSnapshot(name, done, total_prompts, tokens, target, in_flight, run_stats, done_before, tokens_before)
    return RunSnapshot(t=t, in_flight=in_flight, limit=limit, spent=spent, stats=run_stats, datasets=[d], **money)


def test_status_line_says_speed_money_flight_progress_eta_and_errors_by_class():
    snap = one("B4", t=100.0, done=1500, total_prompts=5000, tokens=2_000_000, in_flight=1800, limit=2000,
               spent=12.5, cap=50.0, money_limit=50.0, done_before=500,
               run_stats=stats(1_000_000, {"rate_limit": 7, "bad_gateway": 2, "timeout": 1, "empty_content": 1}))
    line = status_line(snap)
    assert line.startswith("B4: 1,500/5,000 prompts (30.0%)")
    assert "10,000 output tok/s" in line                      # this run's tokens over its time
    assert "charged $12.5000 of $50.00 cap" in line
    assert "in flight 1,800/2,000" in line
    assert "ETA 5m00s (money)" in line    # work: 3,500 prompts at 10/s = 350 s; money: $37.5 at $0.125/s = 300 s
    assert line.endswith("errors 11 (rate_limit 7, bad_gateway 2, timeout 1, empty_content 1)")


def test_status_line_against_a_token_target():
    snap = one("B1", t=60.0, done=300, total_prompts=10_000, tokens=4_000_000, in_flight=5, limit=2000, spent=1.0,
               run_stats=stats(3_000_000), target=7_000_000, tokens_before=1_000_000)
    line = status_line(snap)
    assert line.startswith("B1: 4,000,000/7,000,000 output tokens (57.1%), 300/10,000 prompts")
    assert "ETA 1m00s |" in line and "cap" not in line and line.endswith("errors 0")


def test_status_line_of_several_datasets_gives_the_totals_then_each_share():
    """The slowest dataset's ETA is the run's; another spender on the key is said."""
    run_stats = stats(3_000_000)
    ds = [DatasetSnapshot("B3", 100, 1000, 1_000_000, 2_000_000, 40, run_stats),
          DatasetSnapshot("B4", 50, 1000, 500_000, 2_000_000, 60, run_stats)]
    snap = RunSnapshot(t=60.0, in_flight=100, limit=500, spent=2.0, stats=run_stats, datasets=ds, foreign=0.75)
    line = status_line(snap)
    assert line.startswith("2 datasets: 1,500,000/4,000,000 output tokens, 150/2,000 prompts | 50,000 output tok/s")
    assert "ETA 3m00s |" in line  # B4: 1.5M tokens to go at 0.5M per minute
    assert "charged $2.0000 | other spending on this key $0.7500 | in flight 100/500" in line
    assert line.endswith("| B3 50.0%, B4 25.0%")


def test_eta_and_duration():
    assert eta_s(50, 100, 10.0) == 10.0
    assert eta_s(50, 100, 10.0, done_at_start=50) is None    # nothing done in this run yet: no rate
    assert eta_s(100, 100, 0.0) == 0.0 and eta_s(5, None, 1.0) is None
    assert [duration(s) for s in (None, math.inf, 42.4, 185, 7620)] == ["?", "?", "42s", "3m05s", "2h07m"]


def test_status_lines_log_through_logging_and_end_with_a_final_line(caplog):
    clock = FakeClock()
    view = StatusLines(interval_s=10, clock=clock)
    snap = one("D", t=5.0, done=1, total_prompts=10, tokens=100, in_flight=3, limit=8, spent=0.01,
               run_stats=stats(100))
    with caplog.at_level(logging.INFO, logger="eagledata"):
        view.update(snap)
        clock.t += 10
        view.update(snap)
        view.close(snap)
    lines = [r.getMessage() for r in caplog.records if r.name == "eagledata.generate"]
    assert len(lines) == 2 and lines[-1].endswith("| ended after 5s")


def test_no_widget_frontend_outside_a_jupyter_server_kernel(monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "x.ipynb")
    assert widget_frontend() is False  # not an IPython kernel at all
    snap = one("D", t=0.0, done=0, total_prompts=1, tokens=0, in_flight=0, limit=1, spent=0.0, run_stats=stats(0))
    assert isinstance(make_progress(snap, interval_s=10), StatusLines)


def test_handler_writes_to_the_current_stderr_only_when_logging_is_not_set_up(monkeypatch):
    logger = logging.getLogger("eagledata")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    ensure_log_handler()
    assert len(logger.handlers) == 1
    ensure_log_handler()
    assert len(logger.handlers) == 1  # once
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)  # a kernel or a test swaps stderr: the handler follows
    logging.getLogger("eagledata.generate").info("status here")
    assert err.getvalue().rstrip().endswith(" status here")


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_a_zero_interval_logs_nothing_periodic(interval):
    clock = FakeClock()
    log = StatusLog(interval, clock=clock)
    clock.t += 100
    assert not log.maybe(lambda: "x")


def test_extraction_progress_says_memory_per_device_and_the_scoring_share():
    """hidden_states' progress: each device's memory in use, and the share of the time spent scoring where the
    source times it apart (transformers), else where it happens (vLLM: inside the server's forward)."""
    from eagledata.training.job import Progress as ExtractionProgress

    gpus = [("cuda:0", 61.2e9, 80e9), ("cuda:1", 59.0e9, 80e9)]
    p = ExtractionProgress("set", "rank 0/1", "x", 1000, 10, show=False, interval_s=1.0, memory=lambda: gpus)
    p.start -= 4.0  # four seconds in
    p.advance(100, 1, scored=True, scoring_s=0.5)
    p.advance(100, 1, scored=True, scoring_s=0.5)
    assert p.line().endswith(" | memory cuda:0 61.2/80.0 GB, cuda:1 59.0/80.0 GB | scoring 25% of the time")
    served = ExtractionProgress("set", "rank 0/1", "x", 1000, 10, show=False, interval_s=1.0, memory=lambda: gpus[:1])
    served.advance(100, 1, scored=True)
    assert served.line().endswith(" | memory cuda:0 61.2/80.0 GB | scoring in the server's forward (not timed apart)")
    unscored = ExtractionProgress("set", "rank 0/1", "x", 1000, 10, show=False, interval_s=1.0, memory=lambda: gpus[:1])
    unscored.advance(100, 1)
    assert unscored.line().endswith(" | no scoring")


def test_status_line_shows_the_real_share_past_the_target():
    """Issue 53: `at_target: finish` ended at 184,024 of 150,000 while the line read "(100.0%)": the share is the
    real one, past 100 %, in the head and in each dataset's share."""
    snap = one("B1", t=60.0, done=80, total_prompts=80, tokens=184_024, in_flight=0, limit=2000, spent=1.0,
               run_stats=stats(184_024), target=150_000)
    assert status_line(snap).startswith("B1: 184,024/150,000 output tokens (122.7%), 80/80 prompts")
    run_stats = stats(300_000)
    ds = [DatasetSnapshot("B3", 10, 10, 160_990, 150_000, 0, run_stats),
          DatasetSnapshot("B4", 5, 10, 75_000, 150_000, 3, run_stats)]
    line = status_line(RunSnapshot(t=60.0, in_flight=3, limit=500, spent=2.0, stats=run_stats, datasets=ds))
    assert line.endswith("| B3 107.3%, B4 50.0%")
