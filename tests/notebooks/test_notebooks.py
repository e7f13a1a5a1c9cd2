"""Notebook hygiene for every committed notebook, and papermill runs whose published values are checked."""
import json
from pathlib import Path

import pytest
from papermill.exceptions import PapermillExecutionError

from eagledata.notebooks import NOTEBOOK_DIR, read_results

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
    report = read_results(execute_notebook("tokenizer"))["report"]  # the bundled tokenizer: no parameter needed
    assert report["passed"] and report["records"] == 19 and report["fatal_records"] == 0
    assert report["classes"]["partial character at cut"] == 1 and report["classes"]["non-canonical tokenization"] == 1
    assert 0 < report["token_agreement"] < 1 and report["verdict"].startswith("PASS: 19 records")


def test_tokenizer_notebook_on_records_file(tok, tokenizer_dir, execute_notebook, tmp_path):
    from eagledata.records import Record
    from eagledata.text.sequences import output_ids, prompt_ids

    messages = [{"role": "user", "content": "hi"}]
    lines = [Record(id=f"r{i}", dataset="B1", messages=messages, reasoning="hmm", content=f"hello {i}",
                    finish_reason="stop", prompt_ids=prompt_ids(tok, messages),
                    output_ids=output_ids(tok, "hmm", f"hello {i}", "stop")).to_json() for i in range(3)]
    good = tmp_path / "records.jsonl"
    good.write_text("\n".join(lines) + "\n")
    results = read_results(execute_notebook("tokenizer", tokenizer=str(tokenizer_dir), records=str(good)))
    assert results["report"]["passed"] and results["report"]["records"] == 3 and results["report"]["classes"] == {}
    assert results["tokenizer"]["fingerprint"] == tok.fingerprint
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n{oops\n")
    with pytest.raises(PapermillExecutionError, match=r"bad\.jsonl:2: not valid JSON"):
        execute_notebook("tokenizer", tokenizer=str(tokenizer_dir), records=str(bad))


def test_tokenizer_notebook_fails_on_an_unrepaired_bare_close(tok, tokenizer_dir, execute_notebook, tmp_path):
    """Empty reasoning and `</think>` inside content (a provider without a reasoning parser, recorded as served):
    the notebook's verdict fails instead of calling it explained."""
    from eagledata.records import Record
    from eagledata.text.sequences import output_ids, prompt_ids

    messages = [{"role": "user", "content": "hi"}]
    served = "They greet me.</think>Hello!"
    path = tmp_path / "records.jsonl"
    path.write_text(Record(id="bare", dataset="B1", messages=messages, reasoning="", content=served,
                           finish_reason="stop", prompt_ids=prompt_ids(tok, messages),
                           output_ids=output_ids(tok, "", served, "stop")).to_json() + "\n")
    with pytest.raises(PapermillExecutionError, match=r"FAIL: 1 of 1 records"):
        execute_notebook("tokenizer", tokenizer=str(tokenizer_dir), records=str(path))


def test_tokenizer_notebook_checks_tool_call_records_and_fails_on_a_wrong_section(tok, tokenizer_dir,
                                                                                   execute_notebook, tmp_path):
    """Tool-call records pass the template prefix check; one whose section holds the provider's `call_…` id fails."""
    from eagledata.records import ToolCall
    from tests.helpers.records import tool_record

    from eagledata.text.roundtrip import Case, tool_cases

    good = [tool_record(tok, c) for c in tool_cases()]
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in good))
    report = read_results(execute_notebook("tokenizer", tokenizer=str(tokenizer_dir), records=str(path)))["report"]
    assert report["passed"] and report["records"] == 4 and report["classes"] == {}
    loop = next(c for c in tool_cases() if c.id == "tool-call-inside-the-loop")
    kept = ToolCall("call_8f3k2", loop.tool_calls[0].name, loop.tool_calls[0].arguments)
    path.write_text("".join(r.to_json() + "\n" for r in [*good, tool_record(
        tok, Case(**{**loop.__dict__, "tool_calls": (kept,)}), "kept-call-id")]))
    with pytest.raises(PapermillExecutionError, match=r"FAIL: 1 of 5 records"):
        execute_notebook("tokenizer", tokenizer=str(tokenizer_dir), records=str(path))


