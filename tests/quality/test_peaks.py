"""Peak memory per stage (`peaks.py`; `Stages.run`'s `peak_mib`, summary.json's `stage_peak_mib`): each stage's own
figure — this process and the commands it runs, summed, at their largest while the stage ran — not the run's
largest so far, and two stages at once both see what runs beside them."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from eagledata.quality.commands import run_logged
from eagledata.quality.config import QualityConfig
from eagledata.quality.layout import experiment_files
from eagledata.quality.peaks import tree_rss
from eagledata.quality.stages import Stages

MIB = 1 << 20
# a command holding N MiB resident (touched, not merely reserved) for 1.5 s: three samples at least
HOLD = "import sys, time; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)"


def stages(tmp_path: Path) -> Stages:
    config = QualityConfig(experiment="peaks", output_dir=str(tmp_path))
    return Stages(config, experiment_files(config), say=lambda line: None)


def holding(mib: int, tmp_path: Path, label: str):
    def body():
        run_logged([sys.executable, "-c", HOLD, str(mib)], {}, tmp_path / f"{label}.log", label, say=lambda s: None)
        return {}
    return body


def test_each_stage_has_its_own_peak_not_the_largest_so_far(tmp_path):
    """A 400 MiB command, then a 50 MiB one: the first stage's peak is at least this process and 400 MiB, the
    second's ~350 MiB less (a run-wide high-water mark would say the same for both); each kept in its stage file
    and read back per stage for summary.json."""
    store = stages(tmp_path)
    base = tree_rss() / MIB
    big = store.run("train/on_policy", holding(400, tmp_path, "big"))["peak_mib"]
    small = store.run("train/off_policy", holding(50, tmp_path, "small"))["peak_mib"]
    assert big >= base + 400 and small >= base + 50 and big - small >= 300, (base, big, small)
    assert store.peaks() == {"train-on_policy": big, "train-off_policy": small}
    assert json.loads(store.files.stage("train/on_policy").read_text())["peak_mib"] == big


def test_work_in_this_process_counts_while_it_is_held(tmp_path):
    """300 MiB held in this process for 1.2 s of a stage shows in its peak; freed, the next stage's is ~300 MiB
    less."""
    store = stages(tmp_path)
    base = tree_rss() / MIB

    def allocating():
        block = bytearray(300 * MIB)
        block[::4096] = b"x" * len(block[::4096])
        time.sleep(1.2)  # two samples at least
        del block
        return {}

    first = store.run("assemble", allocating)["peak_mib"]
    second = store.run("prompts", lambda: {})["peak_mib"]
    assert first >= base + 295 and first - second >= 250, (base, first, second)


def test_stages_side_by_side_both_see_what_runs_beside_them(tmp_path):
    """Two stages at once in two threads (as the arms train), 350 and 40 MiB commands overlapping: each stage's
    peak holds both, as the machine does."""
    store = stages(tmp_path)
    base = tree_rss() / MIB
    got = {}

    def run(name, mib):
        got[name] = store.run(name, holding(mib, tmp_path, name.replace("/", "-")))["peak_mib"]

    threads = [threading.Thread(target=run, args=a) for a in (("train/on_policy", 350), ("train/off_policy", 40))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert min(got.values()) >= base + 350 + 40, (base, got)
