"""The resume store: each finished stage's result and the settings it was made with (`stages/<stage>.json`), a rerun
keeps it and other settings are refused (`Stages`); what each try of a stage took, the cut ones included
(`timed_try`, `stage_cost_seconds`); `share_data` links another experiment's data stages in (`data_from`), and its
greedy trace where it kept one (`share_trace`)."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import atomic_write_text
from .arms import ARMS
from .config import QualityConfig
from .layout import ExperimentFiles, experiment_files
from .peaks import stage_peak

# The settings each stage's outputs depend on (beyond the stages before it, which check their own).
STAGE_SETTINGS = {"target": ("target",), "prompts": ("conversations", "max_turns", "validation_conversations",
                                                         "data_seed", "sample_tokens", "answer_tokens"),
                  "records": ("answer_tokens", "regenerate"), "assemble": ("sample_tokens",), "extract": (),
                  "train": ("epochs", "lr", "draft_vocab_size", "total_seq_len", "seed", "train_tokens",
                            "train_turns", "train_cut_answers", "draft_vocabulary"),
                  "trace": ("k", "questions", "max_new_tokens"),
                  "tau": ("k", "questions", "max_new_tokens", "seed"),
                  "bound": ("k", "bound_questions", "questions", "max_new_tokens", "seed"),
                  "vllm": ("k", "questions", "vllm_questions", "max_new_tokens")}


def stage_settings(config: QualityConfig, stage: str) -> dict[str, Any]:
    return {k: getattr(config, k) for k in STAGE_SETTINGS[stage.split("/")[0]]}


def settings_differ(kept: dict[str, Any], settings: dict[str, Any]) -> str:
    """How a kept stage's settings differ from `settings` ("" when they do not)."""
    was = kept.get("settings", {})
    return ", ".join(f"{k} {was.get(k)!r} there, {v!r} now" for k, v in settings.items()
                     if "settings" in kept and was.get(k) != v)


def link_or_copy(src: str, dst: str) -> None:
    """A hard link (no second copy of the hidden states), a copy where the two are on different file systems; a
    file an earlier try left is kept when it is the same file, replaced when not (never written through)."""
    if os.path.lexists(dst):
        if os.path.samefile(src, dst):
            return
        os.remove(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_stage(there: ExperimentFiles, here: ExperimentFiles, name: str) -> None:
    """Another experiment's finished stage kept as this one's, marked `linked_from` it: its seconds and peak memory
    are that experiment's, not spent here (`curve.size_costs` leaves them out)."""
    doc = json.loads(there.stage(name).read_text())
    doc["linked_from"] = str(there.root)
    here.stage(name).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(here.stage(name), json.dumps(doc, indent=1, default=str) + "\n")


def data_stages(f: ExperimentFiles) -> dict[str, list[Path]]:
    """The stages that make the data (no trainer or τ setting reaches them), in order, with the files each leaves
    for the later stages."""
    return {"target": [], "prompts": [f.prompts], **{f"records/{arm}": [f.records(arm)] for arm in ARMS},
            "assemble": [f.samples(arm) for arm in ARMS],
            **{f"extract/{arm}": [f.arm(arm) / "hidden_states"] for arm in ARMS}}


def share_data(config: QualityConfig, say: Callable[[str], None]) -> None:
    """`data_from`: that experiment's data stages and their files linked into this one, each stage this one lacks
    (a rerun keeps what it has). Refused, naming both, when that experiment has not finished them or made them with
    other settings: its data would silently stand for data these settings ask for."""
    if config.data_from is None:
        return
    here = experiment_files(config)
    there = ExperimentFiles(here.root.parent / config.data_from)
    todo = {name: outputs for name, outputs in data_stages(there).items() if not here.stage(name).is_file()}
    for name in todo:  # every check before any link: a refusal leaves this experiment as it was
        source = there.stage(name)
        if not source.is_file():
            raise InputError(f"experiment {config.data_from!r} has not finished its stage {name}: run it first, "
                             "or leave data_from unset", source)
        if differ := settings_differ(json.loads(source.read_text()), stage_settings(config, name)):
            raise InputError(f"data_from {config.data_from!r} made its stage {name} with other settings ({differ})",
                             source)
    for name, outputs in todo.items():
        for src in outputs:
            dst = here.root / src.relative_to(there.root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, copy_function=link_or_copy, dirs_exist_ok=True)
            else:
                link_or_copy(str(src), str(dst))
        link_stage(there, here, name)  # last: a stage is kept only once its files are here
        say(f"[{name}] linked from {there.root}")
    share_trace(config, here, there, say)


def share_trace(config: QualityConfig, here: ExperimentFiles, there: ExperimentFiles,
                say: Callable[[str], None]) -> None:
    """The greedy trace too (the verifier's decode of MT-Bench with the states of the layers the drafters read: no
    data or trainer setting reaches it), where that experiment kept it, file and all, with the same settings;
    otherwise this experiment records its own when a τ stage needs one. A trace of other layers than this
    experiment's drafters read is refused where they are measured (`speculative_decode_batch`)."""
    stage = there.stage("trace")
    if here.stage("trace").is_file() or not (stage.is_file() and there.trace.is_file()):
        return
    if differ := settings_differ(json.loads(stage.read_text()), stage_settings(config, "trace")):
        say(f"[trace] not linked from {there.root}, made with other settings ({differ}): recorded here")
        return
    here.root.mkdir(parents=True, exist_ok=True)
    link_or_copy(str(there.trace), str(here.trace))
    link_stage(there, here, "trace")
    say(f"[trace] linked from {there.root}")


def stage_cost_seconds(doc: dict[str, Any]) -> float:
    """What a finished stage cost: the try that finished it (`seconds`) and every try cut before it
    (`cut_tries_seconds`: a training resumed from its checkpoints after a session's end paid for both)."""
    return round((doc.get("seconds") or 0.0) + sum(doc.get("cut_tries_seconds") or ()), 1)


def cut_tries(path: Path) -> list[float]:
    """The seconds of the tries `timed_try` left in `path` (none: no file)."""
    if not path.is_file():
        return []
    try:
        return [float(s) for s in json.loads(path.read_text())["cut_tries_seconds"]]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"not a stage's tries (cut_tries_seconds: a list of seconds): {e}; delete it to count "
                         "none", path) from None


