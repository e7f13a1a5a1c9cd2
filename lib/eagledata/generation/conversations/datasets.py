"""The datasets file (`params/datasets.yaml`): `<name>: {prompts: <path>, target_output_tokens: <int>}`, the
budget plan's `planned_usd` (what its target is expected to cost) where budget.ipynb wrote the targets, and optional
`tools` (an inline list or a JSON file) for the dataset's prompts that declare none of their own."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ...errors import InputError
from ...files import atomic_write_text
from ...prompts import Tools, normalize_tools


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    prompts: Path
    target_output_tokens: int | None
    planned_usd: float | None = None  # the budget plan's expected $ for the target (the run's planned spend line)
    tools: Tools | None = None  # declarations for prompts without their own: scan_prompts(..., tools=spec.tools)
    source: Path | None = None  # the datasets file, and the line of the entry's `prompts` there, for errors
    line: int | None = None

    def check_prompts(self) -> None:
        """Refuse a prompts file that is not there, naming the datasets file and line to fix."""
        if not self.prompts.is_file():
            raise InputError(f"prompts file not found: {self.prompts} (a relative path is read from the current "
                             f"folder, else beside the datasets file)", self.source, self.line,
                             field=f"{self.name}.prompts")


def _resolve(base: Path, p: str) -> Path:
    path = Path(p).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return base / path  # relative to the datasets file


def _tools(base: Path, path: Path, name: str, raw: Any) -> Tools | None:
    """An entry's `tools`: a list inline, or the path of a JSON file holding one (resolved like `prompts`). Errors
    name the datasets file and `<name>.tools[k]…`, or the JSON file (and its line, or `tools[k]…`)."""
    if raw is None:
        return None
    where, field = path, f"{name}.tools"
    if isinstance(raw, str):
        file = _resolve(base, raw)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(f"cannot read tools file {str(file)!r}: {e.strerror}", path, field=field) from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON: {e.msg}", file, e.lineno) from None
        where, field = file, "tools"
    if not isinstance(raw, list):
        raise InputError("must be a list of {type: function, function: {name, …}}, or the path of a JSON file "
                         "holding one", where, field=field)
    try:
        return normalize_tools(raw, field)
    except InputError as e:  # add the file to the field normalize_tools named
        raise e.at(where) from None


def _prompts_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each entry's `prompts` value, else of its name, in the datasets file's text."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(root, yaml.MappingNode):
        return {}
    lines: dict[str, int] = {}
    for key, value in root.value:
        at = key
        if isinstance(value, yaml.MappingNode):
            at = next((v for k, v in value.value if getattr(k, "value", None) == "prompts"), key)
        lines[str(key.value)] = at.start_mark.line + 1
    return lines


def load_datasets(path: str | Path, *, check_prompts: bool = False) -> dict[str, DatasetSpec]:
    """Parse and check the datasets file; prompt paths resolve against the cwd, else the file's folder.
    `check_prompts`: every prompts file must exist too (`DatasetSpec.check_prompts`)."""
    path = Path(path)
    try:
        text = path.read_text()
        raw = yaml.safe_load(text)
    except OSError as e:
        raise InputError(f"cannot read datasets file: {e.strerror}", path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"not valid YAML: {getattr(e, 'problem', e)}", path,
                         mark.line + 1 if mark else None) from None
    if not isinstance(raw, dict) or not raw:
        raise InputError("expected a mapping of dataset name -> {prompts, target_output_tokens}", path)
    specs = {}
    lines = _prompts_lines(text)
    for name, entry in raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("prompts"), str):
            raise InputError("needs 'prompts: <path>'", path, field=f"{name}.prompts")
        target = entry.get("target_output_tokens")
        if target is not None and (not isinstance(target, int) or isinstance(target, bool) or target <= 0):
            raise InputError("must be a positive integer", path, field=f"{name}.target_output_tokens")
        planned = entry.get("planned_usd")
        if planned is not None and (not isinstance(planned, (int, float)) or isinstance(planned, bool) or planned < 0):
            raise InputError("must be a non-negative number", path, field=f"{name}.planned_usd")
        specs[str(name)] = DatasetSpec(str(name), _resolve(path.parent, entry["prompts"]), target,
                                       None if planned is None else float(planned),
                                       _tools(path.parent, path, str(name), entry.get("tools")), path,
                                       lines.get(str(name)))
    if check_prompts:
        for spec in specs.values():
            spec.check_prompts()
    return specs


def get_dataset(path: str | Path, name: str) -> DatasetSpec:
    return select_datasets(path, name)[0]


def select_datasets(path: str | Path, dataset: str | list[str]) -> list[DatasetSpec]:
    """`dataset` as specs: one name, a list of names, or `all` (every dataset of the file, in its order); their
    prompts files must exist."""
    specs = load_datasets(path)
    if dataset == "all":
        chosen = list(specs.values())
    else:
        names = [dataset] if isinstance(dataset, str) else list(dataset)
        for name in names:
            if name not in specs:
                raise InputError(f"unknown dataset {name!r}; the file has {', '.join(specs)}{_list_hint(name)}", path,
                                 field="dataset")
        chosen = [specs[name] for name in names]
    for spec in chosen:
        spec.check_prompts()
    return chosen


def _list_hint(name: object) -> str:
    """For a name that is a list written as one string (papermill's -p passes strings): how to pass a list."""
    if not isinstance(name, str) or not (name.strip().startswith("[") or "," in name):
        return ""
    names = [n.strip().strip("'\"") for n in name.strip().strip("[]").split(",") if n.strip().strip("'\"")]
    return (f". It looks like a list given as one name: papermill's -p passes a string, so give a list as YAML "
            f"(papermill -y \"dataset: [{', '.join(names)}]\"), or as several names on the command line "
            f"(--dataset {' '.join(names)})")


def write_targets(path: str | Path, targets: dict[str, int], note: str = "",
                  planned_usd: dict[str, float] | None = None) -> Path:
    """Set `target_output_tokens` (and the plan's `planned_usd`) per dataset, keeping every other entry and field
    as it was."""
    path = Path(path)
    raw: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    unknown = set(targets) - set(raw)
    if unknown:
        raise InputError(f"datasets not in the file: {sorted(unknown)}", path)
    for name, tokens in targets.items():  # the loader takes positive targets only: refuse before writing any
        if int(tokens) <= 0:
            raise InputError(f"the plan gives {name} {int(tokens)} output tokens (a weight of 0, or less money than "
                             f"one token); not written, since generate refuses a datasets file with a target of 0: "
                             f"give {name} a weight or remove it from the file", path,
                             field=f"{name}.target_output_tokens")
    for name, tokens in targets.items():
        raw[name]["target_output_tokens"] = int(tokens)
        if planned_usd is not None and name in planned_usd:
            raw[name]["planned_usd"] = round(float(planned_usd[name]), 4)
    header = f"# target_output_tokens last set by budget.ipynb{': ' + note if note else ''}\n"
    return atomic_write_text(path, header + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
