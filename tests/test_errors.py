"""errors.py: how the commands report bad input (argparse-style: usage, `<prog>: error: <message>`, exit 2)."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

BIN = Path(sys.executable).parent


def command(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A console script as installed (`make` installs eagledata editable into the venv)."""
    script = BIN / name
    assert script.exists(), f"{name} is not installed beside {sys.executable}: run `make setup` (pip install -e .)"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def datasets_file(tmp_path):
    prompts = tmp_path / "ok3.jsonl"
    prompts.write_text('{"id": "1", "messages": [{"role": "user", "content": "q"}]}\n')
    path = tmp_path / "datasets.yaml"
    path.write_text(f"ok3:\n  prompts: {prompts}\n  target_output_tokens: 1000\n")
    return path


@pytest.mark.parametrize("name, args, message", [
    ("eagledata-generate", ["--dataset", "ok3", "--concurrency", "0"],
     "field 'concurrency': must be a positive integer, got 0"),
    ("eagledata-hidden-states", ["--samples", "x.jsonl", "--name", "n", "--model", "m", "--score-chunk-tokens", "0"],
     "field 'score_chunk_tokens': must be a positive integer, got 0"),
    ("eagledata-hidden-states", ["--samples", "x.jsonl", "--name", "n", "--model", "m", "--backend", "vllm",
                                 "--server-concurrency", "0"],
     "field 'server_concurrency': must be a positive integer, got 0"),
    ("eagledata-emulator", ["--port", "70000"], "argument --port: must be 0-65535, got 70000"),
    ("eagledata-demo", ["--speed", "-1"], "argument --speed: must be a number >= 0, got '-1'"),
])
def test_a_bad_setting_on_the_command_line_is_usage_and_one_error_line_exit_2(name, args, message, datasets_file,
                                                                               tmp_path):
    """Issue 44 bug 5: the settings were built outside run_command, so a value their checks refuse (not argparse's
    own) was a traceback and exit 1."""
    if name == "eagledata-generate":
        args = [*args, "--datasets-file", str(datasets_file), "--output-dir", str(tmp_path / "out")]
    proc = command(name, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"usage: {name} "), proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == f"{name}: error: {message}", proc.stderr
    assert proc.stdout == ""


def test_an_error_of_the_run_names_the_command_as_it_was_called(datasets_file, tmp_path):
    """The run's own errors (run_command) carry the same prog as argparse's, not a short name of their own."""
    proc = command("eagledata-generate", "--dataset", "nope", "--datasets-file", str(datasets_file),
                   "--output-dir", str(tmp_path / "out"), "--base-url", "http://127.0.0.1:9/api/v1", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"eagledata-generate: error: {datasets_file} field 'dataset': unknown dataset 'nope'")
    module = subprocess.run([sys.executable, "-m", "eagledata.generate", "--dataset", "ok3", "--concurrency", "0",
                             "--datasets-file", str(datasets_file)], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert module.returncode == 2 and "Traceback" not in module.stderr
    assert module.stderr.rstrip().splitlines()[-1] == \
        "python -m eagledata.generate: error: field 'concurrency': must be a positive integer, got 0"


def test_an_output_dir_under_a_file_names_the_file_and_the_setting(datasets_file, tmp_path):
    """Issue 44 bug 7: it was a NotADirectoryError traceback, exit 1."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    proc = command("eagledata-generate", "--dataset", "ok3", "--datasets-file", str(datasets_file),
                   "--output-dir", str(blocker / "out"), "--base-url", "http://127.0.0.1:9/api/v1", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == (f"eagledata-generate: error: field 'output_dir': cannot create the folder "
                           f"{blocker}/out/datasets/ok3: {blocker} is a file, not a folder\n")