@contextmanager
def timed_try(path: Path, *, every_s: float, clock: Callable[[], float]) -> Iterator[list[float]]:
    """This try's seconds so far, beside the tries cut before it, written to `path` every `every_s` and when the
    try ends in an error or an interrupt: a stage that a kill or a session's end cuts leaves what it took (to
    `every_s`), and the try that finishes it counts them (yielded). The caller removes `path` once the stage is
    kept."""
    earlier, started, done = cut_tries(path), clock(), threading.Event()

    def write() -> None:
        atomic_write_text(path, json.dumps({"cut_tries_seconds": [*earlier, round(clock() - started, 1)]}) + "\n")

    def ticking() -> None:
        while not done.wait(every_s):
            write()

    ticker = threading.Thread(target=ticking, name="stage-try", daemon=True)
    ticker.start()
    try:
        yield earlier
    except BaseException:
        done.set()
        ticker.join()
        write()
        raise
    done.set()
    ticker.join()


@dataclass
class Stages:
    """The experiment's finished stages: each one's result (JSON) with the settings it depends on, kept in
    stages/<name>.json, so a rerun returns it without running it again."""

    config: QualityConfig
    files: ExperimentFiles
    say: Callable[[str], None]
    tries_every_s: float = 10.0  # how often a running try's seconds are written (what a kill can lose of its time)
    clock: Callable[[], float] = time.monotonic

    def run(self, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run `body` once. A kept stage made with other settings is refused (its outputs would silently stand for
        the new ones): another experiment name, or delete the stage's file to make it again. Each try's seconds
        are kept beside the stage while it runs (`stages/<stage>.tries`); the finished stage's file holds the tries
        cut before it (`cut_tries_seconds`) beside its own `seconds`."""
        path = self.files.stage(name)
        tries = path.with_suffix(".tries")
        settings = stage_settings(self.config, name)
        if path.is_file():
            kept = dict(json.loads(path.read_text()))
            if said := settings_differ(kept, settings):
                raise InputError(f"stage {name} was made with other settings ({said}): use another name, or delete "
                                 "this file (and the stages after it) to make it again", path)
            self.say(f"[{name}] done before: kept ({path})")
            return kept
        self.say(f"[{name}] ...")
        started = self.clock()
        with timed_try(tries, every_s=self.tries_every_s, clock=self.clock) as earlier, stage_peak() as peak:
            result = body()
        result["seconds"] = round(self.clock() - started, 1)
        if earlier:
            result["cut_tries_seconds"] = earlier
        result["peak_mib"] = peak.mib()
        result["settings"] = settings
        atomic_write_text(path, json.dumps(result, indent=1, default=str) + "\n")
        tries.unlink(missing_ok=True)
        cut = f" (and {sum(earlier):.0f} s in {len(earlier)} tries cut before)" if earlier else ""
        self.say(f"[{name}] done in {result['seconds']:.0f} s{cut}")
        return result

    def seconds(self) -> dict[str, float]:
        """What each finished stage cost in seconds, its cut tries included (`stage_cost_seconds`)."""
        return {path.stem: stage_cost_seconds(json.loads(path.read_text()))
                for path in sorted((self.files.root / "stages").glob("*.json"))}

    def peaks(self) -> dict[str, float | None]:
        """Each finished stage's peak memory in MiB (`peaks.stage_peak`; None where not measured)."""
        return self.recorded("peak_mib")

    def recorded(self, key: str) -> dict[str, Any]:
        """`key` of each finished stage's file, by stage."""
        return {path.stem: json.loads(path.read_text()).get(key)
                for path in sorted((self.files.root / "stages").glob("*.json"))}

