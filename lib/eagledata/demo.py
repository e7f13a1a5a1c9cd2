"""`make demo`: every workbench notebook, end to end, against the local OpenRouter emulator.

The emulator runs in the background on a free port and is always stopped. Decisions the notebooks
write (routing, targets) go to `<output_dir>/demo/params/`, never into the tracked `params/`.
Executed reports land in `<output_dir>/runs/`.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

import yaml

from .agentic.tasks import read_tasks
from .agentic.verify import replay_trajectories
from .defaults import EMULATOR_SPEED
from .emulator import run_emulator
from .emulator_process import embedded_config
from .errors import InputError, command_prog, run_command
from .notebooks import NOTEBOOK_DIR, read_results, run_notebook
from .paths import DATASETS_FILE, assembled_dir, dataset_files, datasets_dir, hidden_state_files, routing_file, runs_dir
from .records import load_records

ROOT = NOTEBOOK_DIR.parent
DEMO_DATASETS = ("demo-a", "demo-b", "demo-tools", "demo-agentic")
DEMO_AGENTIC = "demo-agentic"  # a task file: examples/agentic's tasks, each step's calls run in its key-value store
DEMO_SET = "demo"  # the assembled training set and its hidden states
# How the emulated agent writes its calls for the agentic tasks: arguments mostly from the conversation and earlier
# results, a few slips (each an error result the trajectory goes on from).
AGENT_STYLE = {"context_share": 0.7, "slips": {"unknown_name": 0.03, "bad_json": 0.03, "missing_required": 0.03,
                                               "wrong_type": 0.03}}


def prepare_params(demo_dir: Path) -> Path:
    """A private copy of the demo datasets file, prompt paths made absolute."""
    params = demo_dir / "params"
    if params.exists():
        shutil.rmtree(params)
    params.mkdir(parents=True)
    raw = yaml.safe_load((ROOT / DATASETS_FILE).read_text())
    demo = {name: {**raw[name], "prompts": str((ROOT / raw[name]["prompts"]).resolve())} for name in DEMO_DATASETS}
    path = params / "datasets.yaml"
    path.write_text(yaml.safe_dump(demo, sort_keys=False))
    return path


def headline(name: str, r: dict) -> str:
    """One line of what a notebook published, for the demo's output."""
    if name == "providers":
        p = r["pricing"]
        return (f"{len(r['routing']['eligible'])} eligible, {len(r['routing']['excluded'])} excluded; "
                f"cheapest eligible {p['cheapest_eligible']} ${p['cheapest_eligible_completion_per_m']:.2f}/M output")
    if name == "budget":
        return f"targets {r['plan']['targets']} for ${r['plan']['total_usd']:.2f} of ${r['plan']['usable_usd']:.2f}"
    if name == "generate":
        s = r["summary"]
        per = "; ".join(f"{n} {d['stop_reason']}, {d['records']} records, {d['output_tokens']:,} tokens"
                        for n, d in s.get("datasets", {}).items())
        fid = ", ".join(f"{who} {p['verdict']} ({p['repaired']} of {p['answers']} repaired, {p['refused']} refused)"
                        for who, p in (s.get("fidelity") or {}).get("providers", {}).items())
        return (f"{s['stop_reason']}; {s['records']} records, {s['output_tokens']:,} output tokens, "
                f"charged ${s['run']['spend_usd']:.4f}" + (f" ({per})" if per else "")
                + (f"; fidelity: {fid}" if fid else ""))
    if name == "tokenizer":
        return r["report"]["verdict"]
    if name == "hidden_states":
        e = r["extraction"]
        audit = r.get("audit") or {}
        verdicts = ", ".join(f"{who} {p['verdict']}" for who, p in (audit.get("providers") or {}).items())
        return (f"{e['tokens']:,} tokens of {r['assembly']['samples']} samples stored, {r['verified_samples']} verified"
                + (f"; fidelity audit: {verdicts}, {len(audit['outliers'])} outliers" if verdicts else ""))
    return ""


def check_agentic(demo: Path, datasets: Path) -> str:
    """The demo's own check of its agentic dataset (beside the tokenizer notebook's token-exact one): every tool
    result in the records is what a fresh environment gives when the trajectory's calls are replayed in order, in
    this process (not the run's workers). A mismatch fails the demo."""
    prompts = Path(yaml.safe_load(datasets.read_text())[DEMO_AGENTIC]["prompts"])
    tasks = {t.id: t for t in read_tasks(prompts)}
    check = replay_trajectories(load_records(dataset_files(DEMO_AGENTIC, demo).records), tasks, base=prompts.parent)
    if check.mismatches:
        cid, call, recorded, fresh = check.mismatches[0]
        raise RuntimeError(f"{DEMO_AGENTIC}: {len(check.mismatches)} tool results differ from a fresh replay's, "
                           f"first {cid} {call}: recorded {recorded[:200]!r}, replayed {fresh[:200]!r}")
    if not check.trajectories:
        raise RuntimeError(f"{DEMO_AGENTIC}: no trajectory recorded")
    errors = ", ".join(f"{n} {kind}" for kind, n in sorted(check.errors.items())) or "none"
    ended = ", ".join(f"{n} {how}" for how, n in sorted(check.ended.items()))
    return (f"{check.trajectories} trajectories of {len(tasks)} tasks ({ended}), {check.calls} calls, every result "
            f"a fresh replay's; error results: {errors}")


def _missing(extras: list[str]) -> None:
    raise InputError(f"the demo runs every notebook and needs {', '.join(extras)}: pip install 'eagledata[dev]'")