def test_providers_notebook_from_snapshot_without_server(execute_notebook, tmp_path):
    from tests.helpers.catalogs import catalog

    from eagledata.openrouter import RoutingDecision

    snap = catalog().save(tmp_path / "snap.json")
    out = execute_notebook("providers", snapshot=str(snap), params_dir=str(tmp_path / "params"),
                           base_url="http://127.0.0.1:9/unreachable")
    decision = RoutingDecision.load(tmp_path / "params" / "routing" / "kimi-k2.5.yaml")
    assert {e.provider for e in decision.excluded} == {"Fireworks", "BaseTen"}
    results = read_results(out)
    assert results["routing"]["file"] == str(tmp_path / "params" / "routing" / "kimi-k2.5.yaml")
    assert {e["provider"] for e in results["routing"]["excluded"]} == {"Fireworks", "BaseTen"}
    pricing = results["pricing"]
    assert pricing["cheapest_eligible"] == "DeepInfra" and pricing["cheapest_eligible_completion_per_m"] == 2.2
    assert pricing["premium_usd"] >= 0


def _budget_inputs(tmp_path):
    import shutil

    examples = NOTEBOOK_DIR.parent / "examples" / "prompts"
    for name in ("demo-a", "demo-b"):
        shutil.copy(examples / f"{name}.jsonl", tmp_path)
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text("demo-a: {prompts: demo-a.jsonl}\ndemo-b: {prompts: demo-b.jsonl}\n")
    return datasets


def test_generate_notebook_through_the_batch_route(tokenizer_dir, execute_notebook, tmp_path):
    """route: batch in the notebook as a user runs it: base_url emulator (its Batch API, no key), the report's
    table of rounds, every prompt recorded at the batch price."""
    datasets = _budget_inputs(tmp_path)
    out = execute_notebook("generate", dataset="demo-a", datasets_file=str(datasets), base_url="emulator",
                           route="batch", emulator_speed=0.001, batch_poll_s=60, max_tokens=2048, progress=False)
    summary = read_results(out)["summary"]
    assert summary["stop_reason"] == "completed" and summary["remaining"] == 0 and summary["run"]["route"] == "batch"
    rounds = summary["run"]["batches"]
    assert rounds and sum(r["answered"] for r in rounds) == summary["run"]["recorded"] == summary["records"]
    assert summary["run"]["spend_usd"] == pytest.approx(sum(r["usd"] for r in rounds), rel=1e-6)
    assert "batch_id" in "".join(json.dumps(c.get("outputs", [])) for c in json.loads(out.read_text())["cells"])


