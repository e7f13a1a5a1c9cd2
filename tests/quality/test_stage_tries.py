"""What a stage cost when a try of it was cut (`stages.timed_try`, `Stages.run`): a training that a session's end,
a Ctrl-C or a SIGKILL stops resumes from its checkpoints, so the machine paid for every try; the try that finishes
the stage keeps the cut ones' seconds (`cut_tries_seconds`) beside its own, and the curve's costs count them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eagledata
from eagledata.errors import InputError
from eagledata.quality import curve
from eagledata.quality.config import QualityConfig
from eagledata.quality.layout import experiment_files
from eagledata.quality.stages import Stages

CONFIG = dict(experiment="tries")


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stages(tmp_path: Path, clock: Clock, said: list[str]) -> Stages:
    config = QualityConfig(**CONFIG, output_dir=str(tmp_path))
    return Stages(config, experiment_files(config), said.append, tries_every_s=3600, clock=clock)


def taking(clock: Clock, seconds: float, then: BaseException | None = None):
    def body():
        clock.now += seconds
        if then is not None:
            raise then
        return {}
    return body


def test_cut_tries_count_in_the_try_that_finishes_the_stage(tmp_path):
    """A try interrupted after 100 s and one failing after 40 s, then one finishing in 25 s: the stage took 25 s,
    cost 165 s, and says so; the running file is gone and a rerun keeps the stage without a try."""
    clock, said = Clock(), []
    store = stages(tmp_path, clock, said)
    tries = store.files.stage("train/on_policy").with_suffix(".tries")
    with pytest.raises(KeyboardInterrupt):
        store.run("train/on_policy", taking(clock, 100, KeyboardInterrupt()))
    assert json.loads(tries.read_text()) == {"cut_tries_seconds": [100.0]}
    with pytest.raises(RuntimeError):
        store.run("train/on_policy", taking(clock, 40, RuntimeError("trainer failed")))
    assert json.loads(tries.read_text()) == {"cut_tries_seconds": [100.0, 40.0]}
    assert not store.files.stage("train/on_policy").exists()

    doc = store.run("train/on_policy", taking(clock, 25))
    assert (doc["seconds"], doc["cut_tries_seconds"]) == (25.0, [100.0, 40.0])
    assert said[-1] == "[train/on_policy] done in 25 s (and 140 s in 2 tries cut before)"
    assert not tries.exists()
    assert store.seconds() == {"train-on_policy": 165.0}

    store.run("train/on_policy", taking(clock, 999))  # kept: not run, nothing counted
    assert store.seconds() == {"train-on_policy": 165.0} and not tries.exists()
    doc = store.run("prompts", taking(clock, 7))  # a stage never cut has no cut tries
    assert "cut_tries_seconds" not in doc and store.seconds()["prompts"] == 7.0


KILLED = """
import sys, time
from eagledata.quality.config import QualityConfig
from eagledata.quality.layout import experiment_files
from eagledata.quality.stages import Stages
config = QualityConfig(experiment="tries", output_dir=sys.argv[1])
Stages(config, experiment_files(config), print, tries_every_s=0.05).run("train/on_policy", lambda: time.sleep(60))
"""


def test_a_sigkilled_try_leaves_the_time_it_had_taken(tmp_path):
    """A try SIGKILLed mid-stage (no handler runs) has written its seconds while it ran, to `tries_every_s`: the
    finishing try counts them."""
    lib = str(Path(eagledata.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([lib, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], env=env)
    tries = experiment_files(QualityConfig(**CONFIG, output_dir=str(tmp_path))).stage("train/on_policy")
    tries = tries.with_suffix(".tries")
    started = time.monotonic()
    try:
        while not (tries.is_file() and json.loads(tries.read_text())["cut_tries_seconds"][-1] >= 0.5):
            assert proc.poll() is None and time.monotonic() - started < 60, "the try never wrote its seconds"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    bound = time.monotonic() - started
    clock, said = Clock(), []
    doc = stages(tmp_path, clock, said).run("train/on_policy", taking(clock, 3))
    [cut] = doc["cut_tries_seconds"]
    assert 0.5 <= cut <= bound and doc["seconds"] == 3.0


def test_a_tries_file_that_is_not_one_is_named(tmp_path):
    clock, said = Clock(), []
    store = stages(tmp_path, clock, said)
    tries = store.files.stage("extract").with_suffix(".tries")
    tries.parent.mkdir(parents=True)
    tries.write_text('{"cut_tries_seconds": "long"}')
    with pytest.raises(InputError, match="not a stage's tries") as e:
        store.run("extract", taking(clock, 1))
    assert str(tries) in str(e.value)


def test_a_sizes_cost_counts_its_cut_tries(tmp_path):
    """A training cut once (30 s) and finished in 100 s costs 130 s: longer than the other arm's 120 s, so it is the
    size's training time; a cut τ try counts too; `cut_seconds` is the part of the total the cut tries were (the
    shorter arm's cut try runs beside the longer one and is not in the total)."""
    def stage(name, seconds, cut=None):
        path = tmp_path / "big" / "stages" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"seconds": seconds, "peak_mib": 100.0,
                                    **({"cut_tries_seconds": cut} if cut else {})}))

    stage("train-on_policy", 100.0, [30.0])
    stage("train-off_policy", 120.0, [5.0])
    stage("tau-on_policy", 10.0, [2.5])
    stage("records-on_policy", 50.0)
    assert curve.size_costs(tmp_path, ["big"]) == [
        {"experiment": "big", "train_seconds": 130.0, "tau_seconds": 12.5, "other_seconds": 50.0, "seconds": 192.5,
         "cut_seconds": 32.5, "peak_mib": 100.0}]
