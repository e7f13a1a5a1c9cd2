"""Notebook hygiene for every committed notebook, and a papermill smoke run of each."""
import json
from pathlib import Path

import pytest
from papermill.exceptions import PapermillExecutionError

from eagledata.notebooks import NOTEBOOK_DIR, cell_outputs_text

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"tokenizer.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_clean(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "commit without outputs"
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and tagged[0]["cell_type"] == "code", "exactly one code cell tagged 'parameters'"
    assert nb["metadata"]["kernelspec"]["name"] == "eagledata", "kernelspec so papermill needs no -k"
    assert "nest_asyncio" not in path.read_text()


def test_kernel_is_registered():
    import sys

    spec = Path(sys.prefix) / "share/jupyter/kernels/eagledata/kernel.json"
    assert spec.is_file(), "run `make setup` (registers the eagledata kernel in the venv)"


def test_tokenizer_notebook_on_samples(tokenizer_dir, execute_notebook):
    out = execute_notebook("tokenizer", tokenizer=str(tokenizer_dir))
    text = cell_outputs_text(out)
    assert "PASS: 15 records round-trip exactly" in text
    assert "partial character at cut" in text and "non-canonical tokenization" in text


def test_tokenizer_notebook_on_records_file(tok, tokenizer_dir, execute_notebook, tmp_path):
    from eagledata.records import Record
    from eagledata.text.sequences import output_ids, prompt_ids

    messages = [{"role": "user", "content": "hi"}]
    lines = [Record(id=f"r{i}", dataset="B1", messages=messages, reasoning="hmm", content=f"hello {i}",
                    finish_reason="stop", prompt_ids=prompt_ids(tok, messages),
                    output_ids=output_ids(tok, "hmm", f"hello {i}", "stop")).to_json() for i in range(3)]
    good = tmp_path / "records.jsonl"
    good.write_text("\n".join(lines) + "\n")
    assert "PASS: 3 records" in cell_outputs_text(execute_notebook("tokenizer", tokenizer=str(tokenizer_dir),
                                                                   records=str(good)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n{oops\n")
    with pytest.raises(PapermillExecutionError, match=r"bad\.jsonl:2: not valid JSON"):
        execute_notebook("tokenizer", tokenizer=str(tokenizer_dir), records=str(bad))


def test_providers_notebook_from_snapshot_without_server(execute_notebook, tmp_path):
    from test_providers import catalog

    from eagledata.openrouter import RoutingDecision

    snap = catalog().save(tmp_path / "snap.json")
    out = execute_notebook("providers", snapshot=str(snap), params_dir=str(tmp_path / "params"),
                           base_url="http://127.0.0.1:9/unreachable")
    decision = RoutingDecision.load(tmp_path / "params" / "routing" / "kimi-k2.5.yaml")
    assert {e.provider for e in decision.excluded} == {"Fireworks", "BaseTen"}
    assert "cheapest eligible: DeepInfra at $2.20/M output" in cell_outputs_text(out)


def test_budget_notebook_writes_targets(tokenizer_dir, execute_notebook, tmp_path):
    import shutil

    from test_providers import catalog, decision_for

    from eagledata.generation.datasets import load_datasets
    from eagledata.notebooks import NOTEBOOK_DIR

    examples = NOTEBOOK_DIR.parent / "examples" / "prompts"
    for name in ("demo-a", "demo-b"):
        shutil.copy(examples / f"{name}.jsonl", tmp_path)
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text("demo-a: {prompts: demo-a.jsonl}\ndemo-b: {prompts: demo-b.jsonl}\n")
    routing = decision_for(catalog()).save(tmp_path / "params")
    out = execute_notebook("budget", tokenizer=str(tokenizer_dir), datasets_file=str(datasets), routing=str(routing),
                           budget_usd=0.2, reserve_usd=0.05, round_to=1000, output_dir=str(tmp_path))
    targets = {n: s.target_output_tokens for n, s in load_datasets(datasets).items()}
    assert targets["demo-a"] == targets["demo-b"] and 0 < targets["demo-a"] <= 0.15 / 2 / 2.2e-6
    assert "plan: $" in cell_outputs_text(out)


def test_providers_notebook_against_emulator(tokenizer_dir, execute_notebook, tmp_path):
    from eagledata.emulator import run_emulator
    from eagledata.openrouter import Catalog, RoutingDecision

    with run_emulator(speed=0) as emu:
        out = execute_notebook("providers", base_url=emu.base_url, params_dir=str(tmp_path / "params"),
                               output_dir=str(tmp_path / "out"))
    decision = RoutingDecision.load(tmp_path / "params" / "routing" / "kimi-k2.5.yaml")
    assert {e.provider for e in decision.excluded} == {"Fireworks", "BaseTen"}
    snapshots = list((tmp_path / "out" / "providers").glob("kimi-k2.5-endpoints-*.json"))
    assert len(snapshots) == 1 and len(Catalog.load(snapshots[0]).endpoints) == 11
    assert "cheapest eligible: Chutes at $2.20/M output" in cell_outputs_text(out)


@pytest.mark.parametrize("name", ["generate", "hidden_states"])
def test_parameters_cell_is_made_from_the_settings(name):
    """The defaults live in the settings class only: the committed cell is exactly what it generates
    (`python -m eagledata.notebooks` rewrites it after a change)."""
    from eagledata.notebooks import notebook_path, parameter_settings, parameters_source

    assert parameters_source(notebook_path(name)) == parameter_settings()[name].parameters_cell()
