"""The workbench notebooks as files: papermill execution (`make demo`, the notebook tests), and parameters
cells generated from the settings they configure (`python -m eagledata.notebooks` rewrites them)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .settings import Settings

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def use_project_root() -> Path:
    """In JupyterLab the kernel starts in notebooks/; move to the project root so relative paths
    (params/, outputs/) mean the same as under `papermill` run from the root."""
    cwd = Path.cwd()
    if cwd.name == "notebooks" and (cwd.parent / "lib" / "eagledata").is_dir():
        os.chdir(cwd.parent)
        return cwd.parent
    return cwd


def notebook_path(name: str) -> Path:
    path = NOTEBOOK_DIR / (name if name.endswith(".ipynb") else f"{name}.ipynb")
    if not path.is_file():
        raise FileNotFoundError(f"no notebook {path}")
    return path


def run_notebook(name: str, output: str | Path, parameters: dict[str, Any] | None = None,
                 cwd: str | Path | None = None, timeout: int = 900) -> Path:
    """Run `notebooks/<name>.ipynb` into `output` with papermill; a cell error raises.

    The kernel comes from the notebook's own kernelspec, as it does for `papermill in out -p …`.
    Relative paths inside the notebook resolve against `cwd` (default: the repository root).
    """
    import papermill

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(notebook_path(name)), str(output), parameters=parameters or {},
                               cwd=str(cwd or NOTEBOOK_DIR.parent), progress_bar=False,
                               execution_timeout=timeout)
    return output


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
    """Notebooks whose parameters cell is made from a settings class (the defaults live only there)."""
    from .generation import GenerateConfig
    from .training import HiddenStatesConfig

    return {"generate": GenerateConfig, "hidden_states": HiddenStatesConfig}


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
