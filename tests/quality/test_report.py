"""quality.ipynb's conclusion says what was measured, whichever way it points (quality/report.py)."""
from __future__ import annotations

from eagledata.quality.report import conclusion, table_rows


def summary(on, on_ci, off, off_ci, diff_ci=(0.35, 0.45), higher=9):
    def row(name, tau, ci, questions=10):
        return {"drafter": name, "samples": 100, "supervised_tokens": 5000, "train_seconds": 12.0,
                "questions": questions, "turns": 20, "k": 5, "tau_mean": tau, "tau_ci95": ci, "tau_pooled": tau,
                "per_position_acceptance": [0.5, 0.3, 0.2, 0.1, 0.05]}
    difference = {"questions": 10, "mean": on - off, "ci95": list(diff_ci), "higher": higher, "lower": 10 - higher,
                  "equal": 0}
    return {"supervised_tokens": 5000, "difference": difference,
            "rows": [row("on_policy", on, on_ci), row("off_policy", off, off_ci), row("self", 6.0, [6.0, 6.0], 3),
                     row("random", 1.0, [1.0, 1.0], 3)]}


def test_the_conclusion_follows_the_numbers():
    said = conclusion(summary(1.9, [1.8, 2.0], 1.5, [1.4, 1.6]))
    assert "on-policy is higher: the paired 95 % interval excludes zero" in said
    assert "+0.400 [+0.350, +0.450] (higher on 9 of 10 questions, lower on 1)" in said
    said = conclusion(summary(1.5, [1.4, 1.6], 1.9, [1.8, 2.0], (-0.45, -0.35), 1))
    assert "off-policy is higher" in said and "-0.400" in said
    # the separate intervals overlap, but question by question the difference is resolved: the paired one decides
    said = conclusion(summary(1.6, [1.4, 1.8], 1.5, [1.3, 1.7], (0.02, 0.18)))
    assert "on-policy is higher: the paired 95 % interval excludes zero" in said
    said = conclusion(summary(1.6, [1.4, 1.8], 1.5, [1.3, 1.7], (-0.05, 0.25), 6))
    assert "no difference between the arms is resolved" in said
    assert "self 6.000, random 1.000" in said and "Bounds on 3 questions" in said


def test_the_table_has_a_row_per_drafter_with_its_interval():
    rows = table_rows(summary(1.9, [1.8, 2.0], 1.5, [1.4, 1.6]))
    assert [r["drafter"] for r in rows] == ["on_policy", "off_policy", "self", "random"]
    assert rows[0]["tau_ci95"] == "[1.800, 2.000]" and rows[0]["accept@5"] == 0.05


def test_tau_per_category_side_by_side():
    from eagledata.quality.report import category_rows

    def doc(**cats):
        return {"per_category": {c: {"questions": 10, "tau_mean": t, "tau_ci95": [t - 0.1, t + 0.1]}
                                 for c, t in cats.items()}}

    rows = category_rows({"on_policy": doc(math=1.5, writing=1.25), "ngram": doc(math=1.1)})
    assert [r["category"] for r in rows] == ["math", "writing"]
    assert rows[0] == {"category": "math", "questions": 10, "on_policy": "1.500 [1.400, 1.600]",
                       "ngram": "1.100 [1.000, 1.200]"}
    assert rows[1]["ngram"] is None and rows[1]["on_policy"] == "1.250 [1.150, 1.350]"


def test_a_trained_drafter_that_does_not_beat_ngram_is_reported_as_such():
    from eagledata.quality.report import baseline_verdict

    s = summary(1.9, [1.8, 2.0], 1.5, [1.4, 1.6])
    assert baseline_verdict(s) == ""
    s["rows"].append(dict(s["rows"][-1], drafter="ngram", tau_mean=1.6, tau_ci95=[1.5, 1.7]))
    assert baseline_verdict(s) == ("on_policy 1.900 beats ngram (1.600); off_policy 1.500 does not beat ngram "
                                   "(1.600).")
