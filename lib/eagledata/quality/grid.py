"""The report card over the grid (`quality_grid.ipynb`, `make quality-grid`): one finished experiment per data draw ×
trainer seed (`<name>-d<draw>-s<seed>`), read back and compared as quality/README.md fixed it before the runs.

Primary analysis: τ_mean(on_policy) − τ_mean(off_policy) over every cell, the 95 % interval of
`tau.seeds_difference` with the cells' draws named (draws, seeds within a draw and questions resampled; each draw
weighs the same): on-policy better when the interval lies above 0, worse below, unresolved otherwise (`verdict`).
Everything else here (per cell, per category, against n-gram, the losses) is secondary: reported, not decided on.

`make quality-grid` keeps each finished cell's small files in git (`keep_dir`: bench/results/quality/, `layout.keep`)
and the report card reads them there: the grid outlives the machine that ran it (a cell takes an hour on 2 cores;
four were lost with a machine once)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .arms import ARMS
from .tau import question_differences, read_tau, seeds_difference


def cell_names(name: str, draws: Sequence[int], seeds: Sequence[int]) -> list[str]:
    """The grid's experiments as `make quality-grid` names them, draw by draw."""
    return [f"{name}-d{d}-s{s}" for d in draws for s in seeds]


@dataclass(frozen=True)
class Cell:
    """One finished experiment of the grid: its summary.json, each arm's tau.json and the draw its data came from
    (`stages/prompts.json`'s settings: the same settings, the same conversations)."""

    name: str
    summary: dict[str, Any]
    taus: dict[str, dict[str, Any]]
    draw: dict[str, Any]

    @property
    def data_seed(self) -> Any:
        return self.draw.get("data_seed")

    @property
    def seed(self) -> Any:
        return self.summary["config"]["seed"]

    def row(self, drafter: str) -> dict[str, Any] | None:
        return next((r for r in self.summary["rows"] if r["drafter"] == drafter), None)


def read_cells(root: Path, names: Sequence[str]) -> list[Cell]:
    """The named experiments under `root` (`<output_dir>/quality/`), each finished (its summary.json written last
    by the run); one message naming every one that is not, so a partial grid is never reported as the grid."""
    missing = [n for n in names if not (root / n / "summary.json").is_file()]
    if missing:
        raise InputError(f"{len(missing)} of the grid's {len(names)} experiments have not finished (no summary.json): "
                         f"{', '.join(missing)}", root)
    cells = []
    for n in names:
        prompts = root / n / "stages" / "prompts.json"
        try:
            draw = json.loads(prompts.read_text(encoding="utf-8"))["settings"]
        except (OSError, ValueError, KeyError):
            raise InputError("no data draw recorded (a prompts stage with its settings)", prompts) from None
        cells.append(Cell(n, json.loads((root / n / "summary.json").read_text(encoding="utf-8")),
                          {arm: read_tau(root / n / arm / "tau.json") for arm in ARMS}, draw))
    return cells


