"""What the run itself checks and reports past each arm's τ (quality/experiment.py and drafter_stages.py, issue 59
items 6 and 7): vLLM's own count of each trained checkpoint kept as a stage and held to ours (a count that disagrees,
or one measured on the other arm's checkpoint, fails the run naming both figures), the free baselines (n-gram, the
EAGLE-3 drafter with random layers) on the arms' questions with the verdict against n-gram, and τ per MT-Bench
category.

The data stages run for real on the tiny target (once per module, then linked in by `data_from`); the three commands
in other processes are fakes through `ExperimentSeams.run`: speculators' trainer, τ (a tau.json whose counts depend
on the drafter) and vLLM's count (its counters read off the tau.json of the checkpoint it was given)."""
from __future__ import annotations

import _thread
import json
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from eagledata.errors import InputError
from eagledata.quality import curve
from eagledata.quality.arms import ARMS
from eagledata.quality.experiment import Experiment, ExperimentSeams
from eagledata.quality.layout import ExperimentFiles
from eagledata.quality.measure import parser as measure_parser
from eagledata.quality.tau import QuestionRun, read_tau, summarize, write_tau
from eagledata.quality.trainer import EPOCH_FILES
from eagledata.quality.vllm_tau import CountMismatch, SpecCounts
from tests.helpers.quality_experiment import make_data, tiny_config

CATEGORIES = ("writing", "math", "coding")
# drafts accepted per verifying forward, cycled, by drafter: on-policy accepts more than off-policy (pooled τ 1.75
# against 1.25), n-gram about 1.33, between them
ACCEPTS = {"on_policy": [1, 0, 2, 0], "off_policy": [1, 0, 0, 0], "self": [3], "random": [0], "ngram": [0, 1, 0],
           "eagle3-random": [0], "none": [0]}


def no_commands(cmd, env, log_file, label):
    raise AssertionError(f"no command expected here: {label}")


class FakeCommands:
    """The experiment's commands, faked. `plant` makes vLLM's count wrong: `count` adds 3 accepted drafts (of 48);
    `served` serves the other arm's checkpoint (the wiring bug: its vllm_tau.json names what it served); `counted`
    names the asked checkpoint but counts the other one."""

    def __init__(self, files: ExperimentFiles, plant: str | None = None):
        self.files, self.plant, self.calls = files, plant, []

    def __call__(self, cmd, env, log_file, label):
        self.calls.append((label, cmd))
        module = cmd[2]
        if module == "eagledata.quality.train":
            self.train(cmd)
        elif module == "eagledata.quality.measure":
            self.measure(measure_parser().parse_args(cmd[3:]))
        elif module == "eagledata.quality.vllm_tau":
            self.vllm(dict(zip(cmd[3::2], cmd[4::2], strict=True)))
        else:
            raise AssertionError(f"unexpected command {cmd}")

    def train(self, cmd):
        save = Path(dict(zip(cmd[4::2], cmd[5::2], strict=True))["--save-path"])
        (save / "1").mkdir(parents=True)
        (save / "1" / "config.json").write_text('{"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}')
        Path(cmd[3]).write_text(json.dumps({"train": {"loss": 3.0}, "epoch": 0}) + "\n"
                                + json.dumps({"val": {"loss_epoch": 4.0}, "epoch": 0}) + "\n")

    def arm_of(self, checkpoint: str) -> str:
        return next(arm for arm in ARMS if Path(checkpoint) == self.files.checkpoint(arm))

    def measure(self, a):
        """Every drafter measured against the greedy trace recorded first (plain greedy, the drafters' layers)."""
        if a.record_trace:
            assert (a.drafter, a.aux_layers, a.trace) == ("none", "1,2,3", None)
            Path(a.record_trace).write_text("trace")
        else:
            assert a.trace == str(self.files.trace) and self.files.trace.exists(), a.drafter
        name = a.drafter.split(":")[0]
        name = self.arm_of(a.drafter.removeprefix("eagle3:")) if name == "eagle3" else name
        write_tau(a.out, summarize(decoded(name, a.limit), k=a.k, verifier=a.verifier, eval_set="mt_bench",
                                   seed=a.seed, drafter=a.drafter, max_new_tokens=a.max_new_tokens,
                                   samples=a.samples, supervised_tokens=a.supervised_tokens,
                                   train_seconds=a.train_seconds))

    def vllm(self, flags):
        """vLLM decoding the checkpoint it serves on its own: counters of the same runs as `measure` gives it."""
        asked = self.arm_of(flags["--drafter"])
        served = ARMS[1 - ARMS.index(asked)] if self.plant in ("served", "counted") else asked
        k, runs = int(flags["--k"]), decoded(served, int(flags["--limit"]))
        accepted = [a for r in runs for t in r.accepted for a in t]
        counts = SpecCounts(len(accepted), k * len(accepted), sum(accepted) + (3 if self.plant == "count" else 0),
                            [sum(a > i for a in accepted) for i in range(k)])
        doc = {"drafter": str(self.files.checkpoint(served if self.plant == "served" else asked)),
               "questions": len(runs), "k": k, "max_new_tokens": int(flags["--max-new-tokens"]),
               "output_tokens": sum(r.output_tokens for r in runs), "tau_pooled": counts.tau, "counts": asdict(counts)}
        Path(flags["--out"]).write_text(json.dumps(doc))


