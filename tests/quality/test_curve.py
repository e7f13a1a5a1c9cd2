"""The learning curve (quality/curve.py, issue 62): its sizes as experiments of their own on one experiment's data,
and the fit, which recovers a known trend and says what it cannot resolve (a curve's run: test_run_checks.py)."""
from __future__ import annotations

import json
import math

import pytest

from eagledata.errors import InputError
from eagledata.quality import curve
from eagledata.quality.arms import ARMS
from eagledata.quality.config import QualityConfig


def point(tokens: int, slope: dict[str, float], noise: float = 0.0) -> tuple[int, dict]:
    """τ per question = 1.2 + slope · log2(tokens / 1,000) + a question's own offset (± noise, alternating)."""
    docs = {}
    for arm in ARMS:
        taus = [1.2 + slope[arm] * math.log2(tokens / 1000) + 0.01 * q + noise * (-1) ** (q + tokens // 1000)
                for q in range(20)]
        docs[arm] = {"tau_mean": sum(taus) / 20, "tau_ci95": [min(taus), max(taus)], "questions": 20,
                     "per_position_acceptance": [0.3, 0.1], "supervised_tokens": tokens,
                     "per_question": [{"id": 81 + q, "tau": t} for q, t in enumerate(taus)]}
    return tokens, docs


def test_the_fit_recovers_a_known_trend_and_the_difference_of_the_arms():
    """Points on τ = a + b·log2(tokens/1000) exactly: b per arm and their difference come back, with intervals that
    hold them; the statement says the lead grows. Equal slopes with noise: the difference is not resolved."""
    slope = {"on_policy": 0.08, "off_policy": 0.05}
    points = [point(t, slope) for t in (4000, 8000, 16000, 32000)]
    fit = curve.fit_curve(points, resamples=500)
    for name, b in [*slope.items(), (curve.DIFFERENCE, 0.03)]:
        assert fit[name]["per_doubling"] == pytest.approx(b, abs=1e-9)
        lo, hi = fit[name]["per_doubling_ci95"]
        assert lo - 1e-9 <= b <= hi + 1e-9
    assert fit["on_policy"]["at_1000"] == pytest.approx(1.2 + 0.01 * 9.5)
    said = curve.curve_statement(fit)
    assert said.startswith("Fit (not a measurement) over 4 sizes (4,000, 8,000, 16,000, 32,000 supervised tokens")
    assert "+0.030 [+0.030, +0.030] per doubling: the lead of on-policy grows with data" in said
    assert "Measured minus fitted, on-policy minus off-policy: +0.000 at 4,000, +0.000 at 8,000," in said
    assert max(abs(r) for name in fit if name in (*ARMS, curve.DIFFERENCE) for r in fit[name]["residuals"]) < 1e-9

    # level until 16,000, then a jump of 0.4 in on-policy: a line through it misses, and the residuals say how much
    # (least squares over x = 2, 3, 4, 5: slope 0.12, intercept -0.32; residuals +0.08, -0.04, -0.16, +0.12)
    bent = [point(t, slope) for t in (4000, 8000, 16000, 32000)]
    for arm in ARMS:
        for tokens, docs in bent:
            base = 1.2 + 0.01 * 9.5 + (0.4 if arm == ARMS[0] and tokens == 32000 else 0.0)
            docs[arm] = {**docs[arm], "per_question": [{"id": 81 + q, "tau": base + 0.01 * (q - 9.5)}
                                                       for q in range(20)]}
    bent_fit = curve.fit_curve(bent, resamples=100)
    assert bent_fit[curve.DIFFERENCE]["residuals"] == pytest.approx([0.08, -0.04, -0.16, 0.12], abs=1e-9)
    assert "+0.080 at 4,000, -0.040 at 8,000, -0.160 at 16,000, +0.120 at 32,000" in curve.curve_statement(bent_fit)

    flat = [point(t, {"on_policy": 0.05, "off_policy": 0.05}, noise=0.2) for t in (4000, 8000, 16000, 32000)]
    assert "no change of the difference with data is resolved" in curve.curve_statement(
        curve.fit_curve(flat, resamples=500))
    with pytest.raises(InputError, match="two sizes or more"):
        curve.fit_curve(points[:1])
    diffs = curve.size_differences(points)  # measured, per size: 0.03 a doubling above 4,000's 0.06
    assert [d["supervised_tokens"] for d in diffs] == [4000, 8000, 16000, 32000]
    assert [round(d["mean"], 9) for d in diffs] == [0.06, 0.09, 0.12, 0.15] and all(d["higher"] == 20 for d in diffs)


def test_the_sizes_are_experiments_on_the_data_of_the_largest():
    big = QualityConfig(experiment="c", train_tokens=300, curve_tokens=[150, 40, 75])
    sizes = curve.curve_configs(big)
    assert [(c.experiment, c.data_from, c.train_tokens, c.vllm_check, c.bounds, c.curve_tokens) for c in sizes] == [
        ("c-t40", "c", 40, False, [], []), ("c-t75", "c", 75, False, [], []), ("c-t150", "c", 150, False, [], [])]
    assert all(c.seed == big.seed and c.epochs == big.epochs and c.conversations == big.conversations for c in sizes)
    with pytest.raises(InputError, match="every size must be under train_tokens 300"):
        curve.curve_configs(QualityConfig(train_tokens=300, curve_tokens=[300]))
    with pytest.raises(InputError, match="curve_tokens.*each once"):
        QualityConfig(curve_tokens=[40, 40])


def test_the_ablation_is_three_experiments_on_the_data_at_one_size_and_one_vocabulary():
    from eagledata.quality import ablation

    base = QualityConfig(experiment="c", train_tokens=300, ablation_tokens=75, curve_tokens=[40], train_turns="first")
    made = {c.experiment: c for c in ablation.ablation_configs(base)}
    assert list(made) == ["c-abl-all", "c-abl-first", "c-abl-whole"]
    assert {(c.data_from, c.train_tokens, c.draft_vocabulary, c.ablation_tokens, c.vllm_check) for c in made.values()} \
        == {("c", 75, "data", None, False)}
    assert [(c.train_turns, c.train_cut_answers) for c in made.values()] == [("all", True), ("first", True),
                                                                            ("all", False)]
    assert ablation.ablation_configs(QualityConfig()) == []


def test_the_ablations_comparisons_are_the_fixed_ones_question_by_question(tmp_path):
    """Each drafter read from its experiment and arm; the comparisons in their fixed order with their verdicts; a
    drafter at another count of tokens refused."""
    from eagledata.quality import ablation
    from eagledata.quality.tau import QuestionRun, summarize, write_tau

    accepts = {"off-policy": 0, "on-policy first turns": 1, "on-policy multi-turn": 2,
               "off-policy, no cut answers": 0, "on-policy multi-turn, no cut answers": 2}
    for name, (variant, arm) in ablation.DRAFTERS.items():
        runs = [QuestionRun(81 + q, [[accepts[name]] * 3 + [q % 2]], output_tokens=9) for q in range(10)]
        write_tau(tmp_path / f"x-abl-{variant}" / arm / "tau.json",
                  summarize(runs, k=3, verifier="t", eval_set="mt_bench", supervised_tokens=75, resamples=200))
    docs = ablation.read_ablation(tmp_path, "x")
    compared = ablation.comparisons(docs)
    assert [(c["a"], c["b"], c["verdict"]) for c in compared] == [
        ("on-policy multi-turn", "off-policy", "a higher"), ("on-policy first turns", "off-policy", "a higher"),
        ("on-policy multi-turn", "on-policy first turns", "a higher"),
        ("on-policy multi-turn", "on-policy multi-turn, no cut answers", "unresolved"),
        ("off-policy", "off-policy, no cut answers", "unresolved")]
    assert compared[0]["mean"] == pytest.approx(1.5)  # 2 of 4 forwards' drafts more a forward, 3 of 4 forwards
    said = ablation.ablation_statement(docs, compared)
    assert said.startswith("At 75 supervised tokens each") and "on-policy multi-turn minus off-policy +1.500" in said
    doc = json.loads((tmp_path / "x-abl-whole" / "on_policy" / "tau.json").read_text())
    doc["supervised_tokens"] = 76
    (tmp_path / "x-abl-whole" / "on_policy" / "tau.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="not trained on one count of supervised tokens"):
        ablation.read_ablation(tmp_path, "x")


def test_a_sizes_cost_is_its_own_stages_not_those_linked_from_the_largest(tmp_path):
    """`size_costs`: per experiment, the longer arm's training (side by side), τ, the rest, their total and the
    largest stage peak, from its stage files; a smaller size's linked data stages (the largest's regeneration,
    2,000 MiB) are the largest's cost, not its own."""
    def stage(name, experiment, seconds, peak, linked=None):
        path = tmp_path / experiment / "stages" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"seconds": seconds, "peak_mib": peak, **({"linked_from": linked} if linked else {})}
        path.write_text(json.dumps(doc))

    for exp, link in (("big", None), ("big-t100", str(tmp_path / "big"))):
        stage("records-on_policy", exp, 50.0, 2000.0, link)
    for name, seconds, peak in (("train-on_policy", 100.0, 900.0), ("train-off_policy", 120.0, 950.0),
                                ("tau-on_policy", 10.0, 500.0), ("tau-off_policy", 12.0, 510.0)):
        stage(name, "big", seconds, peak)
    for name, seconds, peak in (("train-on_policy", 30.0, 800.0), ("train-off_policy", 35.0, 820.0),
                                ("tau-on_policy", 10.0, None), ("tau-off_policy", 11.0, 505.0)):
        stage(name, "big-t100", seconds, peak)
    assert curve.size_costs(tmp_path, ["big", "big-t100"]) == [
        {"experiment": "big", "train_seconds": 120.0, "tau_seconds": 22.0, "other_seconds": 50.0, "seconds": 192.0,
         "cut_seconds": 0.0, "peak_mib": 2000.0},
        {"experiment": "big-t100", "train_seconds": 35.0, "tau_seconds": 21.0, "other_seconds": 0.0,
         "seconds": 56.0, "cut_seconds": 0.0, "peak_mib": 820.0}]


def test_the_curve_notebook_reads_finished_experiments_back_without_running_them(tmp_path, execute_notebook):
    """quality_curve.ipynb (make quality-curve-report) over a curve's finished experiments under
    <output_dir>/quality/: what it publishes is the library's report of them (points by tokens, the fit with its
    residuals, the ablation's comparisons); a size not finished fails it naming the experiment's tau.json."""
    from eagledata.notebooks import read_results
    from eagledata.quality import ablation
    from eagledata.quality.tau import QuestionRun, summarize, write_tau

    root = tmp_path / "outputs" / "quality"

    def finished(experiment: str, arm: str, tokens: int, accept: int) -> None:
        runs = [QuestionRun(81 + q, [[accept] * 3 + [q % 3]], output_tokens=9) for q in range(12)]
        write_tau(root / experiment / arm / "tau.json",
                  summarize(runs, k=3, verifier="t", eval_set="mt_bench", supervised_tokens=tokens, resamples=200))

    for tokens, name in ((40, "c-t40"), (75, "c-t75"), (300, "c")):
        for arm, accept in (("on_policy", 1 + (tokens > 100)), ("off_policy", 1)):
            finished(name, arm, tokens, accept)
    out = execute_notebook("quality_curve", curve="c", sizes=[75, 40], ablation=False)
    published = read_results(out)["quality_curve"]
    expected = curve.curve_report(root, ["c", "c-t40", "c-t75"])
    assert [(r["supervised_tokens"], r["arm"]) for r in published["rows"]] == [
        (t, a) for t in (40, 75, 300) for a in ARMS]
    assert published["fit"]["sizes"] == [40, 75, 300] and "ablation" not in published
    assert published["fit"][curve.DIFFERENCE]["residuals"] == pytest.approx(
        expected["fit"][curve.DIFFERENCE]["residuals"])
    assert [d["mean"] for d in published["differences"]] == pytest.approx([0.0, 0.0, 0.75])
    assert published["statement"] == expected["statement"]

    for name, (variant, arm) in ablation.DRAFTERS.items():
        finished(f"c-abl-{variant}", arm, 37, 2 if name.startswith("on-policy multi-turn") else 1)
    published = read_results(execute_notebook("quality_curve", curve="c", sizes=[40, 75]))["quality_curve"]
    assert published["ablation"]["comparisons"] == ablation.ablation_report(root, "c")["comparisons"]
    assert [c["verdict"] for c in published["ablation"]["comparisons"]] == [
        "a higher", "unresolved", "a higher", "unresolved", "unresolved"]
    with pytest.raises(Exception, match=r"c-t150.on_policy.tau\.json"):
        execute_notebook("quality_curve", curve="c", sizes=[40, 75, 150])


def test_the_curves_points_kept_in_git_read_back_at_their_sizes():
    """bench/results/quality/smollm2-sharegpt-curve* (make quality-curve's finished experiments, kept): each size's
    drafters were trained on exactly the tokens its name says, the largest on 300,000, and the report reads them; the
    ablation's five drafters are at one count, 37,500."""
    from pathlib import Path

    from eagledata.quality import ablation

    root = Path(__file__).resolve().parents[2] / "bench" / "results" / "quality"
    sizes = sorted(int(p.name.rsplit("-t", 1)[1]) for p in root.glob("smollm2-sharegpt-curve-t*"))
    assert sizes == [37_500, 75_000, 150_000]
    report = curve.curve_report(root, curve.point_names("smollm2-sharegpt-curve", sizes))
    assert report["fit"]["sizes"] == [*sizes, 300_000]
    assert all(r["questions"] == 80 for r in report["rows"])
    rows = ablation.ablation_report(root, "smollm2-sharegpt-curve")["rows"]
    assert [r["drafter"] for r in rows] == list(ablation.DRAFTERS)
    assert {r["supervised_tokens"] for r in rows} == {37_500}
