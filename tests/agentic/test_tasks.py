"""The task file: BFCL's tasks written as it read back unchanged; a bad line named by file, line and field."""
from __future__ import annotations

import json

import pytest

from eagledata.agentic import read_tasks, write_tasks
from eagledata.errors import InputError


def test_bfcl_tasks_round_trip_through_a_task_file(bfcl_tasks, tmp_path):
    path = write_tasks(tmp_path / "bfcl.jsonl", bfcl_tasks)
    assert read_tasks(path) == bfcl_tasks
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["id", "environment", "turns", "tools", "initial_config", "involved_classes"]


GOOD = {"id": "a", "environment": "kv.py:Store", "turns": [[{"role": "user", "content": "hi"}]],
        "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
        "initial_config": {}, "involved_classes": []}


@pytest.mark.parametrize("change, field, said", [
    ({"id": ""}, "id", "non-empty string"),
    ({"environment": "kv.py"}, "environment", "'bfcl' or a class"),
    ({"turns": []}, "turns", "non-empty list"),
    ({"turns": [[{"role": "assistant", "content": "x"}]]}, "turns[0][0]", "a message must be"),
    ({"turns": [[{"role": "system", "content": "x"}]]}, "turns[0]", "needs a user message"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "dict"}}}]},
     "tools[0].function.parameters", "type object"),
    ({"tools": [GOOD["tools"][0], GOOD["tools"][0]]}, "tools[1].function.name", "offered twice"),
    ({"environment": "bfcl"}, "involved_classes", "names its classes"),
    ({"extra": 1}, "extra", "unknown field"),
])
def test_a_bad_task_names_file_line_and_field(tmp_path, change, field, said):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "b", **change}) + "\n")
    with pytest.raises(InputError, match=f"tasks.jsonl:2 field '{field.replace('[', '.').replace(']', '.')}'"
                                         f".*{said}") as e:
        read_tasks(path)
    assert e.value.line == 2 and e.value.field == field


def test_a_repeated_id_is_refused(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(InputError, match="tasks.jsonl:2 field 'id': id 'a' repeats line 1"):
        read_tasks(path)


def test_the_command_writes_bfcls_tasks_as_a_task_file(bfcl_wheel_path, bfcl_tasks, tmp_path, capsys):
    from eagledata.agentic.__main__ import main

    out = tmp_path / "bfcl.jsonl"
    assert main(["--cache", str(bfcl_wheel_path.parent), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and read_tasks(out) == bfcl_tasks
    assert main(["--cache", str(bfcl_wheel_path.parent), "--out", str(out), "--member", "nope.json"]) == 2
    assert "the wheel has no nope.json" in capsys.readouterr().err
