"""The experiment's drafter stages (`DrafterStages`), each kept in the resume store: each arm's drafter trained by
speculators 0.9.0's own loop in its environment (`train.py`, on the arm's training samples with the one shared draft
vocabulary), its τ on MT-Bench (`measure.py`, eagle3), its τ as vLLM counts it, checked against ours on every run
(`vllm_tau.py`), and τ of the reference drafters (`self`, `random`, `ngram`, `eagle3-random`). Each runs as a
command through `ExperimentSeams.run`."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import atomic_write_text
from ..training.exports import save_token_freq
from .arm_data import ArmData
from .arms import ARMS, supervised
from .config import BASELINES
from .measure import measure_command
from .tau import read_tau
from .trainer import epoch_losses, last_checkpoint, read_metrics, resume_point, train_args
from .vllm_tau import CountMismatch, check_kept
from .workspace import Workspace


def tau_line(doc: dict[str, Any]) -> dict[str, Any]:
    """What a τ stage keeps of its tau.json."""
    return {k: doc.get(k) for k in ("tau_mean", "tau_ci95", "tau_pooled", "per_position_acceptance", "questions",
                                    "turns", "k")}


@dataclass
class DrafterStages:
    """Training and τ, after the data stages (`ArmData`: each arm's split and the shared vocabulary)."""

    ws: Workspace
    data: ArmData
    _traced: bool = False  # the trace stage run or found kept in this run

    def threads_env(self, threads: int | None = None) -> dict[str, str]:
        threads = threads or self.ws.config.threads
        return {"OMP_NUM_THREADS": str(threads)} if threads else {}

    def train_arms(self) -> None:
        """Each arm's drafter trained (`train_arm`). On CPU with `train_together` and both arms still to train,
        both trainers at once on half the threads each: speculators' step is matmul bound and gains 1.85x from one
        thread to two on this machine, so two one-thread trainers side by side finish both arms sooner than one
        two-thread trainer after the other. An arm that fails lets the other finish, then raises; an interrupt ends
        both trainers (`ExperimentSeams.stop`) and raises."""
        config = self.ws.config
        todo = [arm for arm in ARMS if not self.ws.files.stage(f"train/{arm}").is_file()]
        threads = config.threads or os.cpu_count() or 1
        if not (config.train_together and config.target_device == "cpu" and len(todo) > 1 and threads > 1):
            for arm in ARMS:
                self.train_arm(arm)
            return
        _ = self.ws.verifier  # its stage resolved once, before the trainers' threads both ask for it
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            running = []
            try:  # from the first submit on: an interrupt may come before both have started
                running += [pool.submit(self.train_arm, arm, threads // len(todo)) for arm in todo]
                while wait(running, timeout=1.0).not_done:  # awake each second: a signal's handler runs here
                    pass
            except BaseException:  # an interrupt lands here, in the main thread: the trainers end with it
                self.ws.seams.stop()
                raise
        for done in running:
            done.result()

    def train_arm(self, arm: str, threads: int | None = None) -> None:
        ws = self.ws

        def body() -> dict[str, Any]:
            out = ws.files.arm(arm) / "train"
            export, train, total = self.data.training_data(arm)
            for cached in [*export.glob("d2t-*.npy"), *export.glob("t2d-*.npy")]:
                cached.unlink()  # the trainer would load a cached mapping before reading --token-freq-path
            save_token_freq(self.data.shared_vocabulary(), ws.files.arm(arm))  # <arm>/token_freq.pt
            cmd, env = measure_command(ws.config.interop_python)
            cmd = [ws.config.interop_python, "-m", "eagledata.quality.train", str(out / "metrics.jsonl"),
                   *train_args(ws.config, ws.verifier, export, out, train_samples=train, total_samples=total,
                               token_freq=ws.files.token_freq(arm))]
            # an earlier try that stopped midway goes on from its last checkpoint, or starts over
            if resumed := resume_point(out, cmd):
                ws.seams.say(f"[train/{arm}] goes on {resumed.describe(ws.config.epochs)}, kept from an earlier try "
                             f"(reloaded as speculators saved it, in bf16: close to an unstopped run, not equal; "
                             f"delete {out} to start over)")
                if (out / "train.log").is_file():
                    (out / "train.log").replace(out / f"train.to-epoch-{resumed.epochs}-step-{resumed.steps}.log")
            else:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                atomic_write_text(out / "command.json", json.dumps(cmd) + "\n")
            started = time.monotonic()
            ws.seams.run(cmd, {**env, **self.threads_env(threads)}, out / "train.log", f"train {arm}")
            seconds = time.monotonic() - started
            checkpoint = ws.files.checkpoint(arm)
            if checkpoint.exists():
                shutil.rmtree(checkpoint)
            shutil.copytree(last_checkpoint(out / "checkpoints"), checkpoint)
            steps = read_metrics(out / "metrics.jsonl")
            losses = [m["train"]["loss"] for m in steps if "train" in m]
            return {"train_seconds": round(seconds, 1), "resumed_after_epoch": resumed.epochs,
                    "resumed_after_step": resumed.steps, "steps": len(losses),
                    "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                    "train_samples": train, "validation_samples": total - train,
                    "epoch_losses": epoch_losses(steps), "checkpoint": str(checkpoint)}

        ws.stages.run(f"train/{arm}", body)

    def trace(self) -> dict[str, Any]:
        """The verifier's greedy decode of the arms' questions, recorded once (`measure.py --drafter none
        --record-trace`: plain greedy decoding, τ = 1, every turn through its end and k on, with the aux states of
        the layers the trained drafters read): every τ stage then verifies against it (`--trace`), so each drafter
        costs only its own forwards, and all read the very same states. Run by the first τ stage that runs (one
        kept with its τ stages needs no trace); a kept stage whose file is gone is recorded again."""
        files = self.ws.files
        if not files.trace.is_file():  # a kept stage whose file is gone (deleted to save space): record it again
            files.stage("trace").unlink(missing_ok=True)

        def body() -> dict[str, Any]:
            config = json.loads((files.checkpoint(ARMS[0]) / "config.json").read_text(encoding="utf-8"))
            layers = ",".join(str(i) for i in config["eagle_aux_hidden_state_layer_ids"])
            out = files.bound("none")
            cmd, env = measure_command(sys.executable, *self.measure_args("none", out, self.ws.config.questions,
                                                                          trace=False),
                                       "--record-trace", str(files.trace), "--aux-layers", layers)
            self.ws.seams.run(cmd, {**env, **self.threads_env()}, out.parent / "tau.log", "greedy trace")
            line = tau_line(read_tau(out))
            if line["tau_mean"] != 1.0:
                raise RuntimeError(f"plain greedy decoding gave τ {line['tau_mean']} (1 exactly expected): {out}")
            return {**line, "trace": str(files.trace), "aux_layers": layers}

        return self.ws.stages.run("trace", body)

    def trace_for(self, stage: str) -> None:
        """The trace, before a τ stage that is not kept (its own stage, so its seconds are its own); said once, when
        it is recorded or first found kept, not again before each later τ stage."""
        files = self.ws.files
        if not files.stage(stage).is_file() and not (self._traced and files.trace.is_file()):
            self.trace()
            self._traced = True

    def tau_arm(self, arm: str) -> dict[str, Any]:
        files = self.ws.files

        def body() -> dict[str, Any]:
            trained = json.loads(files.stage(f"train/{arm}").read_text())
            samples = self.data.train_samples(arm)
            cmd, env = measure_command(self.ws.config.interop_python, *self.measure_args(
                f"eagle3:{files.checkpoint(arm)}", files.tau(arm), self.ws.config.questions),
                "--samples", str(len(samples)), "--supervised-tokens", str(supervised(samples)),
                "--train-seconds", str(trained["train_seconds"]))
            self.ws.seams.run(cmd, {**env, **self.threads_env()}, files.arm(arm) / "tau.log", f"τ {arm}")
            doc = read_tau(files.tau(arm))  # the contract's fields, then the training's (extra, at the end)
            doc.update({"train_samples": trained["train_samples"], "validation_samples": trained["validation_samples"],
                        "epoch_losses": trained["epoch_losses"],
                        "resumed_after_epoch": trained.get("resumed_after_epoch", 0),
                        "resumed_after_step": trained.get("resumed_after_step", 0)})
            atomic_write_text(files.tau(arm), json.dumps(doc, indent=1) + "\n")
            return tau_line(read_tau(files.tau(arm)))

        self.trace_for(f"tau/{arm}")
        return self.ws.stages.run(f"tau/{arm}", body)

    def reference(self, drafter: str) -> tuple[str, str, int | None]:
        """How a reference drafter is measured: its `--drafter`, the interpreter and its questions. `self` and
        `random` (τ known: k + 1, ≈ 1; `random` drafts with a whole model and costs several times an arm) on
        `bound_questions`, here; the baselines on the arms' questions, so the arms are compared with them question
        by question, `eagle3-random` on the on-policy arm's checkpoint through the EAGLE-3 path in the speculators
        environment, as the arms are measured."""
        config = self.ws.config
        if drafter == "eagle3-random":
            return f"eagle3-random:{self.ws.files.checkpoint(ARMS[0])}", config.interop_python, config.questions
        if drafter in BASELINES:
            return drafter, sys.executable, config.questions
        return drafter, sys.executable, config.bound_questions or config.questions

    def tau_bound(self, drafter: str) -> dict[str, Any]:
        def body() -> dict[str, Any]:
            out = self.ws.files.bound(drafter)
            spec, python, questions = self.reference(drafter)
            cmd, env = measure_command(python, *self.measure_args(spec, out, questions))
            self.ws.seams.run(cmd, {**env, **self.threads_env()}, out.parent / "tau.log", f"τ {drafter}")
            return tau_line(read_tau(out))

        self.trace_for(f"bound/{drafter}")
        return self.ws.stages.run(f"bound/{drafter}", body)

    def vllm_limit(self) -> int | None:
        """How many questions vLLM's check asks (`--limit`): `vllm_questions`, the arms' where it asks no fewer."""
        config = self.ws.config
        n = config.vllm_questions
        return config.questions if n is None or (config.questions is not None and n >= config.questions) else n

    def vllm_ours(self, arm: str) -> Path:
        """Our count that vLLM's is checked against: the arm's tau.json, or its count on vLLM's fewer questions."""
        files = self.ws.files
        return files.tau(arm) if self.vllm_limit() == self.ws.config.questions else files.vllm_ours(arm)

    def vllm_arm(self, arm: str) -> dict[str, Any]:
        """vLLM's own count of the arm's checkpoint (`vllm_tau.py`: the verifier served by vLLM from
        `vllm_python` with the checkpoint as its EAGLE-3 speculative model; the same k and new-token cap as
        `tau_arm`, on `vllm_limit` questions), kept as a stage, then checked against ours on the same questions
        (`vllm_ours`: where they are fewer than the arms', the arm's drafter measured on them against the same
        greedy trace, in this stage) on every run (`check_kept`): a count measured otherwise, or more than 0.02
        from ours, fails the run naming both figures and files."""
        ws = self.ws
        out, ours, limit = ws.files.vllm_tau(arm), self.vllm_ours(arm), self.vllm_limit()

        def body() -> dict[str, Any]:
            if ours != ws.files.tau(arm):
                cmd, env = measure_command(ws.config.interop_python, *self.measure_args(
                    f"eagle3:{ws.files.checkpoint(arm)}", ours, limit))
                ws.seams.run(cmd, {**env, **self.threads_env()}, ours.with_suffix(".log"),
                             f"τ {arm} on vLLM's questions")
            args = ["--verifier", str(ws.verifier), "--drafter", str(ws.files.checkpoint(arm)),
                    "--questions", str(ws.questions_file()), "--k", str(ws.config.k),
                    "--max-new-tokens", str(ws.config.max_new_tokens), "--out", str(out),
                    "--vllm-python", ws.config.vllm_python, "--concurrency", str(ws.config.vllm_concurrency)]
            if limit is not None:
                args += ["--limit", str(limit)]
            _, env = measure_command(sys.executable)  # this package on the path; the server's is vllm_python's
            ws.seams.run([sys.executable, "-m", "eagledata.quality.vllm_tau", *args], env,
                         ws.files.arm(arm) / "vllm_tau.log", f"vLLM τ {arm}")
            doc = json.loads(out.read_text(encoding="utf-8"))
            return {k: doc.get(k) for k in ("drafter", "questions", "k", "max_new_tokens", "output_tokens",
                                            "tau_pooled", "counts")}

        if ours != ws.files.tau(arm):
            self.trace_for(f"vllm/{arm}")
        kept = ws.stages.run(f"vllm/{arm}", body)
        try:
            row = check_kept(read_tau(ours), kept)
        except CountMismatch as e:
            raise CountMismatch(f"{arm}: {e} (ours: {ours}; vLLM's: {out}, kept in "
                                f"{ws.files.stage(f'vllm/{arm}')}: delete that file to measure it again)") from None
        row["questions"] = kept.get("questions")
        ws.seams.say(f"[vllm/{arm}] τ pooled on {row['questions']} questions: ours {row['tau_pooled']['ours']:.4f}, "
                     f"vLLM {row['tau_pooled']['vllm']:.4f}: agree within 0.02")
        return row

    def measure_args(self, drafter: str, out: Path, questions: int | None, *, trace: bool = True) -> list[str]:
        """`measure.py`'s flags; `trace`: verified against the experiment's greedy trace (the `trace` stage)."""
        config = self.ws.config
        args = ["--verifier", str(self.ws.verifier), "--drafter", drafter, "--questions", str(self.ws.questions_file()),
                "--out", str(out), "--k", str(config.k), "--max-new-tokens", str(config.max_new_tokens),
                "--seed", str(config.seed), "--transcripts", str(out.with_name(out.stem + ".transcripts.jsonl"))]
        if questions is not None:
            args += ["--limit", str(questions)]
        if config.threads:
            args += ["--threads", str(config.threads)]
        if trace:
            args += ["--trace", str(self.ws.files.trace)]
        return args
