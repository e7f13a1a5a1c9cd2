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


def test_tau_per_turn_beside_what_each_arm_trained_on():
    from eagledata.quality.report import turn_table

    doc = summary(1.9, [1.8, 2.0], 1.5, [1.4, 1.6])
    turns = {"on_policy": ({"1": (10, 2.0), "2": (8, 1.75)}, {"1": 0.6, "2": 0.4}),
             "off_policy": ({"1": (12, 1.5), "2": (9, 1.5)}, {"1": 0.7, "2": 0.3})}
    for r in doc["rows"]:
        if r["drafter"] in turns:
            r["per_turn"] = {t: {"verify_forwards": n, "tau_pooled": tau}
                             for t, (n, tau) in turns[r["drafter"]][0].items()}
        else:  # the bounds, on 3 questions: not the arms' questions, so not beside them
            r["per_turn"] = {"1": {"verify_forwards": 3, "tau_pooled": 6.0}}
    doc["arms"] = [{"arm": a, "turn_shares": shares} for a, (_, shares) in turns.items()]
    rows = turn_table(doc)
    assert [(r["drafter"], r["turn"], r["tau_pooled"], r["trained_share"]) for r in rows] == [
        ("on_policy", 1, 2.0, 0.6), ("on_policy", 2, 1.75, 0.4), ("off_policy", 1, 1.5, 0.7),
        ("off_policy", 2, 1.5, 0.3)]
    # a curve's size trains on some samples: the shares are of those (13 of 177 turn 2, not the data's 0.4)
    doc["arms"][0]["trained_turn_samples"] = {"1": 164, "2": 13}
    assert [r["trained_share"] for r in turn_table(doc)] == [0.9266, 0.0734, 0.7, 0.3]
    del doc["rows"][1]["per_turn"]  # a summary made before rows carried per_turn: that drafter has no row
    assert [r["drafter"] for r in turn_table(doc)] == ["on_policy", "on_policy"]


def test_the_losses_are_drawn_per_arm_train_and_validation():
    import matplotlib

    matplotlib.use("Agg")
    from eagledata.quality.report import plot_losses

    epochs = [{"epoch": e, "train_loss": 10.0 - e, "validation_loss": 12.0 - e / 2} for e in range(3)]
    ax = plot_losses({"epoch_losses": {"on_policy": epochs, "off_policy": epochs[:2]}})
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines["on_policy validation"] == [12.0, 11.5, 11.0] and lines["off_policy train"] == [10.0, 9.0]
