import pytest

from eagledata.errors import InputError
from eagledata.records import Record
from eagledata.text.roundtrip import Case, agreement, load_truth, sample_cases, validate
from eagledata.text.sequences import output_ids, prompt_ids

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
    assert report.verdict().startswith("PASS: 15 records")


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
    path.write_text('{"generation_id": "gen-1", "output_ids": %s}\n' % rec.output_ids)
    case = Case.from_record(rec, load_truth(path))
    assert validate(tok, [case]).results[0].agreement == 1.0
    path.write_text('{"output_ids": [1]}\n')
    with pytest.raises(InputError, match=r"truth\.jsonl:1"):
        load_truth(path)


def test_agreement():
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.75
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5
