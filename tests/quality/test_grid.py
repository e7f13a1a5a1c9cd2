"""The report card over the grid (quality/grid.py, notebooks/quality_grid.ipynb): finished experiments read back,
the primary analysis as quality/README.md fixed it (the draws named, the interval's side of zero), a partial grid
refused. The cells are made here as a run writes them: each arm's tau.json (`tau.summarize`), summary.json's fields
the report reads, stages/prompts.json's draw."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagledata.errors import InputError
from eagledata.quality import grid as report
from eagledata.quality.arms import ARMS
from eagledata.quality.layout import keep
from eagledata.quality.tau import QuestionRun, paired_difference, seeds_difference, summarize, write_tau
from eagledata.quality.tau import main as tau_command

CATEGORIES = ("writing", "math")


def runs(accepts: list[int]) -> list[QuestionRun]:
    """One question per entry: two turns of 4 verifying forwards, each accepting that many drafts."""
    return [QuestionRun(81 + q, [[a] * 4, [a] * 4], output_tokens=20, category=CATEGORIES[q % 2])
            for q, a in enumerate(accepts)]


def make_cell(root: Path, name: str, draw: int, seed: int, on: list[int], off: list[int],
              ngram: list[int] | None = None) -> None:
    """A finished experiment: on- and off-policy accepting `on` / `off` drafts per question (and n-gram)."""
    folder = root / name
    docs = {}
    for drafter, accepts in [("on_policy", on), ("off_policy", off), ("ngram", ngram)]:
        if accepts is None:
            continue
        docs[drafter] = summarize(runs(accepts), k=3, verifier="tiny", eval_set="mt_bench", seed=seed,
                                  supervised_tokens=1000 + draw, resamples=500)
        write_tau(folder / (drafter if drafter in ARMS else f"bounds/{drafter}") / "tau.json", docs[drafter])
    summary = {"config": {"seed": seed, "data_seed": draw}, "supervised_tokens": 1000 + draw,
               "rows": [{"drafter": d, "tau_mean": doc["tau_mean"], "tau_ci95": doc["tau_ci95"]}
                        for d, doc in docs.items()],
               "difference": paired_difference(docs["on_policy"], docs["off_policy"], resamples=500),
               "per_category": {arm: docs[arm]["per_category"] for arm in ARMS},
               "epoch_losses": {arm: [{"epoch": 0, "train_loss": 5.0, "validation_loss": 9.0 + seed},
                                      {"epoch": 1, "train_loss": 3.0, "validation_loss": None}] for arm in ARMS}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "stages").mkdir()
    (folder / "stages" / "prompts.json").write_text(json.dumps({"settings": {"conversations": 8, "data_seed": draw}}))


def grid(root: Path, shift: int, noise: list[list[int]] | None = None) -> list[str]:
    """Three draws × two seeds: on-policy accepting `shift` more drafts than off-policy on every question (within
    0..k = 3), plus a per-cell pattern (`noise`: one list of 8 per cell)."""
    names = report.cell_names("g", [0, 1, 2], [0, 1])
    for i, name in enumerate(names):
        base = [(q * i + q) % 4 for q in range(8)]  # at the cap (3) on some questions of some cells
        extra = noise[i] if noise else [0] * 8
        make_cell(root, name, i // 2, i % 2, [min(3, max(0, b + shift + e)) for b, e in zip(base, extra)], base,
                  ngram=[2] * 8)
    return names


def test_the_primary_analysis_names_the_draws_and_decides_by_the_intervals_side(tmp_path):
    """Six cells in three draws: `primary` is `seeds_difference` with the draws named (three draws of two seeds;
    planted, all one draw, it counts one); on-policy one draft ahead on every question is "on-policy better",
    behind is "off-policy better", and a difference that flips between the draws is unresolved."""
    cells = report.read_cells(tmp_path, grid(tmp_path, 1))
    result = report.primary(cells, resamples=2000)
    assert (result["draws"], result["seeds"], result["questions"]) == (3, 6, 8)
    assert result["verdict"] == "on-policy better" and result["ci95"][0] > 0
    pairs = [(c.taus["on_policy"], c.taus["off_policy"]) for c in cells]
    assert result["ci95"] == seeds_difference(pairs, draws=[0, 0, 1, 1, 2, 2], resamples=2000)["ci95"]
    assert [(c.data_seed, c.seed) for c in cells] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]

    behind = tmp_path / "behind"
    behind.mkdir()
    assert report.primary(report.read_cells(behind, grid(behind, -1)), resamples=2000)["verdict"] == "off-policy better"
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    flips = [[1] * 8, [1] * 8, [-1] * 8, [-1] * 8, [0] * 8, [0] * 8]
    assert report.primary(report.read_cells(mixed, grid(mixed, 0, flips)), resamples=2000)["verdict"] == "unresolved"
    assert [report.verdict(ci) for ci in ([0.01, 0.2], [-0.2, -0.01], [-0.01, 0.2], [0.0, 0.2])] == [
        "on-policy better", "off-policy better", "unresolved", "unresolved"]


def test_a_grid_with_a_cell_not_finished_is_refused_naming_it(tmp_path):
    names = grid(tmp_path, 1)
    (tmp_path / names[3] / "summary.json").unlink()
    (tmp_path / names[5] / "summary.json").unlink()
    with pytest.raises(InputError, match=r"2 of the grid's 6 experiments have not finished \(no summary.json\): "
                                         r"g-d1-s1, g-d2-s1"):
        report.read_cells(tmp_path, names)
    (tmp_path / names[0] / "stages" / "prompts.json").unlink()
    with pytest.raises(InputError, match="no data draw recorded") as e:
        report.read_cells(tmp_path, names[:1])
    assert str(tmp_path / names[0] / "stages" / "prompts.json") in str(e.value)


def test_the_secondary_tables_and_the_conclusion_come_from_the_cells(tmp_path):
    names = grid(tmp_path, 1)
    cells = report.read_cells(tmp_path, names)
    rows = report.cell_rows(cells)
    assert [r["experiment"] for r in rows] == names
    assert rows[0]["on_policy"] - rows[0]["off_policy"] == pytest.approx(rows[0]["difference"])
    assert rows[1]["on_policy last validation loss"] == 10.0 and rows[2]["supervised_tokens"] == 1001
    assert rows[0]["off_policy resumed after epoch"] == 0  # a tau.json from before the key: not resumed
    by = {r["category"]: r for r in report.category_rows(cells)}
    assert set(by) == set(CATEGORIES) and all(r["questions"] == 4 for r in by.values())
    assert all(r["difference"] > 0 and r["lower"] == 0 for r in by.values())  # one draft more, but at the cap
    beats = {arm: sum(c.row(arm)["tau_ci95"][0] > 3.0 for c in cells) for arm in ARMS}
    assert report.against_ngram(cells) == {"cells": 6, "ngram": 3.0, **beats} and beats["off_policy"] == 0
    result = report.primary(cells, resamples=2000)
    said = report.conclusion(cells, result)
    lo, hi = result["ci95"]
    assert f"**{result['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]**" in said and "on-policy is better" in said
    assert "Over 3 data draws and 6 trainings of each arm" in said
    assert f"on-policy beats it in {beats['on_policy']} of 6 cells, off-policy in 0" in said


def test_the_grid_notebook_reports_the_primary_analysis(tmp_path, execute_notebook):
    """quality_grid.ipynb over six finished cells under <output_dir>/quality/: its published result is the
    library's; a cell missing fails the notebook naming it."""
    from eagledata.notebooks import read_results

    quality = tmp_path / "outputs" / "quality"
    quality.mkdir(parents=True)
    names = grid(quality, 1)
    out = execute_notebook("quality_grid", grid="g", resamples=2000)
    published = read_results(out)["quality_grid"]
    expected = report.primary(report.read_cells(quality, names), resamples=2000)
    assert published["primary"]["ci95"] == pytest.approx(expected["ci95"])
    assert published["primary"]["verdict"] == "on-policy better" and len(published["cells"]) == 6
    with pytest.raises(Exception, match="3 of the grid's 9 experiments have not finished"):
        execute_notebook("quality_grid", grid="g", seeds=[0, 1, 2])


