"""The field's ablation (issue 62, speculators #693): at one size, on one experiment's data, the drafters trained on
off-policy answers, on the target's own first turns only, on its own answers every turn on its own history, and on
each without the answers the cap cut, all at equal supervised tokens, with the same validation set, draft vocabulary
(`draft_vocabulary` data), questions and greedy trace. Three experiments of two arms each (`ablation_configs`), then
the comparisons fixed before the runs (`COMPARISONS`), each question by question (`tau.paired_difference`)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import QualityConfig
from .tau import paired_difference, read_tau, trained_tokens

# each variant: its experiment's name suffix and settings
VARIANTS: dict[str, dict[str, Any]] = {"all": {}, "first": {"train_turns": "first"},
                                       "whole": {"train_cut_answers": False}}
# each drafter of the ablation: (variant, arm)
DRAFTERS = {"off-policy": ("all", "off_policy"), "on-policy first turns": ("first", "on_policy"),
            "on-policy multi-turn": ("all", "on_policy"), "off-policy, no cut answers": ("whole", "off_policy"),
            "on-policy multi-turn, no cut answers": ("whole", "on_policy")}
# the comparisons, a minus b, in the order the report gives them
COMPARISONS = [("on-policy multi-turn", "off-policy"), ("on-policy first turns", "off-policy"),
               ("on-policy multi-turn", "on-policy first turns"),
               ("on-policy multi-turn", "on-policy multi-turn, no cut answers"),
               ("off-policy", "off-policy, no cut answers")]


def variant_name(experiment: str, variant: str) -> str:
    return f"{experiment}-abl-{variant}"


def ablation_configs(config: QualityConfig) -> list[QualityConfig]:
    """The ablation's three experiments on `config`'s data, each at `ablation_tokens`, one draft vocabulary."""
    if config.ablation_tokens is None:
        return []
    return [replace(config, experiment=variant_name(config.experiment, v), data_from=config.experiment,
                    train_tokens=config.ablation_tokens, draft_vocabulary="data", curve_tokens=[], ablation_tokens=None,
                    vllm_check=False, bounds=[], **{"train_turns": "all", "train_cut_answers": True, **settings})
            for v, settings in VARIANTS.items()]


def run_ablation(config: QualityConfig, seams: Any = None) -> None:
    """The three experiments (after `config`'s own run, which made the data), kept as any experiment's stages are."""
    from .experiment import run_experiment

    for variant in ablation_configs(config):
        run_experiment(variant, seams)


def read_ablation(root: Path, experiment: str) -> dict[str, dict[str, Any]]:
    """Each drafter's tau.json, from the three experiments under `root`; drafters not at one count of supervised
    tokens are refused."""
    docs = {name: read_tau(root / variant_name(experiment, v) / arm / "tau.json")
            for name, (v, arm) in DRAFTERS.items()}
    trained_tokens(docs, root)
    return docs


def ablation_rows(docs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per drafter: supervised tokens, τ with its interval over questions, first-position acceptance."""
    return [{"drafter": name, "supervised_tokens": d["supervised_tokens"], "samples": d.get("samples"),
             "tau_mean": d["tau_mean"], "tau_ci95": d["tau_ci95"],
             "first_position_acceptance": d["per_position_acceptance"][0]} for name, d in docs.items()]


def comparisons(docs: dict[str, dict[str, Any]], *, seed: int = 0) -> list[dict[str, Any]]:
    """The fixed comparisons, a minus b question by question, each with its interval and the side of zero it falls."""
    out = []
    for a, b in COMPARISONS:
        d = paired_difference(docs[a], docs[b], seed=seed)
        lo, hi = d["ci95"]
        out.append({"a": a, "b": b, **d,
                    "verdict": "a higher" if lo > 0 else "b higher" if hi < 0 else "unresolved"})
    return out


def ablation_statement(docs: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The ablation in words, from the numbers."""
    tokens = next(iter(docs.values()))["supervised_tokens"]
    taus = ", ".join(f"{name} {d['tau_mean']:.3f}" for name, d in docs.items())
    said = "; ".join(f"{r['a']} minus {r['b']} {r['mean']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] "
                     f"({r['verdict']})" for r in rows)
    return f"At {tokens:,} supervised tokens each, one draft vocabulary and validation set: τ {taus}. {said}."


def ablation_report(root: Path, experiment: str, *, seed: int = 0) -> dict[str, Any]:
    """What the ablation's report shows and publishes, from its three finished experiments under `root`: each
    drafter's row, the fixed comparisons and the statement."""
    docs = read_ablation(root, experiment)
    compared = comparisons(docs, seed=seed)
    return {"rows": ablation_rows(docs), "comparisons": compared, "statement": ablation_statement(docs, compared)}
