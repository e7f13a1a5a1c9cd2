"""The project root is found, not assumed: a notebook means the same params/ and outputs/ wherever it lies
(notebooks/, a report in outputs/runs/, a copy anywhere in the project), in JupyterLab and under papermill."""
import json
import os
import re
from pathlib import Path

import pytest

from eagledata.errors import InputError
from eagledata.notebooks import (NOTEBOOK_DIR, PROJECT_ROOT_ENV, find_project_root, is_project_root,
                                 use_project_root)


@pytest.fixture(autouse=True)
def no_root_setting(monkeypatch):
    monkeypatch.delenv(PROJECT_ROOT_ENV, raising=False)


def make_project(root: Path, marker: str = "pyproject") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if marker == "pyproject":
        (root / "pyproject.toml").write_text('[project]\nname = "eagledata"\nversion = "0"\n')
    else:  # a checkout's layout: params/ beside lib/eagledata
        (root / "params").mkdir()
        (root / "lib" / "eagledata").mkdir(parents=True)
    for sub in ("notebooks", "outputs/runs", "scratch/deep/er"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


@pytest.mark.parametrize("marker", ["pyproject", "layout"])
@pytest.mark.parametrize("where", ["", "notebooks", "outputs/runs", "scratch/deep/er"])
def test_found_from_any_folder_of_the_project(tmp_path, monkeypatch, marker, where):
    root = make_project(tmp_path / "proj", marker)
    monkeypatch.chdir(root / where)  # where JupyterLab starts the kernel: the notebook's folder
    assert use_project_root() == root.resolve() and Path.cwd() == root.resolve()
    assert use_project_root() == root.resolve()  # Run All again in the same kernel: stays


def test_the_repository_itself_is_a_project():
    assert find_project_root(NOTEBOOK_DIR) == NOTEBOOK_DIR.parent
    assert find_project_root(NOTEBOOK_DIR.parent / "outputs") == NOTEBOOK_DIR.parent


def test_another_projects_pyproject_is_passed_by(tmp_path):
    root = make_project(tmp_path / "proj")
    other = root / "scratch" / "vendor"
    other.mkdir(parents=True)
    (other / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    (root / "scratch" / "pyproject.toml").write_text("this is [not toml")
    (other / "params").mkdir()  # params/ alone is not a project either (outputs/demo/ has one)
    assert not is_project_root(other) and not is_project_root(root / "scratch")
    assert find_project_root(other) == root.resolve()


def test_outside_a_checkout_the_error_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=PROJECT_ROOT_ENV) as e:
        use_project_root()
    assert str(tmp_path) in str(e.value) and Path.cwd() == tmp_path


def test_the_setting_names_the_root(tmp_path, monkeypatch):
    root = make_project(tmp_path / "proj")
    elsewhere = tmp_path / "my-study"
    elsewhere.mkdir()
    monkeypatch.chdir(root / "notebooks")
    monkeypatch.setenv(PROJECT_ROOT_ENV, str(elsewhere))  # explicit beats found
    assert use_project_root() == elsewhere and Path.cwd() == elsewhere
    monkeypatch.setenv(PROJECT_ROOT_ENV, str(tmp_path / "missing"))
    with pytest.raises(InputError, match=f"{PROJECT_ROOT_ENV}.*not a directory"):
        find_project_root()


def test_run_notebook_sets_the_root_for_its_kernel_only(tmp_path, monkeypatch):
    from eagledata.notebooks import _project_root_env

    with _project_root_env(tmp_path):
        assert os.environ[PROJECT_ROOT_ENV] == str(tmp_path.resolve())
    assert PROJECT_ROOT_ENV not in os.environ
    monkeypatch.setenv(PROJECT_ROOT_ENV, "/before")
    with _project_root_env(tmp_path):
        pass
    assert os.environ[PROJECT_ROOT_ENV] == "/before"


# -- the notebooks themselves, under papermill, from wherever they lie ------------------------------------
LOCATIONS = ["notebooks", "outputs/runs", "scratch/study"]  # the notebooks folder, a report's, any other
SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.5, "content_median": 20, "content_sigma": 0.5, "max_total": 400}


@pytest.fixture(scope="module")
def emu(tokenizer_dir):
    from eagledata.emulator import run_emulator

    with run_emulator(speed=0, content=SMALL, balance=1000, seed=7) as handle:
        yield handle


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from eagledata.training.tiny import build_tiny_model

    directory = tmp_path_factory.mktemp("models") / "tiny-kimi"
    build_tiny_model("kimi_k25", directory, hidden_size=64, num_layers=6)
    return directory


def user_project(root: Path, prompts: int = 12) -> Path:
    """A project as a user has it: the marker, params/datasets.yaml naming a prompt file by a path relative
    to the root, and the notebooks in notebooks/."""
    make_project(root)
    source = NOTEBOOK_DIR.parent / "examples" / "prompts" / "demo-a.jsonl"
    (root / "examples" / "prompts").mkdir(parents=True)
    lines = source.read_text().splitlines(keepends=True)[:prompts]
    (root / "examples" / "prompts" / "demo-a.jsonl").write_text("".join(lines))
    (root / "params" / "datasets.yaml").parent.mkdir(exist_ok=True)
    (root / "params" / "datasets.yaml").write_text("demo-a:\n  prompts: examples/prompts/demo-a.jsonl\n")
    return root


