"""Prompt files (prompts.py): the three shapes read, and a bad line named by file, line and field."""
import json

import pytest

from eagledata.errors import InputError
from eagledata.prompts import load_prompts


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_prompts_all_three_shapes(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}),
        json.dumps({"id": 7, "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                               {"from": "gpt", "value": "old answer"}]}),
        # SpecForge's prompt files: `conversations` with {role, content} turns
        json.dumps({"id": "sf", "conversations": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                                  {"role": "assistant", "content": "old answer"}]}),
    ])
    a, b, c = load_prompts(path)
    assert a.id == "a" and a.messages == [{"role": "user", "content": "hi"}]
    assert b.id == "7" and b.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert c.id == "sf" and c.messages == b.messages


@pytest.mark.parametrize("line, match", [
    ('{"id": "x"}', "field 'messages'"),
    ('{"id": "", "messages": []}', "field 'id'"),
    ('{"id": "x", "messages": [{"role": "bot", "content": "hi"}]}', r"field 'messages\[0\]\.role'"),
    ('{"id": "x", "conversations": [{"from": "alien", "value": "hi"}]}', r"field 'conversations\[0\]\.from'"),
    ('{"id": "x", "conversations": [{"role": "user", "content": "q"}, {"from": "gpt", "value": "a"}]}',
     r"field 'conversations\[1\]\.role'"),
    ('{"id": "x", "messages": [{"role": "assistant", "content": "hi"}]}', "no user turn"),
    ('[1, 2]', "JSON object"),
    ('{"id": "x", "messages": [', "not valid JSON"),
])
def test_bad_prompt_line_names_file_and_line(tmp_path, line, match):
    path = write_lines(tmp_path / "p.jsonl", [json.dumps({"id": "ok", "messages": [{"role": "user", "content": "q"}]}),
                                               line])
    with pytest.raises(InputError, match=r"p\.jsonl:2: .*" + match):
        load_prompts(path)


def test_duplicate_prompt_id(tmp_path):
    line = json.dumps({"id": "a", "messages": [{"role": "user", "content": "q"}]})
    with pytest.raises(InputError, match=r"p\.jsonl:2: duplicate id 'a' \(first on line 1\)"):
        load_prompts(write_lines(tmp_path / "p.jsonl", [line, line]))


def test_empty_and_missing_prompt_files(tmp_path):
    with pytest.raises(InputError, match="no prompts"):
        load_prompts(write_lines(tmp_path / "p.jsonl", []))
    with pytest.raises(InputError, match=r"missing\.jsonl: cannot open"):
        load_prompts(tmp_path / "missing.jsonl")


def test_scan_skips_finished_lines_but_validates_the_rest(tmp_path):
    from eagledata.prompts import scan_prompts

    lines = [json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(5)]
    lines[1] = '{"id": "p1", "messages": "finished earlier, not re-parsed"}'
    path = write_lines(tmp_path / "p.jsonl", lines)
    scan = scan_prompts(path, done={"p1", "p3"})
    assert scan.total == 5 and [p.id for p in scan] == ["p0", "p2", "p4"]
    assert [p.id for p in scan_prompts(path, done={"p1"}, limit=3)] == ["p0", "p2"]
    with pytest.raises(InputError, match=r"p\.jsonl:2: field 'messages'"):
        scan_prompts(path)
    write_lines(path, lines + [lines[3]])
    with pytest.raises(InputError, match=r"p\.jsonl:6: duplicate id 'p3' \(first on line 4\)"):
        scan_prompts(path, done={"p1", "p3"})


def test_prompt_id_with_tab_is_refused(tmp_path):
    path = write_lines(tmp_path / "p.jsonl",
                       [json.dumps({"id": "a\tb", "messages": [{"role": "user", "content": "q"}]})])
    with pytest.raises(InputError, match="p.jsonl:1: field 'id': must not contain tabs"):
        load_prompts(path)