def decoded(drafter: str, questions: int) -> list[QuestionRun]:
    """What decoding `questions` MT-Bench-like questions with this drafter gives: two turns of 8 verifying
    forwards each, accepting `ACCEPTS[drafter]` in turn."""
    cycle = ACCEPTS[drafter]
    return [QuestionRun(81 + q, [[cycle[(q + i) % len(cycle)] for i in range(8)] for _ in range(2)],
                        output_tokens=40, category=CATEGORIES[q % len(CATEGORIES)]) for q in range(questions)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The data stages made once (`tiny`); each test's experiment links them in (`data_from`)."""
    root = tmp_path_factory.mktemp("checks")
    exp = Experiment(tiny_config(root), ExperimentSeams(run=no_commands, say=lambda s: None))
    make_data(exp)
    return root


def experiment(base, name, plant=None, say=lambda s: None, **settings):
    config = tiny_config(base, experiment=name, data_from="tiny", questions=3, bound_questions=1, **settings)
    files = ExperimentFiles(Path(config.output_dir) / "quality" / name)
    fake = FakeCommands(files, plant)
    return Experiment(config, ExperimentSeams(run=fake, say=say)), fake


def test_vllms_count_and_the_free_baselines_in_the_run(base):
    """The default run: each arm's checkpoint counted by vLLM on the arms' questions, k and cap, its count within
    0.02 of ours; n-gram and the EAGLE-3 drafter with random layers (the on-policy checkpoint, the speculators
    interpreter) on the arms' questions, self and random on `bound_questions`; τ per category of the drafters on
    the arms' questions; the verdict against n-gram. A rerun keeps every stage and checks the kept counts again.
    (Planted by hand: the stage handing vLLM the other arm's checkpoint fails this run: not measured alike.)"""
    exp, fake = experiment(base, "default", vllm_check=True, bounds=["self", "random", "ngram", "eagle3-random"])
    config = exp.config
    summary = exp.run()
    labels = [label for label, _ in fake.calls]
    assert labels == ["train on_policy", "train off_policy", "greedy trace", "τ on_policy", "vLLM τ on_policy",
                      "τ off_policy", "vLLM τ off_policy", "τ self", "τ random", "τ ngram", "τ eagle3-random"]
    cmds = dict(fake.calls)
    for arm in ARMS:
        flags = dict(zip(cmds[f"vLLM τ {arm}"][3::2], cmds[f"vLLM τ {arm}"][4::2], strict=True))
        assert flags["--drafter"] == str(exp.files.checkpoint(arm)) and flags["--vllm-python"] == config.vllm_python
        assert (flags["--limit"], flags["--k"], flags["--max-new-tokens"]) == ("3", "3", "16")
        row = summary["vllm"][arm]["tau_pooled"]
        assert row["ours"] == pytest.approx(row["vllm"]) and row["ours"] == read_tau(exp.files.tau(arm))["tau_pooled"]
    baseline = cmds["τ eagle3-random"]
    assert baseline[0] == config.interop_python
    assert f"eagle3-random:{exp.files.checkpoint('on_policy')}" in baseline
    rows = {r["drafter"]: r for r in summary["rows"]}
    assert {d: rows[d]["questions"] for d in rows} == {"on_policy": 3, "off_policy": 3, "self": 1, "random": 1,
                                                       "ngram": 3, "eagle3-random": 3}
    assert set(summary["per_category"]) == {"on_policy", "off_policy", "ngram", "eagle3-random"}
    assert set(summary["per_category"]["on_policy"]) == set(CATEGORIES)
    verdict = summary["baseline_verdict"]
    assert verdict.startswith("on_policy 1.750 beats ngram") and "off_policy 1.250 does not beat ngram" in verdict
    from eagledata.quality.report import category_table, conclusion, vllm_rows

    said = conclusion(summary)
    assert "does not beat ngram" in said and "vLLM's own speculative decoding counts the same" in said
    assert [r["arm"] for r in vllm_rows(summary)] == list(ARMS)
    assert [r["category"] for r in category_table(summary)] == sorted(CATEGORIES)

    again = Experiment(config, ExperimentSeams(run=no_commands, say=lambda s: None)).run()
    assert again["vllm"] == summary["vllm"] and again["rows"] == summary["rows"]


def test_without_a_vllm_environment_the_check_is_off(base):
    exp, fake = experiment(base, "off", vllm_check=False, bounds=[])
    summary = exp.run()
    assert not any(cmd[2] == "eagledata.quality.vllm_tau" for _, cmd in fake.calls)
    assert summary["vllm"] is None and summary["baseline_verdict"] == ""


@pytest.mark.parametrize(("plant", "said"), [
    ("count", r"on_policy: pooled acceptance length differs by 0\.0625 > 0\.02: ours 1\.7500 over 48 verifying "
              r"forwards, vLLM 1\.8125 over 48 drafts \(39 accepted\)"),
    ("served", r"on_policy: vLLM's count and ours were not measured alike: drafter '.*on_policy/checkpoint' ours, "
               r"'.*off_policy/checkpoint' vLLM's"),
    ("counted", r"on_policy: pooled acceptance length differs by 0\.5000 > 0\.02: ours 1\.7500 .* vLLM 1\.2500"),
])
def test_a_vllm_count_that_disagrees_fails_the_run_naming_both_figures(base, plant, said):
    """Planted: a count 0.0625 off; the other arm's checkpoint served (its file says so); the other arm's counts
    under this arm's name. The run stops at the first arm, naming both figures and both files; the count is kept,
    so a rerun fails the same way without serving again. Planted by hand: without the check all three pass; with the
    counts checked alone `served` is caught only by its count (which two arms within 0.02 of each other would pass);
    the stage handing vLLM the other arm's checkpoint fails the default run."""
    exp, fake = experiment(base, f"plant-{plant}", plant, vllm_check=True, bounds=[])
    with pytest.raises(CountMismatch, match=said) as failed:
        exp.run()
    assert str(exp.files.tau("on_policy")) in str(failed.value) and str(exp.files.vllm_tau("on_policy")) in str(
        failed.value)
    assert [label for label, _ in fake.calls][-1] == "vLLM τ on_policy"
    assert not exp.files.summary.exists()
    with pytest.raises(CountMismatch, match=said):
        Experiment(exp.config, ExperimentSeams(run=no_commands, say=lambda s: None)).run()


def test_vllms_count_on_fewer_questions_is_held_to_ours_on_the_same_ones(base, monkeypatch):
    """`vllm_questions` fewer than the arms': each arm's drafter measured again on those questions against the same
    greedy trace (its own file), vLLM asked the same ones, and the two held together. Here the on-policy arm's τ
    differs from question to question (2.000 on all three, 1.9375 on the first two), so the check against the arm's
    tau.json on all of them would not agree (planted by hand: `vllm_ours` returning it fails, not measured alike);
    a count 0.0625 off on the fewer questions, planted, fails naming that file."""
    monkeypatch.setitem(ACCEPTS, "on_policy", [1, 0, 2])
    exp, fake = experiment(base, "fewer", vllm_check=True, vllm_questions=2, bounds=[])
    summary = exp.run()
    assert [label for label, _ in fake.calls] == [
        "train on_policy", "train off_policy", "greedy trace", "τ on_policy", "τ on_policy on vLLM's questions",
        "vLLM τ on_policy", "τ off_policy", "τ off_policy on vLLM's questions", "vLLM τ off_policy"]
    cmds = dict(fake.calls)
    for arm in ARMS:
        again = measure_parser().parse_args(cmds[f"τ {arm} on vLLM's questions"][3:])
        assert (again.drafter, again.limit, again.trace, again.out) == (
            f"eagle3:{exp.files.checkpoint(arm)}", 2, str(exp.files.trace), str(exp.files.vllm_ours(arm)))
        flags = dict(zip(cmds[f"vLLM τ {arm}"][3::2], cmds[f"vLLM τ {arm}"][4::2], strict=True))
        assert flags["--limit"] == "2"
        row = summary["vllm"][arm]
        assert row["questions"] == 2 and row["tau_pooled"]["ours"] == read_tau(exp.files.vllm_ours(arm))["tau_pooled"]
    assert summary["vllm"]["on_policy"]["tau_pooled"]["ours"] == 1.9375
    assert read_tau(exp.files.tau("on_policy"))["tau_pooled"] == 2.0
    from eagledata.quality.report import vllm_agreement

    assert "on_policy 1.9375 ours, 1.9375 vLLM's on 2 questions" in vllm_agreement(summary)

    planted, _ = experiment(base, "fewer-count", "count", vllm_check=True, vllm_questions=2, bounds=[])
    with pytest.raises(CountMismatch, match=r"on_policy: pooled acceptance length differs by 0\.0938 > 0\.02: "
                                            r"ours 1\.9375 over 32 verifying forwards") as failed:
        planted.run()
    assert str(planted.files.vllm_ours("on_policy")) in str(failed.value)


def test_both_arms_train_side_by_side_on_half_the_threads(base):
    """On CPU both arms' trainers run at once, one thread each of two: each fake trainer waits until the other has
    started (one after the other, planted, times out there). The target's stage is said once, not by each trainer's
    thread. An arm kept trains alone on all the threads."""
    both = threading.Barrier(2, timeout=20)
    threads: dict[str, str | None] = {}

    def threads_of(fake, wait=True):
        def run(cmd, env, log_file, label):
            if cmd[2] == "eagledata.quality.train":
                threads[label] = env.get("OMP_NUM_THREADS")
                if wait:
                    both.wait()
            fake(cmd, env, log_file, label)
        return run

    said: list[str] = []

    def say(line):  # slow on the target's line: two threads asking for it at once would both say it
        said.append(line)
        if line.startswith("[target] done before"):
            time.sleep(0.5)

    exp, fake = experiment(base, "together", say=say, vllm_check=False, bounds=[], threads=2)
    exp.seams.run = threads_of(fake)
    exp.run()
    assert threads == {"train on_policy": "1", "train off_policy": "1"}
    assert len([line for line in said if line.startswith("[target] done before")]) == 1, said
    assert all(exp.files.checkpoint(arm).is_dir() for arm in ARMS)

    threads.clear()
    exp.files.stage("train/off_policy").unlink()
    again, refake = experiment(base, "together", vllm_check=False, bounds=[], threads=2)
    again.seams.run = threads_of(refake, wait=False)
    again.run()
    assert [label for label, _ in refake.calls] == ["train off_policy"] and threads == {"train off_policy": "2"}


def test_a_training_stopped_midway_goes_on_after_its_last_whole_epoch(base):
    """The trainer stopped in its second epoch (planted: it raises after saving and validating epoch 0); the rerun
    gives it the same command, in the folder it left, with epoch 0 kept (`resume_point`), says so, and the stage
    records the epoch it went on after and each epoch's losses once; tau.json says it went on too."""
    said: list[str] = []
    exp, fake = experiment(base, "resumed", say=said.append, vllm_check=False, bounds=[], threads=1)
    commands = []

    def stopping(cmd, env, log_file, label):
        if cmd[2] != "eagledata.quality.train":
            return fake(cmd, env, log_file, label)
        commands.append(cmd)
        save = Path(dict(zip(cmd[4::2], cmd[5::2], strict=True))["--save-path"])
        first = label == "train on_policy" and not (save / "0").is_dir()  # the other arm trains through
        for epoch in [0] if first else [e for e in (0, 1) if not (save / str(e)).is_dir()]:
            (save / str(epoch)).mkdir(parents=True)
            for name in [*EPOCH_FILES, "val_metrics.json"]:
                (save / str(epoch) / name).write_text("{}")
            (save / str(epoch) / "config.json").write_text('{"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}')
            with open(cmd[3], "a") as f:
                f.write(json.dumps({"train": {"loss": 5.0 - epoch}, "epoch": epoch}) + "\n")
                f.write(json.dumps({"val": {"loss_epoch": 6.0 - epoch}, "epoch": epoch}) + "\n")
        if first:
            with open(cmd[3], "a") as f:
                f.write(json.dumps({"train": {"loss": 4.5}, "epoch": 1}) + "\n")
            raise RuntimeError(f"{label} failed (exit -9)")

    exp.seams.run = stopping
    with pytest.raises(RuntimeError, match="train on_policy failed"):
        exp.run()
    again, _ = experiment(base, "resumed", say=said.append, vllm_check=False, bounds=[], threads=1)
    again.seams.run = stopping
    again.run()
    assert commands[1] == commands[0] and len(commands) == 3  # on-policy twice, off-policy once
    assert any(line.startswith("[train/on_policy] goes on after epoch 1 of 2, kept from an earlier try")
               for line in said), said
    kept = json.loads(again.files.stage("train/on_policy").read_text())
    assert kept["resumed_after_epoch"] == 1 and kept["resumed_after_step"] == 0 and kept["steps"] == 2
    assert kept["epoch_losses"] == [{"epoch": 0, "train_loss": 5.0, "validation_loss": 6.0},
                                    {"epoch": 1, "train_loss": 4.0, "validation_loss": 5.0}]
    assert json.loads(again.files.stage("train/off_policy").read_text())["resumed_after_epoch"] == 0
    assert [read_tau(again.files.tau(arm))["resumed_after_epoch"] for arm in ARMS] == [1, 0]  # in the report too


def test_an_interrupt_while_the_arms_train_side_by_side_ends_both_trainers(base):
    """An interrupt reaches the main thread only; while the arms train side by side it ends both trainers
    (`ExperimentSeams.stop`: planted by hand as a no-op, the trainers never end and this test fails), the run
    raises it, and no train stage is kept."""
    both, stopped = threading.Barrier(2, timeout=20), threading.Event()

    def run(cmd, env, log_file, label):
        if both.wait() == 0:
            _thread.interrupt_main()
        if not stopped.wait(20):
            raise AssertionError(f"{label}: never stopped")
        raise RuntimeError(f"{label} failed (exit -15)")

    exp, _ = experiment(base, "interrupted", vllm_check=False, bounds=[], threads=2)
    exp.seams.run, exp.seams.stop = run, stopped.set
    with pytest.raises(KeyboardInterrupt):
        exp.run()
    assert stopped.is_set() and not any(exp.files.stage(f"train/{arm}").exists() for arm in ARMS)


def test_a_greedy_trace_that_is_not_plain_greedy_stops_the_run_before_any_tau(base, monkeypatch):
    """The trace is recorded with no drafter, so its τ is 1 exactly; planted: a recording that accepted drafts (a
    drafter wired in by mistake) stops the run at the trace, before any drafter is measured against it."""
    exp, fake = experiment(base, "plant-trace", vllm_check=False, bounds=[])
    monkeypatch.setitem(ACCEPTS, "none", [0, 1])
    with pytest.raises(RuntimeError, match=r"plain greedy decoding gave τ 1\.5 \(1 exactly expected\)"):
        exp.run()
    assert [label for label, _ in fake.calls][-1] == "greedy trace"


def test_a_trace_is_recorded_only_for_a_tau_stage_that_runs(base):
    """The trace file (~0.5 GB at full size) may be deleted after a run: a rerun with every τ stage kept records
    nothing; one τ stage to measure again records it first, then measures against it."""
    exp, fake = experiment(base, "trace-gone", vllm_check=False, bounds=["ngram"])
    exp.run()
    exp.files.trace.unlink()
    again, refake = experiment(base, "trace-gone", vllm_check=False, bounds=["ngram"])
    again.run()
    assert refake.calls == [] and not exp.files.trace.exists()
    exp.files.stage("bound/ngram").unlink()
    third, calls = experiment(base, "trace-gone", vllm_check=False, bounds=["ngram"])
    third.run()
    assert [label for label, _ in calls.calls] == ["greedy trace", "τ ngram"] and exp.files.trace.is_file()


def test_a_curve_runs_each_size_on_the_experiments_data_and_reads_its_points(base):
    """The experiment, then a size on its data: the size trains at its tokens and measures only its arms, against
    the experiment's greedy trace (recorded once for both); the points come back by tokens, each from its tau.json.
    With `keep_dir` each finished experiment, the size too, leaves its small files there, and the points read there
    are the same."""
    kept = base / "kept-curve"
    exp, _ = experiment(base, "curve", vllm_check=False, bounds=["ngram"], keep_dir=str(kept))
    have = exp.run()["supervised_tokens"]
    size = have // 2
    calls = []
    for c in curve.curve_configs(replace(exp.config, curve_tokens=[size])):
        fake = FakeCommands(ExperimentFiles(base / "outputs" / "quality" / c.experiment))
        Experiment(c, ExperimentSeams(run=fake, say=lambda s: None)).run()
        calls += [label for label, _ in fake.calls]
    assert calls == ["train on_policy", "train off_policy", "τ on_policy", "τ off_policy"]  # the trace linked
    root = exp.files.root.parent
    points = curve.read_points(root, ["curve", f"curve-t{size}"])
    assert [t for t, _ in points] == [size, have]
    assert curve.read_points(kept, ["curve", f"curve-t{size}"]) == points
    assert sorted(p.name for p in kept.iterdir()) == ["curve", f"curve-t{size}"]
    assert not list(kept.rglob("*.safetensors")) and (kept / "curve" / "bounds" / "ngram" / "tau.json").is_file()
    rows = curve.curve_rows(points)
    assert [(r["supervised_tokens"], r["arm"]) for r in rows] == [(size, a) for a in ARMS] + [(have, a) for a in ARMS]
    stage = json.loads(ExperimentFiles(root / f"curve-t{size}").stage("train/on_policy").read_text())
    assert stage["settings"]["train_tokens"] == size
    bad = read_tau(root / "curve" / "off_policy" / "tau.json")
    bad["supervised_tokens"] = have + 1
    (root / "curve" / "off_policy" / "tau.json").write_text(json.dumps(bad))
    with pytest.raises(InputError, match="not trained on one count of supervised tokens"):
        curve.read_points(root, ["curve"])
