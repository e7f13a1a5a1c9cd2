"""τ over an evaluation set, and `tau.json` (pure: no torch, no model).

A question's τ pools its turns (tokens the verifying forwards yielded ÷ those forwards); `tau_mean` is the mean over
questions, and `tau_ci95` a percentile bootstrap over questions, the independent units (turns of one question and
tokens of one answer are not). Per-position acceptance pools every verifying forward, as vLLM's per-position
counters do: position i's share of forwards that accepted at least i drafts; 1 + their sum is the pooled τ
(`tau_pooled`), which weighs questions by their forwards and so differs a little from `tau_mean`.

Two drafters measured on the same questions are compared question by question (`paired_difference`): the greedy
output is the verifier's in both, so each question's τ differs only by the drafter, and the paired interval is much
narrower than the two separate intervals would suggest. Over several experiments (`seeds_difference`, and
`python -m eagledata.quality.tau DIR...` over experiments' folders) data draws and trainer seeds are resampled as
well as questions.
"""
from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, open_input, run_command

# The fields of tau.json that DESIGN.md's canonical-experiment contract names (other fields may follow them);
# `target` there is the verifier's checkpoint folder (the contract keeps the word).
TAU_FIELDS = ("target", "eval_set", "questions", "turns", "k", "greedy", "tau_mean", "tau_ci95",
              "per_position_acceptance", "supervised_tokens", "samples", "train_seconds")


@dataclass(frozen=True)
class QuestionRun:
    """One question decoded: per turn, the drafts each verifying forward accepted (0..k)."""

    id: int | str
    accepted: list[list[int]]  # [turn][verifying forward]
    output_tokens: int = 0  # tokens emitted over its turns (the prefill's first token of each included)
    category: str = ""  # MT-Bench's category (writing, roleplay, reasoning, math, coding, extraction, stem, ...)
    drafted: list[list[int]] | None = None  # [turn][verifying forward]: the chain's length (None: k every time)

    @property
    def steps(self) -> int:
        return sum(len(t) for t in self.accepted)

    @property
    def tau(self) -> float | None:
        steps = self.steps
        return (steps + sum(sum(t) for t in self.accepted)) / steps if steps else None


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the values with replacement)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values to resample")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def question_taus(doc: dict[str, Any]) -> dict[str, float]:
    """A tau.json's τ per question that has one (`per_question`), by question id."""
    return {str(q["id"]): q["tau"] for q in doc.get("per_question", []) if q["tau"] is not None}


def question_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """τ of `a` minus τ of `b`, per question both measured (each tau.json's `per_question`), by question id."""
    taus_a, taus_b = question_taus(a), question_taus(b)
    return {q: taus_a[q] - taus_b[q] for q in taus_a if q in taus_b}


def paired_difference(a: dict[str, Any], b: dict[str, Any], *, resamples: int = 10_000,
                      seed: int = 0) -> dict[str, Any]:
    """τ of `a` minus τ of `b` over the questions both measured: the mean of the per-question differences and its
    percentile bootstrap interval, resampling questions (the pairs) together."""
    diffs = list(question_differences(a, b).values())
    if not diffs:
        raise ValueError("the two tau.json documents share no question with a τ (per_question)")
    lo, hi = bootstrap_ci(diffs, resamples=resamples, seed=seed)
    return {"questions": len(diffs), "mean": float(np.mean(diffs)), "ci95": [lo, hi],
            "higher": sum(d > 0 for d in diffs), "lower": sum(d < 0 for d in diffs),
            "equal": sum(d == 0 for d in diffs)}