def run_from(project: Path, location: str, name: str, **parameters) -> Path:
    """Copy notebooks/<name>.ipynb into `location` and run it there, the kernel starting in that folder as
    JupyterLab starts it; no root is named, so the notebook must find it."""
    import shutil

    from eagledata.notebooks import execute_notebook, notebook_path

    folder = project / location
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / f"{name}.ipynb"
    if location != "notebooks" or not copy.exists():
        shutil.copy(notebook_path(name), copy)
    return execute_notebook(copy, folder / f"{name}.out.ipynb", parameters, cwd=folder)


@pytest.mark.parametrize("location", LOCATIONS)
def test_every_notebook_runs_wherever_it_lies(location, emu, tiny_model, tmp_path):
    """The whole chain with relative parameters only: each notebook reads and writes the project's params/ and
    outputs/, whichever folder it runs from, and leaves no params/ or outputs/ of its own beside itself."""
    from eagledata.generation.conversations.datasets import load_datasets
    from eagledata.notebooks import cell_outputs_text

    project = user_project(tmp_path / "proj")
    (project / "models").mkdir()
    (project / "models" / "tiny-kimi").symlink_to(tiny_model)
    run_from(project, location, "providers", base_url=emu.base_url)
    assert (project / "params" / "routing" / "kimi-k2.5.yaml").is_file()
    run_from(project, location, "budget", budget_usd=0.5, reserve_usd=0.05, round_to=1000)
    assert load_datasets(project / "params" / "datasets.yaml")["demo-a"].target_output_tokens
    out = run_from(project, location, "generate", base_url=emu.base_url, concurrency=8, max_tokens=400,
                   reserve_usd=0.0)
    assert "stop reason: completed" in cell_outputs_text(out)
    assert conversations_in(project) == 12  # demo-a's first 12 prompts, three of them two user turns: a record a turn
    out = run_from(project, location, "tokenizer", records="outputs/datasets/demo-a/records.jsonl")
    assert f"PASS: {records_in(project)} records" in cell_outputs_text(out) and records_in(project) > 12
    out = run_from(project, location, "hidden_states", datasets=["demo-a"], model="models/tiny-kimi", device="cpu",
                   max_tokens_per_batch=4096)
    assert re.search(r"verified [1-9]\d* samples", cell_outputs_text(out))  # demo-a repeats a prompt: 11
    assert (project / "outputs" / "hidden_states" / "train" / "manifest.json").is_file()
    assert not {"params", "outputs"} & {p.name for p in (project / location).iterdir()}


def test_notebook_outside_a_checkout_names_the_setting(tmp_path):
    import shutil

    from papermill.exceptions import PapermillExecutionError

    from eagledata.notebooks import execute_notebook, notebook_path

    copy = shutil.copy(notebook_path("tokenizer"), tmp_path / "tokenizer.ipynb")
    with pytest.raises(PapermillExecutionError, match=f"set the environment variable {PROJECT_ROOT_ENV}"):
        execute_notebook(copy, tmp_path / "out.ipynb", cwd=tmp_path)


def records_in(project: Path) -> int:
    return len((project / "outputs" / "datasets" / "demo-a" / "records.jsonl").read_text().splitlines())


def conversations_in(project: Path) -> int:
    """demo-a's conversations with a record (a record per generated turn; `turns: all` by default)."""
    lines = (project / "outputs" / "datasets" / "demo-a" / "records.jsonl").read_text().splitlines()
    return len({json.loads(line)["conversation_id"] for line in lines})


def test_a_report_run_again_continues_its_work(emu, tmp_path):
    """`papermill notebooks/generate.ipynb outputs/runs/….ipynb` from the root, then the report run again from
    its own folder (as JupyterLab runs it): the same dataset and output folder; a tweak of its parameters
    continues the same work; once finished, a run answers "completed" and sends nothing."""
    import nbformat

    from eagledata.notebooks import cell_outputs_text, execute_notebook, notebook_path

    project = user_project(tmp_path / "proj")
    report = project / "outputs" / "runs" / "generate-demo-a.ipynb"
    execute_notebook(notebook_path("generate"), report, dict(
        dataset="demo-a", base_url=emu.base_url, concurrency=2, max_tokens=400, reserve_usd=0.0,
        prior_output_median_tokens=80.0, max_spend_usd=0.002), cwd=project)
    assert "stop reason: max_spend_reached" in cell_outputs_text(report)
    first = records_in(project)
    assert 0 < conversations_in(project) < 12

    execute_notebook(report, report, cwd=report.parent)  # Run All on the report, where it lies
    assert "stop reason: max_spend_reached" in cell_outputs_text(report) or "completed" in cell_outputs_text(report)
    assert records_in(project) > first
    assert not (report.parent / "outputs").exists() and not (report.parent / "params").exists()

    nb = nbformat.read(report, as_version=4)  # the user lifts the cap in the injected cell and runs again
    cell = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
    cell.source += "\nmax_spend_usd = None\n"
    nbformat.write(nb, report)
    execute_notebook(report, report, cwd=report.parent)
    assert "stop reason: completed" in cell_outputs_text(report) and conversations_in(project) == 12
    done = records_in(project)

    before = emu.stats()
    execute_notebook(report, report, cwd=report.parent)
    after = emu.stats()
    assert "stop reason: completed" in cell_outputs_text(report)
    assert after["requests"] == before["requests"] and after["charged_usd"] == before["charged_usd"]
    assert records_in(project) == done
