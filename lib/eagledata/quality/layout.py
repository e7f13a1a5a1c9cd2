"""Where the experiment's files live: `<output_dir>/quality/<experiment>/` (DESIGN.md's canonical experiment), one
path per kind of file, nothing else."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .config import QualityConfig


@dataclass(frozen=True)
class ExperimentFiles:
    root: Path

    def arm(self, arm: str) -> Path:
        return self.root / arm

    def stage(self, name: str) -> Path:
        return self.root / "stages" / f"{name.replace('/', '-')}.json"

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.jsonl"

    def records(self, arm: str) -> Path:
        return self.arm(arm) / "records.jsonl"

    def samples(self, arm: str) -> Path:
        return self.arm(arm) / "samples.jsonl"

    def export(self, arm: str) -> Path:
        return self.arm(arm) / "hidden_states" / "speculators"

    def train_view(self, arm: str) -> Path:
        """The rows the arm's drafter trains on where `train_tokens` takes some of its training samples: the export's
        rows linked, not extracted again (`storage.speculators.rows_view`)."""
        return self.arm(arm) / "train_data"

    def token_freq(self, arm: str) -> Path:
        """The draft vocabulary's counts the arm is trained with (both arms' the same: `shared_vocabulary`)."""
        return self.arm(arm) / "token_freq.pt"

    def checkpoint(self, arm: str) -> Path:
        return self.arm(arm) / "checkpoint"

    def tau(self, arm: str) -> Path:
        return self.arm(arm) / "tau.json"

    def vllm_tau(self, arm: str) -> Path:
        """vLLM's own count of the arm's checkpoint (`vllm_tau.py`), checked against ours on the same questions."""
        return self.arm(arm) / "vllm_tau.json"

    def vllm_ours(self, arm: str) -> Path:
        """Our count of the arm's checkpoint on vLLM's questions, where they are fewer than the arms' (`tau(arm)`
        where they are not)."""
        return self.arm(arm) / "tau.vllm_questions.json"

    @property
    def trace(self) -> Path:
        """The verifier's greedy decode of the questions, every drafter's τ measured against it (`greedy_trace.py`)."""
        return self.root / "greedy_trace.pt"

    def bound(self, drafter: str) -> Path:
        return self.root / "bounds" / drafter / "tau.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


def experiment_files(config: QualityConfig) -> ExperimentFiles:
    return ExperimentFiles(Path(config.output_dir) / "quality" / config.experiment)


# What the report card reads of a finished experiment, and what it is checked by (each stage's settings and seconds,
# vLLM's count, the bounds): ~200 KB an experiment, small enough for git (`keep_dir`). Checkpoints, hidden states and
# records stay under outputs/.
KEPT = ("summary.json", "stages/*.json", "*/tau.json", "*/vllm_tau.json", "*/tau.vllm_questions.json",
        "bounds/*/tau.json")


def keep(experiment: Path, into: Path) -> list[Path]:
    """Copy a finished experiment's `KEPT` files to `into/<its name>/` (the same layout, so `grid.read_cells` reads
    them there), replacing an earlier copy whole; an experiment without its summary.json is refused."""
    if not (experiment / "summary.json").is_file():
        raise InputError("not finished (no summary.json): nothing kept", experiment)
    dest = into / experiment.name
    if dest.exists():
        shutil.rmtree(dest)
    kept = []
    for pattern in KEPT:
        for src in sorted(experiment.glob(pattern)):
            target = dest / src.relative_to(experiment)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            kept.append(target)
    return kept
