"""τ over questions and tau.json (quality/tau.py): exact figures on a hand-computed case, the bootstrap interval,
and the contract's fields checked on writing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from eagledata.quality.tau import (
    TAU_FIELDS,
    QuestionRun,
    bootstrap_ci,
    check_tau,
    main,
    paired_difference,
    per_position_acceptance,
    read_tau,
    seeds_difference,
    summarize,
    write_tau,
)

# k = 3. Question 1: turn 1 accepted 3, 1; turn 2 accepted 0 → (3 forwards, 4 + 2 + 1 = 7 tokens) τ = 7/3.
# Question 2: turn 1 accepted 2, 2; turn 2 accepted 3 → (3, 3 + 3 + 4 = 10) τ = 10/3.
# Question 3: no verifying forward at all (both turns ended at their first token): no τ.
RUNS = [QuestionRun(1, [[3, 1], [0]], output_tokens=9), QuestionRun(2, [[2, 2], [3]], output_tokens=12),
        QuestionRun(3, [[], []], output_tokens=2)]


def test_a_hand_computed_case():
    assert RUNS[0].tau == pytest.approx(7 / 3) and RUNS[1].tau == pytest.approx(10 / 3) and RUNS[2].tau is None
    # forwards accepting ≥ 1, ≥ 2, ≥ 3 of the six: 5, 4, 2
    assert per_position_acceptance(RUNS, 3) == pytest.approx([5 / 6, 4 / 6, 2 / 6])
    doc = summarize(RUNS, k=3, verifier="tiny", eval_set="mt_bench", samples=10, supervised_tokens=1000,
                    train_seconds=1.5, resamples=2000)
    assert list(doc)[:len(TAU_FIELDS)] == list(TAU_FIELDS)
    assert doc["tau_mean"] == pytest.approx(17 / 6) and doc["questions"] == 3 and doc["turns"] == 6
    assert doc["questions_without_steps"] == 1 and doc["verify_forwards"] == 6 and doc["output_tokens"] == 23
    assert doc["tau_pooled"] == pytest.approx(17 / 6) == 1 + sum(doc["per_position_acceptance"])
    lo, hi = doc["tau_ci95"]
    assert 7 / 3 <= lo <= doc["tau_mean"] <= hi <= 10 / 3  # two values: the bootstrap means lie between them
    assert (doc["greedy"], doc["k"], doc["samples"], doc["supervised_tokens"], doc["train_seconds"]) == (
        True, 3, 10, 1000, 1.5)
    check_tau(doc)


def test_pooled_and_mean_differ_when_questions_differ_in_forwards():
    runs = [QuestionRun("long", [[0] * 9]), QuestionRun("short", [[3]])]  # τ 1 over 9 forwards, τ 4 over 1
    doc = summarize(runs, k=3, verifier="t", eval_set="e", resamples=500)
    assert doc["tau_mean"] == pytest.approx(2.5) and doc["tau_pooled"] == pytest.approx(13 / 10)


def test_the_bootstrap_interval():
    assert bootstrap_ci([2.0] * 10) == (2.0, 2.0)
    rng = np.random.default_rng(1)
    values = rng.normal(3.0, 0.5, size=80)
    lo, hi = bootstrap_ci(values, seed=3)
    se = values.std(ddof=1) / np.sqrt(80)
    assert lo < values.mean() < hi
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.1)  # the normal interval, for a mean of 80 values
    assert bootstrap_ci(values, seed=3) == (lo, hi)  # seeded: the same interval on a rerun
    # coverage: 200 samples of 40 from a skewed law; the 95 % interval holds the true mean in ~95 % of them
    hits = sum(lo <= 1.0 <= hi for lo, hi in
               (bootstrap_ci(rng.exponential(1.0, 40), resamples=1000, seed=s) for s in range(200)))
    assert 175 <= hits <= 198
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci([])


def test_tau_json_is_written_checked_and_read_back(tmp_path):
    doc = summarize(RUNS, k=3, verifier="tiny", eval_set="mt_bench", resamples=500, arm="on_policy")
    path = write_tau(tmp_path / "q" / "on_policy" / "tau.json", doc)
    assert json.loads(path.read_text()) == doc == read_tau(path) and doc["arm"] == "on_policy"
    assert not list(path.parent.glob("*.tmp"))
    for broken, why in [({**doc, "greedy": False}, "must be greedy"),
                        ({**doc, "per_position_acceptance": [0.5, 0.6, 0.1]}, "must fall with position"),
                        ({**doc, "tau_mean": 3.9}, "not within 1..k\\+1"),
                        ({k: v for k, v in doc.items() if k != "samples"}, "lacks \\['samples'\\]")]:
        with pytest.raises(ValueError, match=why):
            write_tau(tmp_path / "bad.json", broken)
    assert not (tmp_path / "bad.json").exists()


def test_nothing_to_measure_is_refused():
    with pytest.raises(ValueError, match="no question had a verifying forward"):
        summarize([QuestionRun(1, [[]])], k=3, verifier="t", eval_set="e")
    with pytest.raises(ValueError, match="outside 0..3"):
        per_position_acceptance([QuestionRun(1, [[4]])], 3)


def test_two_drafters_are_compared_question_by_question():
    # per question τ: a = 2.0, 3.0, 1.5 (and a fourth question b lacks); b = 1.9, 2.8, 1.6
    a = summarize([QuestionRun(q, [[acc]]) for q, acc in [(1, 1), (2, 2), (3, 0), (4, 3)]], k=3, verifier="t",
                  eval_set="e", resamples=200)
    a["per_question"][2]["tau"] = 1.5
    b = {"per_question": [{"id": 1, "tau": 1.9}, {"id": 2, "tau": 2.8}, {"id": 3, "tau": 1.6}]}
    d = paired_difference(a, b, resamples=2000)
    assert d["questions"] == 3 and (d["higher"], d["lower"], d["equal"]) == (2, 1, 0)
    assert d["mean"] == pytest.approx((0.1 + 0.2 - 0.1) / 3)
    assert -0.1 - 1e-9 <= d["ci95"][0] <= d["mean"] <= d["ci95"][1] <= 0.2 + 1e-9
    # the pairs are resampled together: a constant shift has a zero-width interval, however much the questions vary
    shifted = {"per_question": [{"id": q["id"], "tau": q["tau"] - 0.25} for q in a["per_question"]]}
    assert paired_difference(a, shifted)["ci95"] == pytest.approx([0.25, 0.25])
    with pytest.raises(ValueError, match="share no question"):
        paired_difference(a, {"per_question": [{"id": 99, "tau": 2.0}]})


def by_question(taus: dict[int, float]) -> dict:
    return {"per_question": [{"id": q, "tau": t} for q, t in taus.items()]}


def test_trainings_of_several_seeds_are_compared_with_seeds_and_questions_resampled():
    """A seed that moves every question's τ is uncertainty one seed's paired interval cannot hold: each seed alone
    has a zero-width interval here, the two together span both shifts."""
    base = {1: 2.0, 2: 1.4, 3: 1.7, 4: 1.2}
    off = by_question(base)
    seeds = [(by_question({q: t + shift for q, t in base.items()}), off) for shift in (0.1, 0.3)]
    assert [paired_difference(a, b)["ci95"] for a, b in seeds] == [pytest.approx([0.1, 0.1]), pytest.approx([0.3, 0.3])]
    d = seeds_difference(seeds)
    assert (d["seeds"], d["questions"], d["higher"], d["lower"]) == (2, 4, 4, 0)
    assert d["mean"] == pytest.approx(0.2) and d["per_seed"] == pytest.approx([0.1, 0.3])
    assert d["ci95"] == pytest.approx([0.1, 0.3])  # resampled seeds: either alone, or both
    # one seed: the paired interval exactly (the same draws of questions)
    varied = by_question({1: 2.3, 2: 1.3, 3: 1.75, 4: 1.2})
    assert seeds_difference([(varied, off)])["ci95"] == paired_difference(varied, off)["ci95"]
    # only the questions every seed measured
    assert seeds_difference([(varied, off), (by_question({1: 2.1, 2: 1.5}), off)])["questions"] == 2
    with pytest.raises(ValueError, match="share no question"):
        seeds_difference([])
    with pytest.raises(ValueError, match="share no question"):
        seeds_difference([(varied, off), (by_question({9: 2.0}), off)])


def test_data_draws_are_resampled_above_the_seeds_and_each_draw_weighs_the_same():
    """Issue 59 item 5: draw A trained three times (every question +0.1), draw B once (+0.5). Each draw weighs the
    same (mean 0.3, not the 0.2 of four equal experiments) and the interval spans both draws. Planted: the draws
    left unnamed (all one draw, four seeds) gives 0.2."""
    base = {1: 2.0, 2: 1.4, 3: 1.7, 4: 1.2}
    off = by_question(base)

    def shifted(x):
        return by_question({q: t + x for q, t in base.items()})

    pairs = [(shifted(0.1), off)] * 3 + [(shifted(0.5), off)]
    d = seeds_difference(pairs, draws=["A", "A", "A", "B"], resamples=2000)
    assert (d["seeds"], d["draws"]) == (4, 2) and d["mean"] == pytest.approx(0.3)
    assert d["per_draw"] == pytest.approx([0.1, 0.5]) and d["ci95"] == pytest.approx([0.1, 0.5])
    assert seeds_difference(pairs, resamples=2000)["mean"] == pytest.approx(0.2)  # the plant: one draw
    with pytest.raises(ValueError, match="3 draws for 4 pairs"):
        seeds_difference(pairs, draws=["A", "A", "B"])


def test_the_command_compares_experiments_each_and_over_all(tmp_path, capsys):
    experiments = [tmp_path / "seed0", tmp_path / "seed1"]
    pairs = []
    for seed, exp in enumerate(experiments):
        on = summarize([QuestionRun(q, [[1 + (q + seed) % 2, 1]]) for q in range(6)], k=3, verifier="t",
                       eval_set="e", resamples=200, seed=seed)
        off = summarize([QuestionRun(q, [[q % 2, 0]]) for q in range(6)], k=3, verifier="t", eval_set="e",
                        resamples=200, seed=seed)
        write_tau(exp / "on_policy" / "tau.json", on)
        write_tau(exp / "off_policy" / "tau.json", off)
        pairs.append((on, off))
    assert main([str(e) for e in experiments]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["experiment"], x["seed"], x["draw"]) for x in lines[:2]] == [(str(experiments[0]), 0, None),
                                                                           (str(experiments[1]), 1, None)]
    assert lines[1]["on_policy"] == pairs[1][0]["tau_mean"]
    assert lines[1]["difference"] == paired_difference(*pairs[1], seed=1)  # the run's seed, as its summary.json
    assert lines[2] == {"experiments": 2, "difference": seeds_difference(pairs)}
    # the draw read from each experiment's prompts stage: two draws, resampled as draws
    for data_seed, exp in enumerate(experiments):
        (exp / "stages").mkdir()
        (exp / "stages" / "prompts.json").write_text(json.dumps({"settings": {"data_seed": data_seed}}))
    assert main([str(e) for e in experiments]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [x["draw"] for x in lines[:2]] == [{"data_seed": 0}, {"data_seed": 1}]
    assert lines[2]["difference"] == seeds_difference(pairs, draws=[0, 1]) and lines[2]["difference"]["draws"] == 2
    # arms measured on other questions, a missing or a broken tau.json: named, exit 2, no traceback
    other = {**pairs[1][1], "per_question": [{**q, "id": q["id"] + 100} for q in pairs[1][1]["per_question"]]}
    write_tau(experiments[1] / "off_policy" / "tau.json", other)
    assert main([str(e) for e in experiments]) == 2
    assert f"{experiments[1]}: the two tau.json documents share no question" in capsys.readouterr().err
    assert main([str(tmp_path / "none")]) == 2
    assert f"{tmp_path / 'none' / 'on_policy' / 'tau.json'}: cannot open" in capsys.readouterr().err
    (experiments[1] / "off_policy" / "tau.json").write_text("{not json", encoding="utf-8")
    assert main([str(e) for e in experiments]) == 2
    assert f"{experiments[1] / 'off_policy' / 'tau.json'}: not a tau.json" in capsys.readouterr().err


def test_tau_per_category():
    """Each category's τ is the mean over its own questions only (a plant that pooled all questions into every
    category, or keyed by the wrong field, gives other figures)."""
    runs = [QuestionRun(1, [[3, 1], [0]], category="math"), QuestionRun(2, [[2, 2], [3]], category="math"),
            QuestionRun(3, [[0, 0]], category="writing"), QuestionRun(4, [[], []], category="coding")]
    doc = summarize(runs, k=3, verifier="t", eval_set="e", resamples=500)
    cats = doc["per_category"]
    assert sorted(cats) == ["math", "writing"]  # coding's only question has no τ
    assert cats["math"]["questions"] == 2 and cats["math"]["tau_mean"] == pytest.approx((7 / 3 + 10 / 3) / 2)
    assert 7 / 3 <= cats["math"]["tau_ci95"][0] <= cats["math"]["tau_ci95"][1] <= 10 / 3
    assert cats["writing"] == {"questions": 1, "tau_mean": 1.0, "tau_ci95": [1.0, 1.0]}
    assert [q["category"] for q in doc["per_question"]] == ["math", "math", "writing", "coding"]
    # per turn, pooled over the questions that have it: turn 1 has 6 forwards accepting 8, turn 2 two accepting 3
    assert doc["per_turn"] == {"1": {"verify_forwards": 6, "tau_pooled": 14 / 6},
                               "2": {"verify_forwards": 2, "tau_pooled": 5 / 2}}


def test_forwards_without_a_draft_count_in_tau_and_apart_for_vllms_count():
    """Prompt lookup with no match runs a forward with no draft: τ (tokens per verifier forward) counts it, vLLM's
    count (1 + accepted ÷ drafts) does not; both are in tau.json."""
    runs = [QuestionRun(1, [[2, 0, 0]], drafted=[[3, 0, 2]])]  # 3 forwards, 5 tokens; 2 drafts
    doc = summarize(runs, k=3, verifier="t", eval_set="e", resamples=100)
    assert doc["tau_pooled"] == pytest.approx(5 / 3) and doc["forwards_with_draft"] == 2
    assert doc["tau_per_draft"] == pytest.approx(1 + 2 / 2)
    assert "forwards_with_draft" not in summarize(RUNS, k=3, verifier="t", eval_set="e", resamples=100)
