"""The live panel (panel.py) and the report's health figure (report.py): the panel redraws in place from the run's
snapshots, its last frame is the report's figure, and every point agrees with the summary."""
import json
from pathlib import Path

import pytest

from eagledata.aio import run_sync
from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, RunHealth, generate, provider_table
from eagledata.generation.report.panel import LivePanel
from eagledata.generation.report.progress import TIMELINE_COLUMNS, thin
from eagledata.generation.report.run_report import plot_health, rates
from eagledata.generation.run import run_generation
from eagledata.openrouter import PrecisionPolicy, decide, fetch_catalog

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.6, "content_median": 20, "content_sigma": 0.5, "max_total": 400}
# Answers whose cost cannot be read (a torn body, a reset connection) are booked at their bound until the account
# says what they cost: the spend line's last point once ended on those books, over what the run was charged.
FAULTS = {"rate_limit": 0.05, "bad_gateway": 0.03, "truncated_json": 0.06, "connection_reset": 0.06}
EMULATOR = {"speed": 0.5, "content": SMALL, "generation_delay": 0.1, "balance": 1000, "faults": FAULTS, "seed": 5}


def test_rates_make_no_spike_from_a_sample_just_after_the_last():
    """Samples every 0.5 s at 1,000 tok/s, and a final one 0.01 s after the last with one more answer of 500
    tokens: over a 5 s window the last rate is ~1,100 tok/s, where sample-to-sample it would be 50,000."""
    t = [0.5 * i for i in range(1, 41)]
    tokens = [1000 * x for x in t]
    t.append(t[-1] + 0.01)
    tokens.append(tokens[-1] + 500)
    r = rates(t, tokens)
    assert r[-2] == pytest.approx(1000, rel=1e-9)
    assert r[-1] == pytest.approx((5000 + 500) / 5.01, rel=1e-9)
    assert max(r) < 1200
    assert r[0] == pytest.approx(500 / 5.0)  # younger than the window: over the window, not over 0.5 s


def test_a_long_timeline_is_thinned_not_cut():
    """A 30-minute run has 3,600 samples: the report keeps 2,000 spread over the whole run, the first and last."""
    timeline = [[0.5 * i, i, 10 * i, 0.01 * i, 100, 2000] for i in range(3600)]
    kept = thin(timeline)
    assert len(kept) == 2000 and kept[0] == timeline[0] and kept[-1] == timeline[-1]
    gaps = {round(b[0] - a[0], 1) for a, b in zip(kept, kept[1:])}
    assert gaps <= {0.5, 1.0}
    assert thin(kept) == kept  # the summary's timeline, thinned again by the report, is the same


def datasets_file(tmp_path: Path, planned: dict[str, float], target: int = 6000) -> Path:
    lines = []
    for name in ("A", "B"):
        prompts = tmp_path / f"{name}.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"{name}-{i:04d}", "messages": [
            {"role": "user", "content": f"{name} question {i}: why is the sky blue at {i} o'clock?"}]}) + "\n"
            for i in range(400)))
        lines.append(f"{name}:\n  prompts: {prompts}\n  target_output_tokens: {target}\n"
                     f"  planned_usd: {planned[name]}\n")
    (tmp_path / "datasets.yaml").write_text("".join(lines))
    return tmp_path / "datasets.yaml"


def test_the_panel_redraws_in_place_and_its_last_frame_is_the_reports_figure(tokenizer_dir, tmp_path):
    """Two datasets to their targets: the panel redraws while the run goes, at every tick (counted against the ticks
    that came, not the wall clock: frames drawn on the panel's own thread were as many as a loaded machine let it
    draw), and every line ends where the summary does."""
    from eagledata.generation.clock import InlineExecutor

    planned = {"A": 0.02, "B": 0.03}
    shown = []
    panels: list[LivePanel] = []

    class Counting(LivePanel):
        ticks = 0

        def update(self, snap):
            self.ticks += 1
            super().update(snap)

    def view(snap):  # every frame drawn at once, on the loop (interval 0: one at each tick)
        panels.append(Counting(snap, interval_s=0.0, show=shown.append, executor=InlineExecutor()))
        return panels[0]

    with run_emulator(EMULATOR) as emu:
        cfg = GenerateConfig(dataset=["A", "B"], datasets_file=str(datasets_file(tmp_path, planned)),
                             base_url=emu.base_url, output_dir=str(tmp_path / "out"),
                             params_dir=str(tmp_path / "params"), concurrency=40, max_tokens=400, progress=False,
                             retry_base_s=0.01, retry_cap_s=0.2, reserve_usd=0.0, account_refresh_s=0.5,
                             account_lag_s=0.1, straggler_wait_s=1.0, prior_output_median_tokens=80.0)
        summary = run_sync(run_generation(cfg, view=view), "test")
        charged = emu.stats()["charged_usd"]
    panel = panels[0]
    assert shown == [panel.box]  # put on screen once, then changed in place
    # a frame at each tick (the last one's may land after the final frame and be dropped: the final one counts)
    assert panel.frames >= panel.ticks >= 5, (panel.frames, panel.ticks)
    stop = summary["stop_reason"]
    assert stop == "target_reached"
    assert bytes(panel.image.value).startswith(b"\x89PNG") and f"ended: {stop}" in panel.headline.value
    assert "<table" in panel.table.value and "verdict" in panel.table.value

    run = summary["run"]
    assert run["charged_usd"] == pytest.approx(charged, abs=1e-6)
    health = RunHealth.of_summary(summary)
    spend = TIMELINE_COLUMNS.index("spend_usd")
    assert summary["timeline"][-1][spend] == pytest.approx(run["charged_usd"], abs=1e-6)  # not the books' bound
    assert health.charged == pytest.approx(run["charged_usd"], abs=1e-6)
    for _name, s in summary["datasets"].items():  # each dataset's line ends at its share of the account's delta
        assert s["timeline"][-1][spend] == pytest.approx(s["run"]["charged_usd"], abs=1e-6)
    assert health.planned_usd_per_m == pytest.approx(1e6 * sum(planned.values()) / 12_000, rel=1e-3)

    table = provider_table(health)
    assert set(table.index) >= set(run["providers"]) and (table["rate_limited"] > 0).any()
    attempts = sum(h["attempts"] for h in run["provider_health"].values())
    # every attempt, on the provider that served it (a stream the run closed before its first chunk had none)
    assert attempts == run["recorded"] + sum(run["errors"].values()) - run["errors"].get("cancelled", 0)
    assert [d.share for d in health.datasets] == pytest.approx(
        [s["output_tokens"] / 6000 for s in summary["datasets"].values()])
    fig = plot_health(health)
    assert len(fig.axes) == 5 and health.headline() in fig._suptitle.get_text()
    assert fig._repr_png_().startswith(b"\x89PNG")  # a notebook shows it as an image, pyplot imported or not


