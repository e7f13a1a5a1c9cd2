"""quality/ as rooms (issue 59 item 8): each module owns one thing, and nothing in quality/ imports
eagledata.notebooks (notebooks.py reads quality.config) but the CLI's `main`, which injects the notebook runner."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import eagledata.quality as quality

QUALITY = Path(quality.__file__).parent


def notebook_imports(source: str) -> list[str]:
    """Where a module imports eagledata.notebooks outside a function named `main` (the composition root)."""
    tree = ast.parse(source)
    allowed = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "main"
               for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "notebooks" and (
                node.level == 2 or (node.module or "").startswith("eagledata.")):
            found.append(f"line {node.lineno}")
        if isinstance(node, ast.Import) and any(a.name == "eagledata.notebooks" for a in node.names):
            found.append(f"line {node.lineno}")
    return found


def test_no_quality_module_imports_the_notebooks_module():
    found = {p.name: hits for p in sorted(QUALITY.glob("*.py")) if (hits := notebook_imports(p.read_text()))}
    assert found == {}


def test_a_planted_upward_import_is_found():
    planted = "def generate_notebook(p, o):\n    from ..notebooks import run_notebook\n    run_notebook(p, o)\n"
    assert notebook_imports(planted) == ["line 2"]
    assert notebook_imports("import eagledata.notebooks\n") == ["line 1"]
    assert notebook_imports("def main():\n    from ..notebooks import generate_notebook\n") == []


@pytest.mark.parametrize(("module", "names"), [
    ("commands", ["run_logged", "Runner"]), ("layout", ["ExperimentFiles", "experiment_files"]),
    ("stages", ["Stages", "share_data", "STAGE_SETTINGS"]), ("trainer", ["train_args", "last_checkpoint"]),
    ("serve", ["serve_chat", "chat_server_command"]),
    ("workspace", ["Workspace", "ExperimentSeams"]), ("arm_data", ["ArmData", "choose_conversations"]),
    ("drafter_stages", ["DrafterStages"]),
])
def test_each_room_defines_its_own_names(module, names):
    tree = ast.parse((QUALITY / f"{module}.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)} | {
        t.id for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    assert set(names) <= defined
    experiment = ast.parse((QUALITY / "experiment.py").read_text())
    assert not set(names) & {n.name for n in experiment.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    importlib.import_module(f"eagledata.quality.{module}")


def test_the_tests_chat_vllm_is_the_librarys_launcher():
    from tests.helpers.vllm_server import harness

    source = Path(harness.__file__).read_text()
    assert "chat_server_command(" in source and "vllm.entrypoints.openai.api_server" not in source.split(
        "def start_chat_vllm")[1]


def test_regenerating_through_vllm_without_a_notebook_runner_is_refused(tmp_path):
    from eagledata.errors import InputError
    from eagledata.quality.regenerate import through_generation

    with pytest.raises(InputError, match="runner"):
        through_generation([], None, tmp_path, tmp_path, serve=None, generate=None, say=print)  # type: ignore[arg-type]