def seeds_difference(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], *, draws: Sequence[Any] | None = None,
                     level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """τ of `a` minus τ of `b` over several trainings of both (one pair of tau.json per experiment, the same
    questions), and an interval that resamples every level the result could have come out otherwise at: the data
    draws (`draws`: the draw each pair was trained on, compared by equality, e.g. its prompts stage's settings;
    None: all one draw), the trainer seeds within a draw, and the questions (a hierarchical percentile bootstrap).
    Each draw weighs the same, whatever its seeds. One seed's paired interval holds the questions' spread only; a
    seed or a draw that moves every question's τ is uncertainty too, and only more of them show it."""
    diffs = [question_differences(a, b) for a, b in pairs]
    shared = sorted(set.intersection(*(set(d) for d in diffs))) if diffs else []
    if not shared:
        raise ValueError("the pairs of tau.json documents share no question with a τ (per_question)")
    labels = [None] * len(pairs) if draws is None else list(draws)
    if len(labels) != len(pairs):
        raise ValueError(f"{len(labels)} draws for {len(pairs)} pairs")
    firsts: list[Any] = []  # each draw once, in first-seen order (by equality: a draw may be a settings dict)
    for x in labels:
        if x not in firsts:
            firsts.append(x)
    groups = [[i for i, x in enumerate(labels) if x == g] for g in firsts]
    d = np.array([[per[q] for q in shared] for per in diffs])  # [experiments, questions]
    rng = np.random.default_rng(seed)
    q = rng.integers(0, d.shape[1], size=(resamples, d.shape[1]))  # first: one experiment gives `paired_difference`'s
    m = d[:, q].mean(axis=2)  # [experiments, resamples]: each experiment's mean over the resampled questions
    cols = np.arange(resamples)
    if len(groups) == 1:
        s = rng.integers(0, d.shape[0], size=(resamples, d.shape[0]))
        means = m[s, cols[:, None]].mean(axis=1)
    else:
        sizes = np.array([len(g) for g in groups])
        members = np.array([g + [g[0]] * (sizes.max() - len(g)) for g in groups])  # [draws, most seeds], padded
        chosen = rng.integers(0, len(groups), size=(resamples, len(groups)))  # the draws, resampled
        u = rng.random((resamples, len(groups), sizes.max()))  # then each chosen draw's seeds
        slot_means = np.empty((resamples, len(groups)))
        for j in range(len(groups)):
            g = chosen[:, j]
            n = sizes[g]
            exp = members[g[:, None], np.minimum((u[:, j, :] * n[:, None]).astype(int), n[:, None] - 1)]
            valid = np.arange(sizes.max())[None, :] < n[:, None]
            slot_means[:, j] = (m[exp, cols[:, None]] * valid).sum(axis=1) / n
        means = slot_means.mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    per_draw = [d[g].mean(axis=0) for g in groups]  # each draw's per-question mean over its seeds
    by_question = np.mean(per_draw, axis=0)
    return {"seeds": d.shape[0], "draws": len(groups), "questions": len(shared),
            "mean": float(by_question.mean()), "ci95": [float(lo), float(hi)],
            "per_seed": [float(x) for x in d.mean(axis=1)], "per_draw": [float(x.mean()) for x in per_draw],
            "higher": int((by_question > 0).sum()), "lower": int((by_question < 0).sum()),
            "equal": int((by_question == 0).sum())}


def per_position_acceptance(runs: Sequence[QuestionRun], k: int) -> list[float]:
    """Share of all verifying forwards that accepted at least i drafts, for i = 1..k."""
    accepted = np.asarray([a for r in runs for t in r.accepted for a in t], dtype=int)
    if accepted.size and (accepted.min() < 0 or accepted.max() > k):
        raise ValueError(f"an accepted count outside 0..{k}")
    if not accepted.size:
        return [0.0] * k
    return [float((accepted >= i).mean()) for i in range(1, k + 1)]