def _speed(text: str) -> float:
    try:
        speed = float(text)
    except ValueError:
        speed = -1.0
    if not 0 <= speed < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return speed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=command_prog("eagledata-demo", "eagledata.demo"),
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", default="outputs")
    ap.add_argument("--speed", type=_speed, default=EMULATOR_SPEED,
                    help="emulator delay factor (1 = real latencies), as emulator_speed for base_url emulator")
    args = ap.parse_args(argv)
    missing = [f"eagledata[{extra}] ({module})" for module, extra in (("papermill", "notebooks"),
                                                                        ("torch", "hidden-states"))
               if importlib.util.find_spec(module) is None]
    if missing:
        return run_command(ap.prog, lambda: _missing(missing))
    return run_command(ap.prog, lambda: _demo(args))


def _demo(args: argparse.Namespace) -> int:
    out = Path(args.output_dir).resolve()
    runs, demo = runs_dir(out), out / "demo"
    # A fresh demo each time: answers differ between runs (retries draw other content), so states kept from a
    # previous run would not match the new records. The tiny model is kept; it does not change.
    for stale in (datasets_dir(demo), datasets_dir(demo / "batch"), assembled_dir(DEMO_SET, demo),
                  hidden_state_files(DEMO_SET, demo).directory):
        shutil.rmtree(stale, ignore_errors=True)
    datasets = prepare_params(demo)
    params = datasets.parent
    truth = demo / "ground_truth.jsonl"
    truth.unlink(missing_ok=True)

    def step(name: str, report: str, /, **parameters) -> None:
        path = run_notebook(name, runs / f"{report}.ipynb", parameters)
        print(f"demo: {name}.ipynb -> {path}: {headline(name, read_results(path))}", flush=True)

    # A few faults of the real service, so the generate report shows retries at work.
    faults = {"rate_limit": 0.02, "bad_gateway": 0.02, "empty_content": 0.02, "truncated_json": 0.01,
              "connection_reset": 0.01, "retry_after": 1}
    # One quirky endpoint: the cheapest eligible provider serves a tenth of its answers without a reasoning parser
    # ("reasoning</think>answer" as content), so the generate report shows them repaired and kept.
    quirky = [{"provider": "Chutes", "quirks": {"bare_close": 0.1}}]
    # The emulator a `base_url: emulator` run gets (its model follows the datasets' tool calls at the default
    # tool_follow_rate), with the demo's own seed, faults and quirks, shared by every notebook below.
    prompts = [yaml.safe_load(datasets.read_text())[name]["prompts"] for name in DEMO_DATASETS]
    with run_emulator(embedded_config(speed=args.speed, tool_datasets=prompts), ground_truth_file=str(truth),
                      seed=2026, faults=faults, endpoints=quirky, tool_style=AGENT_STYLE) as emu:
        print(f"demo: emulator at {emu.base_url}", flush=True)
        step("providers", "providers", base_url=emu.base_url, params_dir=str(params), output_dir=str(demo))
        routing = routing_file("moonshotai/kimi-k2.5", params)
        step("budget", "budget", datasets_file=str(datasets), routing=str(routing), budget_usd=0.5,
             reserve_usd=0.05, round_to=1000, output_dir=str(demo))
        # Every dataset in one run, as the job is done: one pool, one budget.
        step("generate", "generate-demo", dataset=list(DEMO_DATASETS), datasets_file=str(datasets),
             base_url=emu.base_url, params_dir=str(params), output_dir=str(demo), concurrency=64, max_tokens=8192,
             reserve_usd=0.0)
        print(f"demo: {DEMO_AGENTIC}: {check_agentic(demo, datasets)}", flush=True)
        # The batch route: the first dataset through Moonshot's Batch API (an emulator's, started for the step), in
        # rounds toward the target the budget wrote, at the batch price; its records under demo/batch/.
        step("generate", "generate-batch", dataset=DEMO_DATASETS[0], datasets_file=str(datasets), base_url="emulator",
             route="batch", emulator_speed=0.002, batch_poll_s=60, output_dir=str(demo / "batch"),
             params_dir=str(params), max_tokens=8192, reserve_usd=0.0)
        step("tokenizer", "tokenizer", records=str(dataset_files(DEMO_DATASETS[0], demo).records),
             truth=str(truth))
        step("tokenizer", "tokenizer-tools", records=str(dataset_files("demo-tools", demo).records), truth=str(truth))
        step("tokenizer", "tokenizer-agentic", records=str(dataset_files(DEMO_AGENTIC, demo).records),
             truth=str(truth))
        step("tokenizer", "tokenizer-samples")
        step("budget", "budget-actual", datasets_file=str(datasets), routing=str(routing), budget_usd=0.5,
             reserve_usd=0.05, round_to=1000, output_dir=str(demo), write=False)
    # Hidden states need no API: a tiny random kimi_k25 model stands in for the verifier on CPU. Samples of up to
    # 1,024 tokens (the longer ones dropped by the length policy, the report says how many): the audit scores every
    # output token over K2.5's 163,840-token vocabulary, which a 64-wide model cannot make cheap (~1.6k tok/s here),
    # and the README's first command should take about a minute, not three.
    from .training.tiny import build_tiny_model

    model_dir = demo / "tiny-kimi-k25"
    if not (model_dir / "config.json").exists():
        build_tiny_model("kimi_k25", model_dir, hidden_size=64, num_layers=6)
    step("hidden_states", "hidden_states", datasets=list(DEMO_DATASETS), output_dir=str(demo), name=DEMO_SET,
         model=str(model_dir), storage="bf16", max_tokens_per_batch=8192, device="cpu", max_length=1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
