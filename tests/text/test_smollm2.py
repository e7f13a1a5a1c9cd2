"""The second target family end to end in the text stage: SmolLM2-135M-Instruct's ChatML (its default system prompt,
end of turn `<|im_end|>`, no reasoning section) through the same recipe, inverse and round-trip checks as K2.5, on the
real converted checkpoint. The records here carry the model's own greedy ids (transformers on CPU, as a local server
returns them): they must re-tokenize exactly, and a planted wrong end of turn must fail the verdict."""
from __future__ import annotations

import pytest
from papermill.exceptions import PapermillExecutionError

from eagledata.errors import InputError
from eagledata.notebooks import read_results
from eagledata.records import Answer, Record, ToolCall
from eagledata.text import (
    Case,
    load_tokenizer,
    output_ids,
    output_ids_batch,
    parse_output_ids,
    prompt_ids,
    render_chat,
    sample_cases,
    validate,
)

IM_END, ENDOFTEXT = 2, 0
PROMPTS = ["What is the capital of France? Answer briefly.", "Name three primary colors.",
           "Write one sentence about the sea.", "What is 12 times 12?"]


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_the_recipe_is_content_then_end_of_turn(smol):
    assert output_ids(smol, None, "Paris.", "stop") == smol.encode_ordinary("Paris.") + [IM_END]
    assert output_ids(smol, "", "Paris.", "length") == smol.encode_ordinary("Paris.")  # cut: the model never ended it
    assert output_ids(smol, "", "", "stop") == [IM_END]
    # K2.5's inline-reasoning shape is text here: no `</think>` id exists, nothing is split off
    inline = "<think>3*7=21.</think>21"
    assert output_ids(smol, "", inline, "stop") == smol.encode_ordinary(inline) + [IM_END]
    assert parse_output_ids(smol, output_ids(smol, "", inline, "stop")) == Answer("", inline, "stop")
    with pytest.raises(InputError, match="no reasoning section"):
        output_ids(smol, "thinking", "Paris.", "stop")
    with pytest.raises(InputError, match="no tool-call section"):
        output_ids(smol, "", "", "tool_calls", tool_calls=(ToolCall("functions.f:0", "f", "{}"),))
    answers = [Answer("", t, f) for t in ("a", "b c", inline) for f in ("stop", "length")]
    assert output_ids_batch(smol, answers) == [output_ids(smol, a.reasoning, a.content, a.finish_reason)
                                               for a in answers]


