"""The workbench notebooks as files: papermill execution (`make demo`, the notebook tests), and parameters
cells generated from the settings they configure (`python -m eagledata.notebooks` rewrites them)."""
from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import InputError
from .paths import PARAMS_DIR
from .settings import Settings

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"


PROJECT_ROOT_ENV = "EAGLEDATA_PROJECT_ROOT"
PROJECT_NAME = "eagledata"


def is_project_root(folder: Path) -> bool:
    """A checkout of this project: `params/` beside `lib/eagledata`, or a pyproject.toml naming eagledata."""
    if (folder / PARAMS_DIR).is_dir() and (folder / "lib" / PROJECT_NAME).is_dir():
        return True
    try:
        with (folder / "pyproject.toml").open("rb") as f:
            return tomllib.load(f).get("project", {}).get("name") == PROJECT_NAME
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError):
        return False


def find_project_root(start: str | Path | None = None) -> Path:
    """The folder relative parameters (params/, outputs/) are read against, wherever the notebook lies.

    `$EAGLEDATA_PROJECT_ROOT` when set (any folder: for projects outside a checkout, and tests); else the
    nearest folder at or above `start` (default: the working directory) that `is_project_root`.
    """
    explicit = os.environ.get(PROJECT_ROOT_ENV, "").strip()
    if explicit:
        root = Path(explicit).expanduser().resolve()
        if not root.is_dir():
            raise InputError(f"not a directory: {explicit}", field=PROJECT_ROOT_ENV)
        return root
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_project_root(folder):
            return folder
    raise InputError(f"{here} is not inside an eagledata checkout (no folder above it holds pyproject.toml naming "
                     f"eagledata, or params/ beside lib/eagledata): set the environment variable {PROJECT_ROOT_ENV} "
                     f"to the project folder that holds params/ and outputs/ (before starting JupyterLab or "
                     f"papermill)", field=PROJECT_ROOT_ENV)


def use_project_root() -> Path:
    """Every notebook's first step: move to the project root (`find_project_root`), so relative parameters
    mean the same from notebooks/, from a report in outputs/runs/, or from a copy anywhere in the project,
    in JupyterLab (whose kernel starts in the notebook's folder) and under papermill alike."""
    root = find_project_root()
    os.chdir(root)
    return root


def notebook_path(name: str) -> Path:
    path = NOTEBOOK_DIR / (name if name.endswith(".ipynb") else f"{name}.ipynb")
    if not path.is_file():
        raise FileNotFoundError(f"no notebook {path}")
    return path


def run_notebook(name: str, output: str | Path, parameters: dict[str, Any] | None = None,
                 cwd: str | Path | None = None, timeout: int = 900, project_root: str | Path | None = None) -> Path:
    """Run `notebooks/<name>.ipynb` into `output` with papermill; a cell error raises.

    The kernel comes from the notebook's own kernelspec, as it does for `papermill in out -p …`. It starts
    in `cwd` (default: the repository root) and its first cell moves to the project root found from there;
    `project_root` names that folder instead (as `$EAGLEDATA_PROJECT_ROOT`), e.g. for a `cwd` outside
    any checkout.
    """
    return execute_notebook(notebook_path(name), output, parameters, cwd=cwd or NOTEBOOK_DIR.parent,
                            timeout=timeout, project_root=project_root)


def generate_notebook(params: dict[str, Any], output: Path) -> None:
    """generate.ipynb by papermill with `params` (hours allowed per cell: the run is one cell): the quality
    experiment's on-policy regeneration (`quality.regenerate.RunNotebook`), injected by its callers (quality.ipynb,
    `python -m eagledata.quality.experiment`) so that quality/ never imports this module."""
    run_notebook("generate", output, params, cwd=output.parent, timeout=6 * 3600, project_root=output.parent)


def execute_notebook(notebook: str | Path, output: str | Path, parameters: dict[str, Any] | None = None, *,
                     cwd: str | Path, timeout: int = 900, project_root: str | Path | None = None) -> Path:
    """Run any notebook file (a workbench notebook, or a report to run again) with papermill from `cwd`."""
    import papermill

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with _project_root_env(project_root):
        papermill.execute_notebook(str(notebook), str(output), parameters=parameters or {}, cwd=str(cwd),
                                   progress_bar=False, execution_timeout=timeout,
                                   kernel_manager_class=_kernel_manager_class())
    return output


