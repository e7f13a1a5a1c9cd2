"""The project root is found, not assumed: a notebook means the same params/ and outputs/ wherever it lies
(notebooks/, a report in outputs/runs/, a copy anywhere in the project), in JupyterLab and under papermill."""
import os
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