def test_prompts_and_finished_conversations_are_the_models_own_template(smol, hf):
    """Prompt ids equal transformers' `apply_chat_template` (its default system prompt when none is given); prompt
    + output ids + the template's newline after `<|im_end|>` equal the finished conversation tokenized whole."""
    for messages in ([{"role": "user", "content": "Hi there"}],
                     [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3? <|im_end|>"}]):
        want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        assert prompt_ids(smol, messages) == want["input_ids"]
        done = [*messages, {"role": "assistant", "content": "Six, I think."}]
        full = hf.apply_chat_template(done, tokenize=True, return_dict=True)["input_ids"]
        assert prompt_ids(smol, messages) + output_ids(smol, "", "Six, I think.", "stop") + smol.encode("\n") == full
    assert render_chat(smol, [{"role": "user", "content": "x"}]).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n")


def test_the_sample_set_passes_for_smollm2_and_kimis_is_unchanged(smol):
    report = validate(smol, sample_cases(smol))
    assert report.passed, report.verdict()
    assert report.figures()["records"] == 13
    assert report.figures()["classes"] == {"answer merges with the prompt's end": 1,
                                           "literal special string in text": 1,
                                           "literal special string in prompt": 1, "non-canonical tokenization": 1,
                                           "partial character at cut": 1}
    kimi = load_tokenizer()
    assert validate(kimi, sample_cases(kimi)).verdict().startswith("PASS: 19 records")


@pytest.fixture(scope="module")
def greedy_records(smollm2_dir, smol):
    """Records as a local server writes them: the model's own greedy ids (transformers, fp32 CPU), its text decoded
    from them, `meta.sampling` greedy. Two answers end on `<|im_end|>`, two are cut by max_tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    records = []
    for i, text in enumerate(PROMPTS):
        messages = [{"role": "user", "content": text}]
        p_ids = prompt_ids(smol, messages)
        cap = 48 if i < 2 else 12
        with torch.no_grad():
            out = model.generate(torch.tensor([p_ids]), max_new_tokens=cap, do_sample=False)
        ids = out[0, len(p_ids):].tolist()
        finish = "stop" if ids[-1] == IM_END else "length"
        content = smol.decode(ids[:-1] if finish == "stop" else ids)
        records.append(Record(id=f"smol-{i}", dataset="sharegpt", messages=messages, reasoning="", content=content,
                              finish_reason=finish, model="smollm2-135m-instruct", provider="local",
                              prompt_ids=p_ids, output_ids=ids,
                              meta={"ids_source": "server", "sampling": {"temperature": 0.0}}))
    assert [r.finish_reason for r in records] == ["stop", "stop", "length", "length"]
    return records


def test_the_models_own_ids_re_tokenize_exactly(smol, greedy_records):
    report = validate(smol, [Case.from_record(r, {r.id: r.output_ids for r in greedy_records})
                             for r in greedy_records])
    assert report.passed and report.token_agreement() == 1.0, report.verdict()
    assert greedy_records[0].content == "The capital of France is Paris."
    for r in greedy_records:
        assert output_ids(smol, "", r.content, r.finish_reason) == r.output_ids


def test_a_wrong_end_of_turn_fails_the_check(smol, greedy_records):
    """Planted: the answer ended on `<|endoftext|>` (the tokenizer's other special), or the end of turn dropped from an
    answer that finished: both are reconstruction defects."""
    r = greedy_records[0]
    wrong = Case(r.id, r.messages, "", r.content, "stop", r.prompt_ids, r.output_ids[:-1] + [ENDOFTEXT])
    dropped = Case(r.id, r.messages, "", r.content, "stop", r.prompt_ids, r.output_ids[:-1])
    for case in (wrong, dropped):
        report = validate(smol, [case])
        assert not report.passed and "output ids differ from recipe" in report.results[0].classes


def test_server_ids_are_the_truth_a_non_canonical_split_is_explained_other_bytes_fail(smol, greedy_records):
    """As vLLM served SmolLM2 (measured: ':\\n\\n1.' as one `\\n\\n` token where BPE on the text gives two): a
    record whose server ids split the same bytes otherwise passes, explained; ids that say other bytes fail."""
    r = greedy_records[0]
    hel, lo, hello = smol.encode_ordinary("The c"), smol.encode_ordinary("apital"), smol.encode_ordinary("The capital")
    assert r.output_ids[:len(hello)] == hello and hel + lo != hello
    split = Record.from_dict(r.to_dict() | {"output_ids": hel + lo + r.output_ids[len(hello):]})
    report = validate(smol, [Case.from_record(split)])
    assert report.passed and report.results[0].classes == ["non-canonical tokenization"], report.verdict()
    other = Record.from_dict(r.to_dict() | {"output_ids": smol.encode_ordinary("The capital is Rome.") + [IM_END]})
    report = validate(smol, [Case.from_record(other)])
    assert not report.passed and report.results[0].classes == ["text differs from true ids"]
    stored = Record.from_dict(split.to_dict() | {"meta": {}})  # ids of unknown origin: the recipe must equal them
    assert "output ids differ from recipe" in validate(smol, [Case.from_record(stored)]).results[0].classes


def test_tokenizer_notebook_passes_on_smollm2_records_and_fails_on_a_planted_one(smollm2_dir, greedy_records,
                                                                                  execute_notebook, tmp_path):
    samples = read_results(execute_notebook("tokenizer", tokenizer=str(smollm2_dir)))["report"]
    assert samples["passed"] and samples["records"] == 13
    path = tmp_path / "records.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in greedy_records))
    report = read_results(execute_notebook("tokenizer", tokenizer=str(smollm2_dir), records=str(path)))["report"]
    assert report["passed"] and report["records"] == 4 and report["classes"] == {}, report
    bad = greedy_records[0].to_dict() | {"output_ids": greedy_records[0].output_ids[:-1] + [ENDOFTEXT]}
    path.write_text("".join(r.to_json() + "\n" for r in greedy_records[1:]) + Record.from_dict(bad).to_json() + "\n")
    with pytest.raises(PapermillExecutionError, match=r"FAIL: 1 of 4 records"):
        execute_notebook("tokenizer", tokenizer=str(smollm2_dir), records=str(path))
