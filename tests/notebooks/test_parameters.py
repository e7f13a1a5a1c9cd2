"""A name papermill injects must be one of the notebook's parameters: `-p max_spend 0.0001` (the cap is
`max_spend_usd`) would otherwise run with no cap, papermill printing only "Passed unknown parameter". Every notebook
refuses it in its settings cell, the first cell after the injection, before any work."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagledata.notebooks import NOTEBOOK_DIR, notebook_path, parameter_settings

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def calls(source: str) -> list[ast.Call]:
    """The calls of a cell in the order they run (statement by statement, outer before inner)."""
    found = []
    for statement in ast.parse(source.replace("await ", "")).body:
        found += sorted((n for n in ast.walk(statement) if isinstance(n, ast.Call)),
                        key=lambda n: (n.lineno, n.col_offset))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_checks_its_injected_parameters_before_any_work(path):
    """A notebook cannot forget the check: its parameters cell is the one generated from its settings class, and
    the cell after it (where papermill's injected cell runs) builds those settings from the kernel's globals
    (`<Config>.from_params(globals())`, which refuses an injected name that is not a parameter) before calling
    anything but `use_project_root()`."""
    settings = parameter_settings()[path.stem]
    cells = code_cells(path)
    assert "parameters" in cells[0].get("metadata", {}).get("tags", []), "the parameters cell is the first code cell"
    assert "".join(cells[0]["source"]) == settings.parameters_cell()
    first = [c for c in calls("".join(cells[1]["source"])) if ast.unparse(c.func) != "use_project_root"][0]
    assert ast.unparse(first) == f"{settings.__name__}.from_params(globals())"


def files_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def emu(tokenizer_dir):
    from eagledata.emulator import run_emulator

    with run_emulator(speed=0, balance=1000, seed=3) as handle:
        yield handle


@pytest.mark.parametrize("name", [p.stem for p in NOTEBOOKS])
def test_a_mistyped_parameter_fails_before_any_work(name, emu, tmp_path):
    """The issue's command, on every notebook: `papermill <nb> out.ipynb -p max_spend 0.0001` fails with one message
    naming the closest parameter (generate: the cap, max_spend_usd), in the settings cell; no later cell runs,
    nothing is written in the project and no request reaches the API. Also `-y` YAML (a list) beside it."""
    project = tmp_path / "project"
    (project / "params").mkdir(parents=True)
    prompts = NOTEBOOK_DIR.parent / "examples" / "prompts"
    (project / "params" / "datasets.yaml").write_text(
        f"demo-a: {{prompts: {prompts / 'demo-a.jsonl'}, target_output_tokens: 2000}}\n"
        f"demo-b: {{prompts: {prompts / 'demo-b.jsonl'}, target_output_tokens: 2000}}\n")
    before = files_under(project)
    requests = emu.stats()["requests"]
    report = tmp_path / "report.ipynb"
    extra = {"generate": ["-y", "dataset: [demo-a, demo-b]", "-p", "base_url", emu.base_url, "-p", "limit", "2",
                          "-p", "concurrency", "4", "-p", "max_tokens", "400", "-p", "reserve_usd", "0"],
             "providers": ["-p", "base_url", emu.base_url], "budget": ["-p", "base_url", emu.base_url]}
    cmd = [sys.executable, "-m", "papermill", str(notebook_path(name)), str(report), "-p", "max_spend", "0.0001",
           *extra.get(name, [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=project,
                          env={**os.environ, "EAGLEDATA_PROJECT_ROOT": str(project)})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "Passed unknown parameter: max_spend" in output  # papermill's own warning, which alone was not enough
    nb = json.loads(report.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "injected-parameters" in code[1]["metadata"]["tags"]
    [error] = [o for o in code[2]["outputs"] if o["output_type"] == "error"]
    assert error["ename"] == "InputError"
    if name == "generate":
        assert error["evalue"] == "unknown parameter 'max_spend' (did you mean 'max_spend_usd'?)"
    else:
        assert error["evalue"].startswith("unknown parameter 'max_spend' (")
    assert f"InputError: {error['evalue']}" in output
    assert all(c["execution_count"] is None for c in code[3:]), "a cell after the settings cell ran"
    assert files_under(project) == before, "something was written in the project"
    assert emu.stats()["requests"] == requests, "a request was sent"