@contextmanager
def _project_root_env(root: str | Path | None) -> Iterator[None]:
    """The kernel inherits this process's environment (papermill passes no other), so set the variable for
    the run and put back what was there."""
    before = os.environ.get(PROJECT_ROOT_ENV)
    if root is not None:
        os.environ[PROJECT_ROOT_ENV] = str(Path(root).resolve())
    try:
        yield
    finally:
        if root is not None:
            if before is None:
                os.environ.pop(PROJECT_ROOT_ENV, None)
            else:
                os.environ[PROJECT_ROOT_ENV] = before


@lru_cache(maxsize=1)
def _kernel_manager_class() -> type:
    """nbclient's kernel manager, quiet: it gives the kernel CurveZMQ keys when its kernelspec declares support
    (ours does), so the localhost TCP traffic is encrypted and ipykernel has no warning to print about it; and it
    does not SIGINT a kernel it is shutting down after the run (ipykernel would log a KeyboardInterrupt)."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class QuietKernelManager(AsyncKernelManager):
        @default("transport_encryption")
        def _encrypt_when_supported(self) -> str:
            import zmq

            return "auto" if zmq.has("curve") else "disabled"  # a libzmq built without libsodium: plain TCP

        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:  # the notebook has finished: a shutdown request follows
                return
            await super()._async_interrupt_kernel()

    return QuietKernelManager


# -- published results ------------------------------------------------------------------------------
RESULT_MIME = "application/vnd.eagledata.result+json"


def jsonable(value: Any) -> Any:
    """A value as plain JSON: dataclasses and mappings as objects, pandas frames as lists of rows, numpy
    scalars as numbers, paths as strings, NaN and infinities as null."""
    import dataclasses
    import math

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    module = type(value).__module__
    if module.startswith("pandas"):
        if hasattr(value, "to_dict") and hasattr(value, "columns"):
            return jsonable(value.reset_index(drop=value.index.name is None).to_dict(orient="records"))
        if hasattr(value, "to_dict"):
            return jsonable(value.to_dict())
    if module.startswith("numpy"):
        return jsonable(value.tolist() if hasattr(value, "tolist") else value.item())
    raise TypeError(f"cannot publish a {type(value).__name__}: make it numbers, strings, lists or dicts")


def publish(name: str, value: Any) -> None:
    """Publish one of this notebook's key figures as structured data, so a test, the demo or a later notebook
    reads the value (`read_results`) instead of searching printed text. Stored in the executed notebook as an
    `application/vnd.eagledata.result+json` output, which JupyterLab does not render; outside a kernel, nothing."""
    data = {"name": name, "value": jsonable(value)}
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is not None:
        display({RESULT_MIME: data}, raw=True)


def read_results(path: str | Path) -> dict[str, Any]:
    """Every value an executed notebook published, by name (a name published twice keeps the last)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    results: dict[str, Any] = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {}).get(RESULT_MIME)
            if data is not None:
                results[data["name"]] = data["value"]
    return results


def cell_outputs_text(path: str | Path) -> str:
    """All text a run printed or displayed: for checks on reports (e.g. no secret leaked)."""
    nb = json.loads(Path(path).read_text())
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            for value in out.get("data", {}).values():
                parts.append("".join(value) if isinstance(value, list) else str(value))
    return "\n".join(parts)


def parameter_settings() -> dict[str, type[Settings]]:
    """Every notebook's settings class: its parameters cell is made from it (the defaults live only there)."""
    from .generation import BudgetConfig, GenerateConfig
    from .openrouter import ProvidersConfig
    from .quality.config import CurveReportConfig, GridConfig, QualityConfig
    from .text import TokenizerReportConfig
    from .training import HiddenStatesConfig

    return {"providers": ProvidersConfig, "budget": BudgetConfig, "tokenizer": TokenizerReportConfig,
            "generate": GenerateConfig, "hidden_states": HiddenStatesConfig,
            "quality": QualityConfig, "quality_grid": GridConfig, "quality_curve": CurveReportConfig}


def _parameters_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))


def parameters_source(path: str | Path) -> str:
    return "".join(_parameters_cell(json.loads(Path(path).read_text()))["source"])


def sync_parameters() -> list[Path]:
    """Rewrite each generated parameters cell from its settings class; returns the notebooks changed."""
    changed = []
    for name, settings in parameter_settings().items():
        path = notebook_path(name)
        nb = json.loads(path.read_text())
        cell = _parameters_cell(nb)
        lines = settings.parameters_cell().split("\n")
        source = [line + "\n" for line in lines[:-1]] + [lines[-1]]
        if cell["source"] != source:
            cell["source"] = source
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(path)
    return changed


def main() -> int:
    """`python -m eagledata.notebooks` / `eagledata-sync-notebooks`: rewrite the generated parameters cells."""
    for changed_path in sync_parameters():
        print(f"parameters cell rewritten: {changed_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