def test_a_kept_cell_is_read_as_the_run_left_it_and_an_unfinished_one_is_not_kept(tmp_path):
    """`layout.keep` (each finished experiment, with `keep_dir`: make quality-grid's bench/results/quality/) copies
    what the report card reads; the report read there equals the report read from the runs, a second keep replaces
    the first whole, and an experiment without its summary is refused naming it."""
    runs_root, kept_root = tmp_path / "runs", tmp_path / "kept"
    names = grid(runs_root, shift=1)
    (runs_root / names[0] / "on_policy" / "checkpoint").mkdir(parents=True)  # what stays under outputs/
    (runs_root / names[0] / "on_policy" / "checkpoint" / "model.safetensors").write_bytes(b"weights")
    for name in names:
        assert len(keep(runs_root / name, kept_root)) == 5
    assert sorted(str(p.relative_to(kept_root / names[0])) for p in (kept_root / names[0]).rglob("*")
                  if p.is_file()) == ["bounds/ngram/tau.json", "off_policy/tau.json", "on_policy/tau.json",
                                      "stages/prompts.json", "summary.json"]
    read = {root: report.read_cells(root, names) for root in (runs_root, kept_root)}
    assert report.primary(read[kept_root], resamples=300) == report.primary(read[runs_root], resamples=300)
    assert report.cell_rows(read[kept_root]) == report.cell_rows(read[runs_root])

    (kept_root / names[0] / "stale.json").write_text("{}")
    keep(runs_root / names[0], kept_root)
    assert not (kept_root / names[0] / "stale.json").exists()
    (runs_root / names[1] / "summary.json").unlink()
    with pytest.raises(InputError, match="no summary.json") as e:
        keep(runs_root / names[1], kept_root)
    assert str(runs_root / names[1]) in str(e.value)


def test_the_cells_kept_in_git_are_whole_and_read_by_the_report_card(capsys):
    """bench/results/quality/ (what `keep_dir` copied from the grid's finished cells): every experiment there reads
    back as a cell, its tau.json pass the contract's checks, and its summary's rows and paired difference are those
    of its tau.json: the report card over them reports what the runs measured."""
    root = Path(__file__).resolve().parents[2] / "bench" / "results" / "quality"
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert "smollm2-sharegpt-d0-s0" in names  # the grid's first cell measured again (2026-12-06)
    cells = report.read_cells(root, names)
    for cell in cells:
        for arm in ARMS:
            assert cell.row(arm)["tau_mean"] == cell.taus[arm]["tau_mean"]
            assert cell.row(arm)["tau_ci95"] == cell.taus[arm]["tau_ci95"]
        assert cell.summary["difference"] == paired_difference(cell.taus[ARMS[0]], cell.taus[ARMS[1]],
                                                               seed=cell.seed)
    # `python -m eagledata.quality.tau` over them prints each cell's own difference (its run's seed), not another draw
    assert tau_command([str(root / name) for name in names]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["difference"] for line in lines[:-1]] == [cell.summary["difference"] for cell in cells]
