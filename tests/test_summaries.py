"""Generation's summary.json read by one parser (eagledata/summaries.py): what generation writes, what generation's
routing step and training's assembly take from it, and the refusals of a section not shaped as generation writes
it."""
from __future__ import annotations

import json

import pytest

from eagledata.errors import InputError
from eagledata.generation.conversations.fidelity import FidelityJudge, suspects_in
from eagledata.summaries import VERDICTS, fidelity_suspects, read_summary
from eagledata.training.assembly import read_generation_suspects
from tests.helpers.imports import import_graph


def judged_summary() -> dict:
    """A summary's `fidelity` as generation writes it: one provider refusing every answer (suspect), one fine."""
    judge = FidelityJudge()
    for _ in range(40):
        judge.answer("Plain", {"repaired": "", "completion_diff": 0, "prompt_diff": 0}, "stop")
        judge.refusal("Dropper")
    return {"run": {"recorded": 40}, "fidelity": judge.summary()}


def test_the_suspects_of_what_generation_writes():
    summary = judged_summary()
    evidence = summary["fidelity"]["providers"]["Dropper"]["evidence"]
    assert summary["fidelity"]["providers"]["Plain"]["verdict"] in VERDICTS
    assert fidelity_suspects(summary) == {"Dropper": evidence} and "answers bad" in evidence
    # generation's routing step and training's assembly read it through the same parser
    assert suspects_in(summary) == {"Dropper": f"fidelity while generating: {evidence}"}


def test_no_fidelity_or_nothing_judged_leaves_nothing_out():
    for summary in ({}, {"run": {}}, {"fidelity": None}, {"fidelity": {}}, {"fidelity": {"providers": {}}}):
        assert fidelity_suspects(summary) == {}
        assert suspects_in(summary) == {}


def test_a_suspect_without_evidence():
    summary = {"fidelity": {"providers": {"X": {"verdict": "suspect"}, "Y": {"verdict": "consistent"}}}}
    assert fidelity_suspects(summary) == {"X": ""}
    assert suspects_in(summary) == {"X": "fidelity while generating: "}


@pytest.mark.parametrize("summary, message", [
    ([], r"s\.json: expected a JSON object"),
    ({"fidelity": []}, r"field 'fidelity\.providers': expected an object of providers"),
    ({"fidelity": {"providers": [1]}}, r"field 'fidelity\.providers': expected an object of providers"),
    ({"fidelity": {"providers": {"X": {"verdict": "odd"}}}}, r"field 'fidelity\.providers\.X\.verdict': verdict 'odd'"),
    ({"fidelity": {"providers": {"X": {}}}}, r"field 'fidelity\.providers\.X\.verdict': verdict None"),
    ({"fidelity": {"providers": {"X": "suspect"}}}, r"field 'fidelity\.providers\.X\.verdict'"),
])
def test_a_section_not_shaped_as_generation_writes_it_is_refused_naming_the_field(summary, message):
    with pytest.raises(InputError, match=message):
        fidelity_suspects(summary, "s.json")


def test_read_summary_names_the_file_and_line(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(judged_summary()))
    assert read_summary(path) == judged_summary()
    path.write_text('{\n"fidelity": \n')
    with pytest.raises(InputError, match=r"summary\.json:3: not JSON"):
        read_summary(path)
    path.write_text("[1]")
    with pytest.raises(InputError, match=r"summary\.json: expected a JSON object"):
        read_summary(path)


def test_assembly_reads_the_summary_beside_a_records_file(tmp_path):
    records = tmp_path / "B1" / "records.jsonl"
    records.parent.mkdir()
    records.write_text("")
    assert read_generation_suspects(records) == {}  # no summary (an older run): nothing left out
    summary = judged_summary()
    summary["fidelity"]["providers"]["Quiet"] = {"verdict": "suspect", "evidence": ""}
    (records.parent / "summary.json").write_text(json.dumps(summary))
    assert read_generation_suspects(records) == {**fidelity_suspects(summary), "Quiet": "(no evidence given)"}
    (records.parent / "summary.json").write_text('{"fidelity": {"providers": {"X": {"verdict": "maybe"}}}}')
    with pytest.raises(InputError, match=r"B1/summary\.json field 'fidelity\.providers\.X\.verdict'"):
        read_generation_suspects(records)


def test_the_parser_imports_no_stage():
    assert import_graph()["eagledata.summaries"] <= {"eagledata.errors"}
