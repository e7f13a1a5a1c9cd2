"""A learning curve (issue 62): τ of both arms against the supervised tokens they are trained on, every point a
finished experiment with its tau.json. The experiment itself makes the data once and is the curve's largest point
(at `train_tokens`, or all its tokens); each size of `curve_tokens` is an experiment of its own,
`<experiment>-t<tokens>`, on that data (`data_from`: prompts, records, hidden states and the greedy trace linked) with
`train_tokens` set (`curve_configs`), so a size costs its two trainings and their τ. vLLM's count and the reference
drafters are the largest point's; a size measures the two arms only.

The trend is a fit, and said to be one (`fit_curve`): τ = a + b · log2(tokens / 1,000) per arm by least squares over
the sizes, and the same for on-policy minus off-policy (does the lead grow or vanish with data?); its 95 % intervals
from refitting on the questions resampled (the same questions at every size, resampled together). With one trainer
seed a size, a seed's spread is not in them."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .arms import ARMS
from .config import QualityConfig
from .stages import stage_cost_seconds
from .tau import paired_difference, question_taus, read_tau, trained_tokens

DIFFERENCE = "on_policy - off_policy"


def size_name(experiment: str, tokens: int) -> str:
    return f"{experiment}-t{tokens}"


def curve_configs(config: QualityConfig) -> list[QualityConfig]:
    """The experiments of the curve's smaller sizes, smallest first: each on `config`'s data, at its size."""
    if config.train_tokens is not None and any(t >= config.train_tokens for t in config.curve_tokens):
        raise InputError(f"every size must be under train_tokens {config.train_tokens:,} (the largest point, the "
                         f"experiment itself), got {sorted(config.curve_tokens)}", field="curve_tokens")
    return [replace(config, experiment=size_name(config.experiment, t), data_from=config.experiment, train_tokens=t,
                    curve_tokens=[], ablation_tokens=None, vllm_check=False, bounds=[])
            for t in sorted(config.curve_tokens)]


def point_names(experiment: str, sizes: Sequence[int]) -> list[str]:
    """The experiments of a curve's points: the experiment itself (its largest), then each smaller size's."""
    return [experiment, *(size_name(experiment, t) for t in sorted(sizes))]


def run_sizes(config: QualityConfig, seams: Any = None) -> list[str]:
    """Each smaller size's experiment, smallest first (after `config`'s own run, which made the data): finished ones
    kept, as any experiment's stages are. The names of every point, the experiment's own first."""
    from .experiment import run_experiment

    for size in curve_configs(config):
        run_experiment(size, seams)
    return point_names(config.experiment, config.curve_tokens)


def read_points(root: Path, names: Sequence[str]) -> list[tuple[int, dict[str, dict[str, Any]]]]:
    """(supervised tokens, each arm's tau.json) of each finished experiment named, by tokens."""
    points = []
    for name in names:
        docs = {arm: read_tau(root / name / arm / "tau.json") for arm in ARMS}
        points.append((trained_tokens(docs, root / name), docs))
    return sorted(points, key=lambda p: p[0])


def curve_report(root: Path, names: Sequence[str], *, seed: int = 0) -> dict[str, Any]:
    """What a curve's report shows and publishes, from its finished experiments under `root` (a run's outputs or
    the kept copies in git): per-size rows, paired differences, the fit with its statement, and each size's cost."""
    points = read_points(root, names)
    fit = fit_curve(points, seed=seed)
    return {"points": points, "rows": curve_rows(points), "differences": size_differences(points, seed=seed),
            "fit": fit, "statement": curve_statement(fit), "costs": size_costs(root, names)}


def curve_rows(points: Sequence[tuple[int, dict[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per size and arm: τ with its interval over questions and first-position acceptance, measured."""
    return [{"supervised_tokens": tokens, "arm": arm, "tau_mean": docs[arm]["tau_mean"],
             "tau_ci95": docs[arm]["tau_ci95"], "first_position_acceptance": docs[arm]["per_position_acceptance"][0],
             "questions": docs[arm]["questions"]}
            for tokens, docs in points for arm in ARMS]


def size_costs(root: Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """Per experiment (a size), what its own stages cost, from their stage files (`stages/*.json`; a stage linked
    from another experiment, `linked_from`, is that one's cost and left out): the longer arm's training (the two
    train side by side on CPU), τ and everything else in seconds, each stage's tries cut before it included
    (`stages.stage_cost_seconds`; `cut_seconds` says how much of the total they were), their total, and the peak
    memory of any of its stages (`peaks.stage_peak`; None where none was measured)."""
    rows = []
    for name in names:
        stages = [(path.stem, json.loads(path.read_text())) for path in sorted((root / name / "stages").glob("*.json"))]
        own = [(stage, doc) for stage, doc in stages if "linked_from" not in doc]
        # the arms train side by side: the longer one is the wall time
        longest = max((doc for stage, doc in own if stage.startswith("train-")), key=stage_cost_seconds, default=None)
        counted = [doc for stage, doc in own if not stage.startswith("train-")] + ([longest] if longest else [])
        train = stage_cost_seconds(longest) if longest else 0.0
        tau = sum(stage_cost_seconds(doc) for stage, doc in own if stage.startswith("tau-"))
        total = sum(stage_cost_seconds(doc) for doc in counted)
        peaks = [doc["peak_mib"] for _, doc in own if doc.get("peak_mib") is not None]
        rows.append({"experiment": name, "train_seconds": train, "tau_seconds": round(tau, 1),
                     "other_seconds": round(total - train - tau, 1), "seconds": round(total, 1),
                     "cut_seconds": round(sum(sum(doc.get("cut_tries_seconds") or ()) for doc in counted), 1),
                     "peak_mib": max(peaks, default=None)})
    return rows


def size_differences(points: Sequence[tuple[int, dict[str, dict[str, Any]]]], *,
                     seed: int = 0) -> list[dict[str, Any]]:
    """Per size, on-policy minus off-policy question by question (`tau.paired_difference`), measured."""
    return [{"supervised_tokens": tokens, **paired_difference(docs[ARMS[0]], docs[ARMS[1]], seed=seed)}
            for tokens, docs in points]


def _question_taus(points: Sequence[tuple[int, dict[str, dict[str, Any]]]]) -> tuple[list[str], np.ndarray]:
    """The questions every point measured with a τ, and τ[arm, size, question]."""
    per = [{arm: question_taus(docs[arm]) for arm in ARMS} for _, docs in points]
    shared = sorted(set.intersection(*(set(p[arm]) for p in per for arm in ARMS)))
    if not shared:
        raise InputError("the curve's points share no question with a τ")
    return shared, np.array([[[p[arm][q] for q in shared] for p in per] for arm in ARMS])


def fit_curve(points: Sequence[tuple[int, dict[str, dict[str, Any]]]], *, resamples: int = 2000,
              seed: int = 0) -> dict[str, Any]:
    """τ = a + b · log2(tokens / 1,000) for each arm and for their difference, least squares over the sizes; `b`
    (τ per doubling of the supervised tokens) and `a` with 95 % intervals from refitting on resampled questions, and
    each size's residual (measured minus fitted): the intervals hold the questions' spread, not how far a straight
    line in log tokens is from the points' shape, which the residuals show. A fit over few sizes: it describes the
    points, it does not measure a size it was not given."""
    if len(points) < 2:
        raise InputError(f"a fit needs two sizes or more, got {len(points)}", field="curve_tokens")
    questions, taus = _question_taus(points)
    x = np.log2(np.array([t for t, _ in points], dtype=float) / 1000)
    series = {**{arm: taus[i] for i, arm in enumerate(ARMS)}, DIFFERENCE: taus[0] - taus[1]}  # [size, question]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(questions), size=(resamples, len(questions)))
    out: dict[str, Any] = {"sizes": [t for t, _ in points], "questions": len(questions), "resamples": resamples,
                           "form": "tau = a + b * log2(supervised_tokens / 1000)"}
    for name, y in series.items():
        b, a = np.polyfit(x, y.mean(axis=1), 1)
        boot = np.array([np.polyfit(x, y[:, p].mean(axis=1), 1) for p in picks])  # [resamples, (b, a)]
        (b_lo, a_lo), (b_hi, a_hi) = np.quantile(boot, [0.025, 0.975], axis=0)
        out[name] = {"per_doubling": float(b), "per_doubling_ci95": [float(b_lo), float(b_hi)],
                     "at_1000": float(a), "at_1000_ci95": [float(a_lo), float(a_hi)],
                     "residuals": [float(r) for r in y.mean(axis=1) - (a + b * x)]}
    return out


def curve_statement(fit: dict[str, Any]) -> str:
    """The fit in words, labelled as one."""
    def said(name: str) -> str:
        f = fit[name]
        lo, hi = f["per_doubling_ci95"]
        return f"{f['per_doubling']:+.3f} [{lo:+.3f}, {hi:+.3f}]"

    d = fit[DIFFERENCE]["per_doubling_ci95"]
    lead = ("the lead of on-policy grows with data" if d[0] > 0 else "the lead of on-policy shrinks with data"
            if d[1] < 0 else "no change of the difference with data is resolved")
    sizes = ", ".join(f"{t:,}" for t in fit["sizes"])
    misses = ", ".join(f"{round(r, 3) + 0.0:+.3f} at {t:,}"  # + 0.0: no "-0.000"
                       for t, r in zip(fit["sizes"], fit[DIFFERENCE]["residuals"], strict=True))
    return (f"Fit (not a measurement) over {len(fit['sizes'])} sizes ({sizes} supervised tokens an arm), "
            f"τ = a + b·log2(tokens / 1,000), 95 % intervals from {fit['resamples']:,} resamplings of the "
            f"{fit['questions']} questions: τ per doubling of the data {said('on_policy')} on-policy, "
            f"{said('off_policy')} off-policy; on-policy minus off-policy {said(DIFFERENCE)} per doubling: {lead}. "
            f"Measured minus fitted, on-policy minus off-policy: {misses}.")


def plot_curve(points: Sequence[tuple[int, dict[str, dict[str, Any]]]], fit: dict[str, Any] | None = None,
               axes: Any = None) -> Any:
    """Left: τ of both arms (95 % interval over questions) against the supervised tokens, log scale, with the fit's
    lines where given; right: first-position acceptance."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    left, right = axes
    tokens = np.array([t for t, _ in points], dtype=float)
    for arm in ARMS:
        means = [docs[arm]["tau_mean"] for _, docs in points]
        lo = [m - docs[arm]["tau_ci95"][0] for m, (_, docs) in zip(means, points)]
        hi = [docs[arm]["tau_ci95"][1] - m for m, (_, docs) in zip(means, points)]
        line = left.errorbar(tokens, means, yerr=[lo, hi], fmt="o", capsize=4, label=f"{arm} (measured)")
        if fit is not None:
            xs = np.geomspace(tokens.min(), tokens.max(), 50)
            left.plot(xs, fit[arm]["at_1000"] + fit[arm]["per_doubling"] * np.log2(xs / 1000), "--",
                      color=line[0].get_color(), label=f"{arm} (fit)")
        right.plot(tokens, [docs[arm]["per_position_acceptance"][0] for _, docs in points], "-o", label=arm)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("supervised tokens per arm")
        ax.legend()
    left.set_ylabel("τ (tokens per verifier forward)")
    left.set_title("τ on MT-Bench against the training data")
    right.set_ylabel("first-position acceptance")
    return axes
