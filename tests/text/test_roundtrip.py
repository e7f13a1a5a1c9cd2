import pytest

from eagledata.errors import InputError
from eagledata.records import Record, ToolCall
from eagledata.text.roundtrip import Case, agreement, load_truth, sample_cases, tool_cases, validate
from eagledata.text.sequences import output_ids, prompt_ids
from tests.helpers.records import tool_record

REQUIRED_SAMPLES = {"newlines-around-think", "literal-specials-in-content", "cjk", "emoji", "nfc-vs-nfd",
                    "30000-spaces", "multibyte-cut-at-max-tokens", "empty-reasoning", "tool-markup-as-text",
                    "multi-turn-history"}


def by_id(report):
    return {r.id: r for r in report.results}


def test_sample_set_passes_with_expected_classes(tok):
    cases = sample_cases(tok)
    assert REQUIRED_SAMPLES <= {c.id for c in cases}
    report = validate(tok, cases)
    assert report.passed, report.mismatches()
    res = by_id(report)
    assert res["non-canonical-split"].classes == ["non-canonical tokenization"]
    assert res["multibyte-cut-at-max-tokens"].classes == ["partial character at cut"]
    assert res["literal-specials-in-content"].classes == ["literal special string in text"]
    assert res["cjk"].classes == [] and res["30000-spaces"].classes == [] and res["nfc-vs-nfd"].classes == []
    assert 0 < report.token_agreement() < 1
    assert all(res[c].classes == [] for c in ("tool-call-first", "tool-calls-parallel-after-content",
                                              "tool-call-inside-the-loop", "answer-after-the-tool-loop"))
    assert report.verdict().startswith("PASS: 19 records")


def good_record(tok, rid="r1", content="The answer is 42."):
    messages = [{"role": "user", "content": "What is the answer?"}]
    return Record(id=rid, dataset="B1", messages=messages, reasoning="Think hard.", content=content,
                  finish_reason="stop",
                  prompt_ids=prompt_ids(tok, messages), output_ids=output_ids(tok, "Think hard.", content, "stop"))


def test_defects_are_fatal(tok):
    dropped = good_record(tok, "dropped")
    dropped.output_ids = dropped.output_ids[:3] + dropped.output_ids[4:]
    stray = good_record(tok, "stray")
    stray.output_ids = stray.output_ids[:2] + [163586] + stray.output_ids[2:]
    stray.content = tok.decode(stray.output_ids[stray.output_ids.index(163607) + 1:-1])
    wrong_prompt = good_record(tok, "wrong-prompt")
    wrong_prompt.prompt_ids = wrong_prompt.prompt_ids[1:]
    report = validate(tok, [Case.from_record(good_record(tok))] +
                      [Case.from_record(r) for r in (dropped, stray, wrong_prompt)])
    res = by_id(report)
    assert res["r1"].classes == []
    assert "text round-trip" in res["dropped"].classes
    assert "special token outside structure" in res["stray"].classes
    assert "prompt ids differ from template" in res["wrong-prompt"].classes
    assert not report.passed and report.verdict().startswith("FAIL: 3 of 4")
    table = report.mismatches()
    assert table["fatal"].iloc[0] and set(table["class"]) >= {"text round-trip", "special token outside structure"}


def test_truth_by_generation_id(tok, tmp_path):
    rec = good_record(tok)
    rec.generation_id = "gen-1"
    path = tmp_path / "truth.jsonl"
    path.write_text(f'{{"generation_id": "gen-1", "output_ids": {rec.output_ids}}}\n')
    case = Case.from_record(rec, load_truth(path))
    assert validate(tok, [case]).results[0].agreement == 1.0
    path.write_text('{"output_ids": [1]}\n')
    with pytest.raises(InputError, match=r"truth\.jsonl:1"):
        load_truth(path)


def test_agreement():
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.75
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5