def test_budget_notebook_writes_targets(tokenizer_dir, execute_notebook, tmp_path):
    from tests.helpers.catalogs import catalog, decision_for

    from eagledata.generation.conversations.datasets import load_datasets

    datasets = _budget_inputs(tmp_path)
    routing = decision_for(catalog()).save(tmp_path / "params")
    out = execute_notebook("budget", datasets_file=str(datasets), routing=str(routing),
                           budget_usd=0.2, reserve_usd=0.05, round_to=1000, output_dir=str(tmp_path))
    targets = {n: s.target_output_tokens for n, s in load_datasets(datasets).items()}
    results = read_results(out)
    assert results["plan"]["targets"] == targets and results["targets_written"] is True
    assert targets["demo-a"] == targets["demo-b"] and 0 < targets["demo-a"] <= 0.15 / 2 / 2.2e-6
    assert results["plan"]["total_usd"] <= results["plan"]["usable_usd"] == pytest.approx(0.15)
    assert results["prices"]["routing_file"] == str(routing) and results["prices"]["completion_per_m"] == 2.2
    rows = {row["name"]: row for row in results["prompts"]}
    assert set(rows) == {"demo-a", "demo-b"}
    # turns: all (the default): demo-a's 10 two-ask conversations make two requests each
    assert (rows["demo-a"]["prompts"], rows["demo-a"]["requests"]) == (40, 50)
    assert rows["demo-a"]["turns_per_conversation"] == {"1": 30, "2": 10} and rows["demo-b"]["requests"] == 40
    assert results["output_lengths"]["source"].startswith("lognormal(")  # no earlier records
    assert results["answer_content"]["source"].startswith("0.25 x output lengths (lognormal(")
    routes = results["routes"]  # no deadline: the cheapest route, batch (60 % of Moonshot's realtime price)
    assert {r["name"] for r in routes["rows"]} >= {"realtime", "batch"} and routes["chosen"]["name"] == "batch"
    batch = next(r for r in routes["rows"] if r["name"] == "batch")
    assert batch["worst_h"] == 3 * 24  # demo-a's two-turn conversations: 2 rounds + 1 top-up, each up to 24 h
    assert any("-p route batch" in c for c in routes["commands"])
    assert results["agentic"] == []  # no task in these datasets: nothing planned by steps per task


def test_budget_notebook_picks_the_cheapest_plan_that_meets_a_deadline(tokenizer_dir, execute_notebook, tmp_path):
    from tests.helpers.catalogs import catalog, decision_for

    datasets = _budget_inputs(tmp_path)
    routing = decision_for(catalog()).save(tmp_path / "params")
    out = execute_notebook("budget", datasets_file=str(datasets), routing=str(routing), budget_usd=0.2,
                           reserve_usd=0.05, round_to=1000, output_dir=str(tmp_path), write=False, deadline_h=50.0)
    routes = read_results(out)["routes"]
    # batch alone takes up to 72 h (demo-a); demo-b's one-turn prompts in batch (48 h) and demo-a realtime meet 50 h
    chosen = routes["chosen"]
    assert routes["deadline_h"] == 50.0 and chosen["meets_deadline"] and chosen["worst_h"] <= 50
    cheaper = [r for r in routes["rows"] if r["usd"] < chosen["usd"]]
    assert cheaper and not any(r["meets_deadline"] for r in cheaper)


def test_budget_notebook_without_a_routing_decision_prices_from_the_emulators_catalog(tokenizer_dir,
                                                                                       execute_notebook, tmp_path):
    """providers.ipynb has not run: the catalog's cheapest eligible price, and the notebook says so."""
    from eagledata.emulator import run_emulator

    datasets = _budget_inputs(tmp_path)
    with run_emulator(speed=0) as emu:
        out = execute_notebook("budget", datasets_file=str(datasets), params_dir=str(tmp_path / "no-params"),
                               base_url=emu.base_url, budget_usd=0.2, reserve_usd=0.05, round_to=1000,
                               output_dir=str(tmp_path), write=False, turns="last")
    results = read_results(out)
    assert [(r["prompts"], r["requests"]) for r in results["prompts"]] == [(40, 40), (40, 40)]  # a request per prompt
    prices = results["prices"]
    assert prices["routing_file"] is None and "no routing decision at" in prices["note"] and emu.base_url in prices["note"]
    assert prices["source"] == "cheapest eligible (Chutes)" and prices["completion_per_m"] == 2.2
    assert results["targets_written"] is False and results["plan"]["targets"]["demo-a"] > 0
    assert "target_output_tokens" not in datasets.read_text()


