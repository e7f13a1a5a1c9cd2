"""The canonical experiment, stage by stage, with resume: the same ShareGPT prompts answered by the verifier itself
(`on_policy`) and by the data set (`off_policy`), both assembled and trimmed to equal supervised tokens (`arms.py`), the
verifier's hidden states over each (transformers, CPU or GPU, speculators' layout with `token_freq.pt`), a drafter
trained on each by speculators 0.9.0's own loop (in its environment), τ of each on MT-Bench (k, both turns, greedy),
each arm's checkpoint measured again by vLLM's own speculative decoding (`vllm_tau.py`: the run fails when the two
counts differ by more than 0.02), the two bounds (`self`: k + 1, `random`: ≈ 1) and the two free baselines the arms
must beat (`ngram`: prompt lookup; `eagle3-random`: the EAGLE-3 path untrained).

Everything lands under `<output_dir>/quality/<name>/` (DESIGN.md's canonical experiment): `prompts.jsonl`,
`<arm>/records.jsonl`, `<arm>/samples.jsonl`, `<arm>/hidden_states/speculators/` (the export trained on),
`<arm>/checkpoint/` (the trained drafter as speculators saves it), `greedy_trace.pt` (the verifier's greedy decode of
the questions, recorded once: every drafter's τ is measured against it, `greedy_trace.py`), `<arm>/tau.json`,
`<arm>/vllm_tau.json`, `bounds/<drafter>/tau.json`,
`stages/<stage>.json` (each finished stage's result: a rerun skips it) and `summary.json`. A stage that stopped
midway runs again (extraction resumes by sample, training from its last checkpoint, `checkpoint_every`; τ starts
over), and the stopped try's seconds count in the stage's cost (`stages/<stage>.tries`, `stages.timed_try`).

The stages live in rooms of their own, composed here by `Experiment.run`: the data stages (`arm_data.ArmData`), the
trainer's and τ's (`drafter_stages.DrafterStages`), and what both read (`workspace.Workspace`: settings, files, resume
store, the verifier loaded once). What loads a model, reads a tokenizer or runs a command is a parameter of
`run_experiment` (`ExperimentSeams`; tests inject tiny ones).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import atomic_write_text
from .arm_data import ArmData
from .arms import ARMS, supervised, turn_shares
from .config import QualityConfig
from .drafter_stages import DrafterStages
from .layout import keep
from .report import baseline_verdict
from .stages import share_data
from .tau import paired_difference, read_tau
from .workspace import ExperimentSeams, Workspace

# ExperimentSeams is defined in workspace.py and imported from here by the notebook and the tests (the callers).
__all__ = ["Experiment", "ExperimentSeams", "main", "run_experiment", "summary_rows"]


def summary_rows(taus: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm or reference drafter from its tau.json: what the notebook's table shows."""
    rows = []
    for name, doc in taus.items():
        rows.append({"drafter": name, "samples": doc.get("samples"), "supervised_tokens": doc.get("supervised_tokens"),
                     "train_seconds": doc.get("train_seconds"), "questions": doc["questions"], "turns": doc["turns"],
                     "k": doc["k"], "tau_mean": doc["tau_mean"], "tau_ci95": doc["tau_ci95"],
                     "tau_pooled": doc.get("tau_pooled"), "per_position_acceptance": doc["per_position_acceptance"],
                     "per_turn": doc.get("per_turn")})
    return rows


