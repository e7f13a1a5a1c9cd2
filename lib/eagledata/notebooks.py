"""Execute the workbench notebooks with papermill: used by `make demo` and by the notebook tests."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