def test_providers_notebook_against_emulator(tokenizer_dir, execute_notebook, tmp_path):
    from eagledata.emulator import run_emulator
    from eagledata.openrouter import Catalog, RoutingDecision

    with run_emulator(speed=0) as emu:
        out = execute_notebook("providers", base_url=emu.base_url, params_dir=str(tmp_path / "params"),
                               output_dir=str(tmp_path / "out"), stream_cancellation={"Parasail": True})
    decision = RoutingDecision.load(tmp_path / "params" / "routing" / "kimi-k2.5.yaml")
    assert {e.provider for e in decision.excluded} == {"Fireworks", "BaseTen", "AtlasCloud"}
    # which endpoints stop billing when a stream is closed: the docs' lists, unlisted as no, the override
    assert {e.provider for e in decision.eligible if e.stream_cancellation} == \
        {"Chutes", "DeepInfra", "Together", "Novita", "Parasail"}
    snapshots = list((tmp_path / "out" / "providers").glob("kimi-k2.5-endpoints-*.json"))
    assert len(snapshots) == 1 and len(Catalog.load(snapshots[0]).endpoints) == 11
    results = read_results(out)
    assert results["catalog"] == {"model": "moonshotai/kimi-k2.5", "source": emu.base_url, "endpoints": 11}
    assert results["pricing"]["cheapest_eligible"] == "Chutes"
    assert results["pricing"]["cheapest_eligible_completion_per_m"] == 2.2


@pytest.mark.parametrize("name", ["providers", "budget", "tokenizer", "generate", "hidden_states", "quality"])
def test_parameters_cell_is_made_from_the_settings(name):
    """The defaults live in the settings class only: the committed cell is exactly what it generates
    (`python -m eagledata.notebooks` rewrites it after a change)."""
    from eagledata.notebooks import notebook_path, parameter_settings, parameters_source

    assert parameters_source(notebook_path(name)) == parameter_settings()[name].parameters_cell()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_reads_every_parameter_without_a_warning(path, caplog):
    """papermill's own inspection of the committed cell (what `papermill --help-notebook` shows, and what warns
    on every run when a line does not parse) finds each setting, with its default and help, and warns of nothing."""
    import logging

    from papermill.inspection import _infer_parameters
    from papermill.iorw import load_notebook_node

    from eagledata.notebooks import parameter_settings

    nb = load_notebook_node(str(path))  # as papermill loads it (every cell gets metadata.tags)
    with caplog.at_level(logging.DEBUG, logger="papermill"):
        found = _infer_parameters(nb)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    leaves = list(parameter_settings()[path.stem]._leaves())
    assert [p.name for p in found] == [f.name for f, _, _ in leaves]
    assert [p.default for p in found] == [repr(default) for _, default, _ in leaves]
    assert all(p.help for p in found)


def test_a_parameters_line_papermill_cannot_parse_is_refused():
    from dataclasses import dataclass

    from eagledata.settings import Settings, setting

    @dataclass(frozen=True)
    class Bad(Settings):
        tp: int = setting(1, "under torchrun (tp_plan=auto)")

    with pytest.raises(ValueError, match="more than one '='"):
        Bad.parameters_cell()


def test_every_notebook_has_its_settings_class():
    from eagledata.notebooks import parameter_settings

    assert set(parameter_settings()) == {p.stem for p in NOTEBOOKS}


def test_published_values_are_read_back_as_plain_json(tmp_path):
    """publish() in a kernel, read_results() on the executed notebook: numbers, frames and paths as JSON."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("""
import math, pathlib
import numpy as np, pandas as pd
from eagledata.notebooks import publish
publish("n", np.int64(3))
publish("frame", pd.DataFrame({"a": [1, 2], "b": [0.5, math.nan]}))
publish("path", pathlib.Path("/x/y"))
publish("n", 4)
""")]
    from eagledata.notebooks import _kernel_manager_class

    NotebookClient(nb, kernel_name="eagledata", timeout=120, kernel_manager_class=_kernel_manager_class()).execute()
    path = tmp_path / "out.ipynb"
    nbformat.write(nb, path)
    assert read_results(path) == {"n": 4, "frame": [{"a": 1, "b": 0.5}, {"a": 2, "b": None}], "path": "/x/y"}
    assert all("text/plain" not in o.get("data", {}) for o in nb.cells[0].outputs)  # invisible in JupyterLab