# -- the run ---------------------------------------------------------------------------------------------------
@dataclass
class Experiment:
    """The rooms composed: `workspace` (what all read), `arm_data` (the data stages), `drafter_stages` (training and
    τ); `run` calls their stages in order."""

    config: QualityConfig
    seams: ExperimentSeams = field(default_factory=ExperimentSeams)

    def __post_init__(self) -> None:
        self.workspace = Workspace(self.config, self.seams)
        self.files = self.workspace.files
        self.arm_data = ArmData(self.workspace)
        self.drafter_stages = DrafterStages(self.workspace, self.arm_data)

    def run(self) -> dict[str, Any]:
        """Every stage in order (finished ones kept), then `summary.json`."""
        if self.config.threads:
            import torch

            torch.set_num_threads(self.config.threads)
        started = time.monotonic()
        self.seams.say(f"quality experiment {self.config.experiment!r} under {self.files.root}")
        share_data(self.config, self.seams.say)
        asks = self.arm_data.prompts()
        for arm in ARMS:
            self.arm_data.arm_records(arm, asks)
        assembled = self.arm_data.assemble_arms()
        for arm in ARMS:
            self.arm_data.extract_arm(arm)
        self.workspace.free_model()  # the trainer and τ run in other processes: free the verifier here
        self.drafter_stages.train_arms()
        taus, vllm = {}, {}
        for arm in ARMS:
            taus[arm] = self.drafter_stages.tau_arm(arm)
            if self.config.vllm_check:
                vllm[arm] = self.drafter_stages.vllm_arm(arm)
        for drafter in self.config.bounds:
            self.drafter_stages.tau_bound(drafter)
        tokens, table = assembled["supervised_tokens"], assembled["table"]
        if self.arm_data.subset():  # a curve's size or an ablation: some of the training samples, as many tokens
            trained = {arm: self.arm_data.train_samples(arm) for arm in ARMS}
            tokens = supervised(trained[ARMS[0]])
            table = [{**row, **self.trained_row(row["arm"], trained[row["arm"]])} for row in table]
        docs = {arm: read_tau(self.files.tau(arm)) for arm in ARMS}
        docs.update({d: read_tau(self.files.bound(d)) for d in self.config.bounds})
        summary = {"name": self.config.experiment, "target": str(self.workspace.verifier),  # the key tau.json has too
                   "config": dataclasses.asdict(self.config),
                   "supervised_tokens": tokens, "arms": table, "rows": summary_rows(docs),
                   "epoch_losses": {arm: docs[arm].get("epoch_losses") for arm in ARMS},
                   "difference": paired_difference(docs["on_policy"], docs["off_policy"], seed=self.config.seed),
                   "per_category": {name: doc.get("per_category", {}) for name, doc in docs.items()
                                    if doc["questions"] == docs[ARMS[0]]["questions"]},
                   "vllm": vllm if self.config.vllm_check else None,
                   "stage_seconds": self.workspace.stages.seconds(),
                   "stage_peak_mib": self.workspace.stages.peaks(),
                   "seconds_this_run": round(time.monotonic() - started, 1)}
        summary["baseline_verdict"] = baseline_verdict(summary)
        atomic_write_text(self.files.summary, json.dumps(summary, indent=1, default=str) + "\n")
        if self.config.keep_dir:
            into = Path(self.config.keep_dir)
            self.seams.say(f"kept {len(keep(self.files.root, into))} files in {into / self.config.experiment}")
        for arm, line in taus.items():
            self.seams.say(f"{arm}: τ {line['tau_mean']:.3f} [{line['tau_ci95'][0]:.3f}, {line['tau_ci95'][1]:.3f}]"
                           f" over {line['questions']} questions, supervised tokens {tokens}")
        return summary

    def trained_row(self, arm: str, trained: list[Any]) -> dict[str, Any]:
        """What an arm trained on where it trained on some of its samples (summary.json's `arms`)."""
        return {"trained_samples": len(trained), "trained_tokens": supervised(trained),
                "trained_turn_samples": turn_shares(trained)["turn_samples"],
                "trained_cut_answers": len({s.id for s in trained} & self.arm_data.cut_ids(arm))}


def run_experiment(config: QualityConfig, seams: ExperimentSeams | None = None) -> dict[str, Any]:
    """The whole experiment (`Experiment.run`): what `make quality` and quality.ipynb call."""
    return Experiment(config, seams or ExperimentSeams()).run()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m eagledata.quality.experiment [--flag VALUE ...]`: the experiment without the notebook (flags from
    `QualityConfig`); prints the summary's rows as JSON lines."""
    import argparse

    from ..errors import command_prog, run_command

    prog = command_prog("eagledata-quality", "eagledata.quality.experiment")
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    QualityConfig.add_arguments(parser)
    config = QualityConfig.from_args(parser.parse_args(argv))
    from ..notebooks import generate_notebook  # this CLI is a caller: it injects the notebook runner


    def body() -> None:
        for row in run_experiment(config, ExperimentSeams(generate=generate_notebook))["rows"]:
            print(json.dumps(row))

    return run_command(prog, body)


if __name__ == "__main__":
    sys.exit(main())
