"""The one record schema (records.py): its JSON line keeps the text exact, and a bad line names its file, line
and field."""
import json

import pytest

from eagledata.errors import InputError
from eagledata.records import Record, Usage, load_records

CONTRACT_FIELDS = ["id", "dataset", "conversation_id", "turn", "messages", "reasoning", "content", "finish_reason",
                   "model", "provider", "generation_id", "usage", "prompt_ids", "output_ids"]


def make_record(i: int = 0) -> Record:
    return Record(id=f"p{i}", dataset="B1", messages=[{"role": "user", "content": "héllo 量子"}],
                  reasoning="r\u0301", content="c <think>", finish_reason="stop", model="moonshotai/kimi-k2.5-0127",
                  provider="DeepInfra", generation_id=f"gen-{i}", usage=Usage(10, 5, 3, 1.5e-5),
                  prompt_ids=[1, 2], output_ids=[3, 163607, 4, 163586])


def test_record_json_roundtrip_keeps_text_exact():
    r = make_record()
    line = r.to_json()
    d = json.loads(line)
    assert list(d) == CONTRACT_FIELDS
    assert set(d["usage"]) == {"prompt_tokens", "completion_tokens", "reasoning_tokens", "cost"}
    assert "\n" not in line and "r\u0301" in line  # raw UTF-8, never normalized or escaped
    assert Record.from_json(line) == r


def test_meta_is_kept_when_present():
    r = make_record()
    r.meta = {"ids_source": "server"}
    assert Record.from_json(r.to_json()).meta == {"ids_source": "server"}


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_bad_record_line_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "records.jsonl", [make_record(0).to_json(), "", "{not json"])
    with pytest.raises(InputError, match=r"records\.jsonl:3: not valid JSON"):
        load_records(path)


def test_invalid_record_names_field(tmp_path):
    d = make_record().to_dict()
    d["output_ids"] = [1, "x"]
    path = write_lines(tmp_path / "r.jsonl", [json.dumps(d)])
    with pytest.raises(InputError, match=r"r\.jsonl:1: not a valid record: field 'output_ids'"):
        load_records(path)


def test_torn_tail_dropped_only_when_tolerated(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(make_record(0).to_json() + "\n" + make_record(1).to_json()[:40])
    assert [r.id for r in load_records(path, tolerate_torn_tail=True)] == ["p0"]
    with pytest.raises(InputError, match=":2:"):
        load_records(path)