def test_an_unrepaired_bare_close_fails_the_verdict(tok, tmp_path):
    """A provider without a reasoning parser, recorded as served: empty reasoning, `</think>` inside content. It
    fails the verdict, and with the true ids known the wrong text is fatal too (not "explained")."""
    from eagledata.records import load_records

    messages = [{"role": "user", "content": "What is 6*7?"}]
    served = "Six sevens are forty-two.</think>42."
    bad = Record(id="bare", dataset="B1", messages=messages, reasoning="", content=served, finish_reason="stop",
                 generation_id="gen-bare", prompt_ids=prompt_ids(tok, messages),
                 output_ids=output_ids(tok, "", served, "stop"))
    path = tmp_path / "records.jsonl"
    path.write_text(good_record(tok).to_json() + "\n" + bad.to_json() + "\n")
    report = validate(tok, [Case.from_record(r) for r in load_records(path)])
    assert by_id(report)["bare"].classes[0] == "unrepaired bare close" and by_id(report)["r1"].classes == []
    assert not report.passed and report.verdict().startswith("FAIL: 1 of 2")
    true = output_ids(tok, "Six sevens are forty-two.", "42.", "stop")
    truth = tmp_path / "truth.jsonl"
    truth.write_text(f'{{"generation_id": "gen-bare", "output_ids": {true}}}\n')
    res = validate(tok, [Case.from_record(bad, load_truth(truth))]).results[0]
    assert "text differs from true ids" in res.classes and res.agreement < 0.5
    # repaired as generate now records it: passes, and agrees with the true ids exactly
    fixed = Case.from_record(Record(id="fixed", dataset="B1", messages=messages, reasoning="Six sevens are forty-two.",
                                    content="42.", finish_reason="stop", generation_id="gen-bare",
                                    prompt_ids=bad.prompt_ids, output_ids=true), load_truth(truth))
    report = validate(tok, [fixed])
    assert report.passed and report.results[0].agreement == 1.0 and report.results[0].classes == []


def test_tool_call_records_pass_and_a_planted_wrong_section_fails(tok):
    """Records of tool-call answers pass the template prefix check; each planted wrong section is caught."""
    cases = {c.id: c for c in tool_cases()}
    loop = cases["tool-call-inside-the-loop"]
    (news,) = loop.tool_calls
    good = [tool_record(tok, c) for c in cases.values()]
    served_id = ToolCall("call_8f3k2", news.name, news.arguments)  # the provider's id kept instead of the model's
    compact = ToolCall(news.id, news.name, news.arguments.replace(", ", ",").replace(": ", ":"))
    off = ToolCall("functions.search_web:0", news.name, news.arguments)  # numbered as if no call came before
    planted = [
        tool_record(tok, Case(**{**loop.__dict__, "tool_calls": (served_id,)}), "kept-call-id"),
        tool_record(tok, loop, "arguments-reserialized", section=(compact,)),
        tool_record(tok, loop, "section-dropped", section=()),
        tool_record(tok, Case(**{**loop.__dict__, "tool_calls": (off,)}), "index-off"),
    ]
    report = validate(tok, [Case.from_record(r) for r in good + planted])
    res = by_id(report)
    assert all(res[r.id].classes == [] for r in good), [(r.id, res[r.id].details) for r in good]
    assert "tool-call id not the model's form" in res["kept-call-id"].classes
    assert {"output ids differ from recipe", "text round-trip"} <= set(res["arguments-reserialized"].classes)
    assert "output ids differ from recipe" in res["section-dropped"].classes
    assert res["index-off"].classes == ["tool-call index off the count"]  # exact as served: explained, not fatal
    assert report.verdict().startswith("FAIL: 3 of 8")


def test_a_cut_sample_is_judged_as_the_prefix_it_is(tok):
    """A stream the run closed (`finish_reason: cut`) holds a prefix of what the model generated: against the whole
    answer's true ids it agrees exactly on its length (make demo failed on every cut sample); a prefix that is not
    the model's (a wrong word in it) still fails."""
    messages = [{"role": "user", "content": "Count to five."}]
    whole = output_ids(tok, "Counting up from one, in words, to five.", "one two three four five", "stop")
    cut = Case("cut", messages, "Counting up from one, in words, to five.", "one two three", "cut",
               true_output_ids=whole)
    res = validate(tok, [cut]).results[0]
    assert res.classes == [] and res.agreement == 1.0
    assert res.output_tokens < len(whole)
    wrong = Case("wrong", messages, "Counting up from one, in words, to five.", "one two four", "cut",
                 true_output_ids=whole)
    res = validate(tok, [wrong]).results[0]
    assert res.classes == ["text differs from true ids"] and res.agreement < 1.0
    # a finished answer is still judged against the whole of the true ids
    short = Case("short", messages, "Counting up from one, in words, to five.", "one two three", "stop",
                 true_output_ids=whole)
    assert validate(tok, [short]).results[0].agreement < 1.0
