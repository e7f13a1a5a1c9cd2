"""How much of a quality experiment's data a later turn re-reads of its previous turn's sample
(`training.assembly.extraction_cost`: `reread_tokens`, `whole_prefix_turns`), per arm: the experiment's own prompts
and records stages (the settings of `make quality-curve` unless told), then `assemble` on each arm's records; with
both arms, also over what the experiment extracts and trains (its assemble stage: the turns both arms have, at equal
supervised tokens, and the validation samples).

    PYTHONPATH=lib .venv/bin/python bench/reread_history.py --conversations 1600            # off-policy, ~30 s
    PYTHONPATH=lib .venv/bin/python bench/reread_history.py --conversations 200 --on-policy  # + vLLM's answers

Results and what they say: bench/README.md, "What the samples repeat"."""
from __future__ import annotations

import argparse
import json

from eagledata.notebooks import generate_notebook
from eagledata.quality.config import QualityConfig
from eagledata.quality.experiment import Experiment, ExperimentSeams
from eagledata.training import AssemblyPolicy
from eagledata.training.assembly import assemble, extraction_cost

KEYS = ("samples", "later_turns", "tokens", "loss_tokens", "reread_tokens", "whole_prefix_turns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=1600)
    parser.add_argument("--on-policy", action="store_true", help="regenerate the on-policy arm with vLLM too")
    parser.add_argument("--output-dir", default="outputs/bench")
    args = parser.parse_args()
    config = QualityConfig(experiment=f"reread-{args.conversations}", output_dir=args.output_dir,
                           conversations=args.conversations)
    experiment = Experiment(config, ExperimentSeams(generate=generate_notebook))
    asks = experiment.arm_data.prompts()
    vocab = int(experiment.workspace.model().config.vocab_size)
    for arm in ["off_policy"] + (["on_policy"] if args.on_policy else []):
        experiment.arm_data.arm_records(arm, asks)
        stats = assemble([experiment.files.records(arm)], policy=AssemblyPolicy(max_length=config.sample_tokens),
                         vocab_size=vocab).stats()
        say(f"{arm}, every record", stats)
    if args.on_policy:
        experiment.arm_data.assemble_arms()
        for arm in ("off_policy", "on_policy"):
            say(f"{arm}, as extracted and trained", extraction_cost(experiment.arm_data.samples(arm)))


def say(what: str, stats: dict) -> None:
    print(what, json.dumps({k: stats[k] for k in KEYS}),
          f"re-read {stats['reread_tokens'] / stats['tokens']:.1%} of the tokens")


if __name__ == "__main__":
    main()