def primary(cells: Sequence[Cell], *, resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """The primary analysis: on-policy minus off-policy over every cell (`tau.seeds_difference`, the cells' draws
    named), with its `verdict`."""
    result = seeds_difference([(c.taus[ARMS[0]], c.taus[ARMS[1]]) for c in cells],
                              draws=[c.draw for c in cells],
                              resamples=resamples, seed=seed)
    return {**result, "verdict": verdict(result["ci95"])}


def verdict(ci95: Sequence[float]) -> str:
    """The rule fixed before the runs: the interval's side of zero."""
    lo, hi = ci95
    return "on-policy better" if lo > 0 else "off-policy better" if hi < 0 else "unresolved"


def cell_rows(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Per cell (secondary): its draw and seed, the supervised tokens an arm, each arm's τ with its interval over
    questions, the paired difference, n-gram's τ, each arm's last validation loss, and training that went on after
    a stop (`resumed_after_epoch`, where a stage records one)."""
    rows = []
    for c in cells:
        d = c.summary["difference"]
        row: dict[str, Any] = {"experiment": c.name, "data_seed": c.data_seed, "seed": c.seed,
                               "supervised_tokens": c.summary["supervised_tokens"]}
        for arm in ARMS:
            r = c.row(arm) or {}
            row[arm] = r.get("tau_mean")
            row[f"{arm} ci95"] = r.get("tau_ci95")
        row.update({"difference": d["mean"], "difference ci95": d["ci95"], "higher": d["higher"], "lower": d["lower"],
                    "ngram": (c.row("ngram") or {}).get("tau_mean")})
        for arm in ARMS:
            losses = [e["validation_loss"] for e in c.summary.get("epoch_losses", {}).get(arm, [])
                      if e.get("validation_loss") is not None]
            row[f"{arm} last validation loss"] = losses[-1] if losses else None
            row[f"{arm} resumed after epoch"] = c.taus[arm].get("resumed_after_epoch", 0)
        rows.append(row)
    return rows


def category_rows(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Per MT-Bench category (secondary, exploratory: ten questions a category, no interval decided on): each arm's
    τ averaged over the cells, and the per-question difference averaged over the cells and the category's questions,
    with how many of its questions came out higher and lower."""
    by: dict[str, dict[str, list[float]]] = {}
    for c in cells:
        category = {str(q["id"]): q["category"] for q in c.taus[ARMS[0]]["per_question"]}
        for q, diff in question_differences(c.taus[ARMS[0]], c.taus[ARMS[1]]).items():
            by.setdefault(category[q] or "", {}).setdefault(q, []).append(diff)
    rows = []
    for cat in sorted(by):
        means = {arm: float(np.mean([c.summary["per_category"][arm][cat]["tau_mean"] for c in cells
                                     if cat in c.summary["per_category"].get(arm, {})])) for arm in ARMS}
        per_question = [float(np.mean(v)) for v in by[cat].values()]
        rows.append({"category": cat, "questions": len(per_question), **means,
                     "difference": float(np.mean(per_question)),
                     "higher": sum(x > 0 for x in per_question), "lower": sum(x < 0 for x in per_question)})
    return rows


def against_ngram(cells: Sequence[Cell]) -> dict[str, Any]:
    """Each arm's τ against prompt lookup's in every cell: the cells where the arm's interval lies above n-gram's
    mean (`beats`), of those that measured n-gram."""
    measured = [(c, n["tau_mean"]) for c in cells if (n := c.row("ngram"))]
    out: dict[str, Any] = {"cells": len(measured),
                           "ngram": float(np.mean([n for _, n in measured])) if measured else None}
    for arm in ARMS:
        out[arm] = sum((c.row(arm) or {"tau_ci95": [0.0]})["tau_ci95"][0] > n for c, n in measured)
    return out


def conclusion(cells: Sequence[Cell], result: dict[str, Any]) -> str:
    """What the grid measured, in one paragraph, from the numbers: the primary analysis and its verdict, the
    cells' spread, the arms' τ and the free baseline."""
    lo, hi = result["ci95"]
    said = {"on-policy better": "on-policy is better: the interval lies above zero",
            "off-policy better": "off-policy is better: the interval lies below zero",
            "unresolved": "unresolved: the interval includes zero"}[result["verdict"]]
    rows = cell_rows(cells)
    tokens = [r["supervised_tokens"] for r in rows]
    diffs = [r["difference"] for r in rows]
    text = (f"Over {result['draws']} data draws and {result['seeds']} trainings of each arm (trainer seeds within "
            f"each draw; {min(tokens):,}–{max(tokens):,} supervised tokens an arm), on {result['questions']} "
            f"MT-Bench questions (both turns): on-policy minus off-policy is "
            f"**{result['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]** (draws, seeds and questions resampled), higher on "
            f"{result['higher']} questions and lower on {result['lower']}: {said}. Per cell the paired difference "
            f"runs from {min(diffs):+.3f} to {max(diffs):+.3f}; τ on-policy {np.mean([r[ARMS[0]] for r in rows]):.3f} "
            f"and off-policy {np.mean([r[ARMS[1]] for r in rows]):.3f} on average over the cells.")
    ngram = against_ngram(cells)
    if ngram["cells"]:
        text += (f" Prompt lookup (n-gram) gives τ {ngram['ngram']:.3f}: on-policy beats it in {ngram[ARMS[0]]} of "
                 f"{ngram['cells']} cells, off-policy in {ngram[ARMS[1]]}.")
    return text


def plot_grid(cells: Sequence[Cell], result: dict[str, Any], ax: Any = None) -> Any:
    """Each cell's paired difference with its interval over questions, and the primary analysis's (draws, seeds
    and questions resampled) below them; zero marked."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.45 * (len(cells) + 2) + 1))
    rows = cell_rows(cells)
    labels = [f"draw {r['data_seed']}, seed {r['seed']}" for r in rows] + ["all cells (primary)"]
    means = [r["difference"] for r in rows] + [result["mean"]]
    cis = [r["difference ci95"] for r in rows] + [result["ci95"]]
    y = np.arange(len(labels))[::-1]
    for yi, m, (lo, hi), last in zip(y, means, cis, [False] * len(rows) + [True]):
        ax.plot([lo, hi], [yi, yi], color="black" if last else "tab:blue", lw=3 if last else 1.5)
        ax.plot(m, yi, "D" if last else "o", color="black" if last else "tab:blue")
    ax.axvline(0, color="gray", ls="--", lw=1)
    ax.set_yticks(y, labels)
    ax.set_xlabel("τ on-policy − τ off-policy (95 % interval)")
    ax.set_title(f"The grid: {result['verdict']}")
    return ax
