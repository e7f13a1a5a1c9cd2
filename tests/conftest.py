import os
from pathlib import Path

import pytest

from eagledata.notebooks import run_notebook

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = os.environ.get("EAGLEDATA_TOKENIZER_DIR")


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    if not TOKENIZER_DIR:
        pytest.skip("EAGLEDATA_TOKENIZER_DIR is unset (the Makefile sets it when ../shared/assets/kimi-k2.5 exists)")
    return Path(TOKENIZER_DIR)


@pytest.fixture(scope="session")
def tok(tokenizer_dir):
    from eagledata.text.tokenizer import KimiTokenizer

    return KimiTokenizer.load(tokenizer_dir)


@pytest.fixture
def execute_notebook(tmp_path):
    """Run notebooks/<name>.ipynb with papermill and parameters into tmp_path; any cell error fails.

    tmp_path lies outside any checkout: it is named the project root (EAGLEDATA_PROJECT_ROOT), so a relative
    default (outputs/, params/) lands there and never in the repository."""

    def run(name: str, /, **parameters):
        return run_notebook(name, tmp_path / f"{name}.out.ipynb", parameters, cwd=tmp_path, project_root=tmp_path)

    return run
