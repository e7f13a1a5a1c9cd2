"""Every path the workbench reads or writes, in one place (the file contracts of docs/FORMATS.md).

    <params_dir>/datasets.yaml                  datasets file: prompts and token targets
    <params_dir>/routing/<model name>.yaml      routing decision (providers.ipynb)
    <output_dir>/providers/                     endpoint-listing snapshots
    <output_dir>/datasets/<dataset>/            records.jsonl, failures.jsonl, summary.json (+ done.idx, .lock,
                                                failures.retried.jsonl: failures sent again by retry_failed)
    <output_dir>/assembled/<name>/              training-set exports (SpecForge, speculators)
    <output_dir>/hidden_states/<name>/          manifest.json, index.jsonl, shard-NNNNN.safetensors
    <output_dir>/runs/                          executed notebooks (run reports)
    outputs/emulator/ (+ params/)               output_dir and params_dir of an emulator run left at the defaults

To add an output, add it here and nowhere else; stages take these objects, never join strings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATASETS_FILE", "EMULATOR_OUTPUT_DIR", "EMULATOR_PARAMS_DIR", "DatasetFiles", "HiddenStateFiles",
           "OUTPUT_DIR", "PARAMS_DIR", "assembled_dir", "catalog_snapshot", "dataset_files", "datasets_dir",
           "emulator_dirs", "hidden_state_files", "model_stem", "records_file", "routing_file", "runs_dir"]

PARAMS_DIR = "params"
OUTPUT_DIR = "outputs"
DATASETS_FILE = f"{PARAMS_DIR}/datasets.yaml"
# An emulator run (`base_url: emulator`) left at the default folders writes here instead: its records must not sit
# where a real run of the same dataset would resume over them, nor its routing decision (made from the emulated
# catalog) where a real run would send it. outputs/ is git-ignored.
EMULATOR_OUTPUT_DIR = f"{OUTPUT_DIR}/emulator"
EMULATOR_PARAMS_DIR = f"{EMULATOR_OUTPUT_DIR}/{PARAMS_DIR}"


def emulator_dirs(output_dir: str, params_dir: str) -> tuple[str, str]:
    """An emulator run's output and params folders: the defaults become `outputs/emulator` and
    `outputs/emulator/params`; folders a user named are kept."""
    return (EMULATOR_OUTPUT_DIR if output_dir == OUTPUT_DIR else output_dir,
            EMULATOR_PARAMS_DIR if params_dir == PARAMS_DIR else params_dir)


def model_stem(model: str) -> str:
    """`moonshotai/kimi-k2.5` → `kimi-k2.5`: how a model names its files."""
    return model.rstrip("/").split("/")[-1].split(":")[0]


def routing_file(model: str, params_dir: str | Path = PARAMS_DIR) -> Path:
    return Path(params_dir) / "routing" / f"{model_stem(model)}.yaml"


def catalog_snapshot(model: str, fetched_at: str, output_dir: str | Path = OUTPUT_DIR) -> Path:
    stamp = fetched_at.replace(":", "").replace("-", "")
    return Path(output_dir) / "providers" / f"{model_stem(model)}-endpoints-{stamp}.json"


def _file(name: str) -> property:
    return property(lambda self: self.directory / name, doc=f"`{name}` in this folder")


@dataclass(frozen=True)
class DatasetFiles:
    """One dataset's generation output. `done_index` is the store's resume cache, not a contract file;
    `failures_retried` keeps the failures a run with `retry_failed` sent again (history, never read back)."""

    directory: Path
    records, failures, summary = map(_file, ("records.jsonl", "failures.jsonl", "summary.json"))
    done_index, lock, failures_retried = map(_file, ("done.idx", ".lock", "failures.retried.jsonl"))


def datasets_dir(output_dir: str | Path = OUTPUT_DIR) -> Path:
    return Path(output_dir) / "datasets"


def dataset_files(dataset: str, output_dir: str | Path = OUTPUT_DIR) -> DatasetFiles:
    return DatasetFiles(datasets_dir(output_dir) / dataset)


def records_file(source: str | Path, output_dir: str | Path = OUTPUT_DIR) -> Path:
    """A dataset name means its records.jsonl; a `.jsonl` path, a file or a dataset folder is taken as is."""
    p = Path(source)
    if p.suffix == ".jsonl" or p.is_file():
        return p
    if p.is_dir():
        return DatasetFiles(p).records
    return dataset_files(str(source), output_dir).records


def assembled_dir(name: str, output_dir: str | Path = OUTPUT_DIR) -> Path:
    return Path(output_dir) / "assembled" / name


@dataclass(frozen=True)
class HiddenStateFiles:
    """One hidden-states set. `plan` and `parts/` exist while extraction runs; a finished set adds
    `manifest` and `index` (the contract files)."""

    directory: Path
    manifest, index = map(_file, ("manifest.json", "index.jsonl"))
    plan, parts = map(_file, ("plan.json", "index.parts"))


def hidden_state_files(name: str, output_dir: str | Path = OUTPUT_DIR) -> HiddenStateFiles:
    return HiddenStateFiles(Path(output_dir) / "hidden_states" / name)


def runs_dir(output_dir: str | Path = OUTPUT_DIR) -> Path:
    return Path(output_dir) / "runs"