def test_a_finished_run_run_again_shows_its_final_panel_without_a_request(tokenizer_dir, tmp_path):
    """A report re-run months later answers from the checkpoint: the panel's final frame is the run that did the
    work, and nothing is sent (the server is gone)."""
    with run_emulator({**EMULATOR, "faults": {}}) as emu:
        catalog = fetch_catalog(emu.base_url, "moonshotai/kimi-k2.5")  # the decision on file, as providers.ipynb
        decide(catalog.model, catalog.normalized(), PrecisionPolicy.for_model(catalog.model)).save(tmp_path / "params")
        cfg = GenerateConfig(dataset=["A", "B"], datasets_file=str(datasets_file(tmp_path, {"A": 0.02, "B": 0.02})),
                             base_url=emu.base_url, output_dir=str(tmp_path / "out"),
                             params_dir=str(tmp_path / "params"), concurrency=40, max_tokens=400, progress=False,
                             reserve_usd=0.0, account_refresh_s=0.5, account_lag_s=0.1)
        first = generate(cfg)
    panels: list[LivePanel] = []
    again = run_sync(run_generation(GenerateConfig(**{**cfg.__dict__, "base_url": "http://127.0.0.1:9/api/v1"}),
                                    view=lambda snap: panels.append(LivePanel(snap, show=None)) or panels[0]), "t")
    assert again["run"]["recorded"] == 0
    before, now = RunHealth.of_summary(first), RunHealth.of_summary(again)
    spend = TIMELINE_COLUMNS.index("spend_usd")  # the datasets' books, added up: the run's reconciled one at the end
    shown, ran = ([r[:spend] + r[spend + 1:] for r in h.timeline] for h in (now, before))
    assert len(shown) == len(ran)  # the datasets' $ columns added up: to the sixth place the samples keep
    assert all(a == pytest.approx(b, abs=2e-6) for a, b in zip(shown, ran))
    assert now.charged == pytest.approx(before.charged, abs=2e-6)  # two datasets' figures, each to the sixth place
    assert before.charged == pytest.approx(first["run"]["charged_usd"], abs=1e-6)
    counts = ("attempts", "answers", "errors", "rate_limited")
    assert {n: [p[k] for k in counts] for n, p in now.providers.items()} == \
        {n: [p[k] for k in counts] for n, p in before.providers.items()}
    assert "ended: target_reached" in panels[0].headline.value and bytes(panels[0].image.value).startswith(b"\x89PNG")


def test_the_headline_says_how_far_the_streams_in_flight_have_got():
    """Issue 42: the panel shows the tokens the answers in flight have streamed so far (characters, at this run's
    tokens per character: the service counts tokens only in a stream's last chunk)."""
    from eagledata.generation.report.progress import RunSnapshot, RunStats

    stats = RunStats(output_tokens=1_000, chars=4_000)  # 4 characters a token in this run's records
    snap = RunSnapshot(t=65.0, in_flight=1200, limit=2000, spent=0.5, stats=stats, datasets=[], streams=1200,
                       streamed_chars=1_382_712)
    health = RunHealth.of_snapshot(snap)
    assert (health.streams, health.streamed_tokens) == (1200, 345_678)
    assert "~345,678 tokens streamed by 1,200 in flight" in health.headline()
    before_any_record = RunHealth.of_snapshot(RunSnapshot(t=5.0, in_flight=3, limit=2000, spent=0.0,
                                                          stats=RunStats(), datasets=[], streams=3, streamed_chars=90))
    assert "streaming by 3 in flight" in before_any_record.headline()
    quiet = RunHealth.of_snapshot(RunSnapshot(t=5.0, in_flight=3, limit=2000, spent=0.0, stats=stats, datasets=[]))
    assert "streamed" not in quiet.headline()  # JSON answers: nothing to say
    from eagledata.generation.report.progress import status_line
    assert "in flight 1,200/2,000 (~345,678 tokens streamed) |" in status_line(snap)  # papermill's log, the same