def per_category(runs: Sequence[QuestionRun], *, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """τ per MT-Bench category: its questions, the mean of their τ and its percentile bootstrap interval over them
    (a category's 10 questions give a wide one: it says where the drafter helps, not by how much exactly)."""
    by: dict[str, list[float]] = {}
    for r in runs:
        if (t := r.tau) is not None:
            by.setdefault(r.category or "", []).append(t)
    out: dict[str, Any] = {}
    for cat in sorted(by):
        lo, hi = bootstrap_ci(by[cat], resamples=resamples, seed=seed)
        out[cat] = {"questions": len(by[cat]), "tau_mean": float(np.mean(by[cat])), "tau_ci95": [lo, hi]}
    return out


def per_turn(runs: Sequence[QuestionRun]) -> dict[str, dict[str, Any]]:
    """τ pooled over each turn number ("1", "2"): what the drafter does on first turns against later ones, beside
    what it was trained on (summary.json's `turn_shares`)."""
    out: dict[str, dict[str, Any]] = {}
    for turn in range(1, max((len(r.accepted) for r in runs), default=0) + 1):
        accepted = [a for r in runs if len(r.accepted) >= turn for a in r.accepted[turn - 1]]
        out[str(turn)] = {"verify_forwards": len(accepted),
                          "tau_pooled": (len(accepted) + sum(accepted)) / len(accepted) if accepted else None}
    return out


def summarize(runs: Sequence[QuestionRun], *, k: int, verifier: str, eval_set: str, samples: int | None = None,
              supervised_tokens: int | None = None, train_seconds: float | None = None, resamples: int = 10_000,
              seed: int = 0, **extra: Any) -> dict[str, Any]:
    """The tau.json document: the contract's fields in its order, then `tau_pooled`, counts and `extra`.

    Questions whose every turn ended at its first token (no verifying forward) have no τ: they are counted in
    `questions_without_steps` and left out of the mean."""
    taus = [t for r in runs if (t := r.tau) is not None]
    if not taus:
        raise ValueError("no question had a verifying forward: nothing to measure")
    lo, hi = bootstrap_ci(taus, resamples=resamples, seed=seed)
    steps = sum(r.steps for r in runs)
    pooled = (steps + sum(a for r in runs for t in r.accepted for a in t)) / steps
    doc: dict[str, Any] = dict(
        target=verifier, eval_set=eval_set, questions=len(runs), turns=sum(len(r.accepted) for r in runs), k=k,
        greedy=True, tau_mean=float(np.mean(taus)), tau_ci95=[lo, hi],
        per_position_acceptance=per_position_acceptance(runs, k), supervised_tokens=supervised_tokens,
        samples=samples, train_seconds=train_seconds, tau_pooled=pooled, verify_forwards=steps,
        output_tokens=sum(r.output_tokens for r in runs), questions_without_steps=len(runs) - len(taus),
        bootstrap={"resamples": resamples, "seed": seed, "level": 0.95},
        per_category=per_category(runs, resamples=resamples, seed=seed), per_turn=per_turn(runs),
        per_question=[{"id": r.id, "category": r.category, "tau": r.tau, "verify_forwards": r.steps} for r in runs])
    if any(r.drafted is not None for r in runs):
        # forwards that carried a draft: vLLM's `num_drafts` counts only those (1 + accepted ÷ drafts)
        drafts = sum(r.steps if r.drafted is None else sum(d > 0 for t in r.drafted for d in t) for r in runs)
        doc.update(forwards_with_draft=drafts,
                   tau_per_draft=(drafts + sum(a for r in runs for t in r.accepted for a in t)) / drafts
                   if drafts else None)
    doc.update(extra)
    return doc


def check_tau(doc: dict[str, Any]) -> None:
    """Refuse a document that breaks the contract (a missing field, greedy false, an interval not around the
    mean, acceptance not falling with position)."""
    missing = [f for f in TAU_FIELDS if f not in doc]
    if missing:
        raise ValueError(f"tau.json lacks {missing}")
    lo, hi = doc["tau_ci95"]
    acc = doc["per_position_acceptance"]
    if doc["greedy"] is not True or len(acc) != doc["k"]:
        raise ValueError("tau.json must be greedy with one acceptance per draft position")
    if not (1 <= lo <= doc["tau_mean"] <= hi <= doc["k"] + 1) or not all(math.isfinite(x) for x in (lo, hi)):
        raise ValueError(f"tau_mean {doc['tau_mean']} and its interval {doc['tau_ci95']} are not within 1..k+1")
    if any(b > a for a, b in zip(acc, acc[1:])) or not all(0 <= a <= 1 for a in acc):
        raise ValueError(f"per-position acceptance must fall with position, within 0..1: {acc}")


def write_tau(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write tau.json (checked, then atomically: a reader never sees half a file)."""
    check_tau(doc)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_tau(path: str | Path) -> dict[str, Any]:
    """A checked tau.json; a missing, unreadable or contract-breaking file is an `InputError` naming it."""
    with open_input(path) as f:
        try:
            doc = json.loads(f.read())
            check_tau(doc)
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"not a tau.json: {e}", path) from None
    return dict(doc)


def trained_tokens(docs: dict[str, dict[str, Any]], where: str | Path) -> int:
    """The one count of supervised tokens the drafters of `docs` (tau.json documents by name) were trained on:
    drafters at different counts are not compared, an `InputError` naming `where` and each count."""
    counts = {name: doc.get("supervised_tokens") for name, doc in docs.items()}
    values = set(counts.values())
    if len(values) != 1 or not isinstance(tokens := values.pop(), int):
        raise InputError(f"the drafters were not trained on one count of supervised tokens: {counts}", where)
    return tokens


def data_draw(experiment: Path) -> dict[str, Any] | None:
    """The settings an experiment's conversations were drawn with (`stages/prompts.json`'s `settings`: the data
    seed and the counts), None where the file is missing (a hand-made folder: such experiments count as one draw)."""
    path = experiment / "stages" / "prompts.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("settings")
    except (json.JSONDecodeError, AttributeError):
        raise InputError("not a stage record (JSON object with its settings)", path) from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m eagledata.quality.tau DIR [DIR ...]`: experiments that differ by the trainer's seed or the data
    draw (each DIR an outputs/quality/<name>/ folder), their arms compared: one JSON line per experiment (each arm's
    τ, the paired difference resampled with the run's own seed as its summary.json's was, its draw), then the
    difference over all of them (`seeds_difference`, draws and seeds resampled). An experiment's draw is its prompts
    stage's settings (`stages/prompts.json`: the same settings, the same conversations; `data_from` links that file,
    so experiments sharing data share the draw)."""
    import argparse

    prog = "python -m eagledata.quality.tau"
    parser = argparse.ArgumentParser(prog=prog, description="Compare the arms of experiments that differ by the "
                                     "trainer's seed or the data draw, each alone and over all of them.")
    parser.add_argument("experiments", nargs="+", type=Path, help="outputs/quality/<name>/ folders")
    parser.add_argument("--arms", nargs=2, default=["on_policy", "off_policy"], metavar=("A", "B"),
                        help="the difference is A minus B (default: on_policy off_policy)")
    args = parser.parse_args(argv)
    a, b = args.arms

    def body() -> None:
        pairs = [(read_tau(d / a / "tau.json"), read_tau(d / b / "tau.json")) for d in args.experiments]
        draws = [data_draw(d) for d in args.experiments]
        for d, (x, y), draw in zip(args.experiments, pairs, draws):
            seed = x.get("bootstrap", {}).get("seed")  # the run's seed: its summary.json's difference, drawn alike
            try:
                difference = paired_difference(x, y, seed=seed or 0)
            except ValueError as e:
                raise InputError(str(e), d) from None
            print(json.dumps({"experiment": str(d), "seed": seed, "draw": draw,
                              a: x["tau_mean"], b: y["tau_mean"], "difference": difference}))
        try:
            print(json.dumps({"experiments": len(pairs), "difference": seeds_difference(pairs, draws=draws)}))
        except ValueError as e:
            raise InputError(f"{e}: {', '.join(map(str, args.experiments))}") from None

    return run_command(prog, body)


if __name__ == "__main__":
    sys.exit(main())
