import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagledata.errors import InputError
from eagledata.records import Answer, Record, split_inline_reasoning
from eagledata.text import (
    END_THINK,
    IM_END,
    conversation_ids,
    output_ids,
    output_ids_batch,
    parse_output_ids,
    prompt_ids,
    render_chat,
    sample_cases,
)
from tests.helpers import DATA

GOLDEN = DATA / "chat_template_ids.json"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

HISTORY = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4.", "reasoning_content": "Easy."},
    {"role": "user", "content": "Times 3?"},
]


def test_generation_prompt_ends_with_think(tok):
    text = render_chat(tok, [{"role": "user", "content": "Hi"}])
    assert text == "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    ids = prompt_ids(tok, [{"role": "user", "content": "Hi"}])
    assert ids == [163587, *tok.encode("user"), 163601, *tok.encode("Hi"), 163586,
                   163588, *tok.encode("assistant"), 163601, 163606]


def test_thinking_off_closes_think(tok):
    assert render_chat(tok, [{"role": "user", "content": "Hi"}], thinking=False).endswith(
        "<|im_assistant|>assistant<|im_middle|><think></think>")


def test_ids_unchanged_since_the_renderer_moved_to_transformers(tok):
    """tests/data/chat_template_ids.json holds the ids the project's own jinja renderer gave (before the render
    went through transformers' `render_jinja_template`) for every built-in hard case, a multi-turn history with
    and without thinking, preserved reasoning and a tool schema. The ids must not move."""
    golden = json.loads(GOLDEN.read_text())
    cases = [c for c in sample_cases(tok) if c.tools is None]  # the tool cases came later, checked by their own
    assert {c.id for c in cases} <= set(golden) and len(cases) >= 15
    for c in cases:
        assert prompt_ids(tok, c.messages) == golden[c.id]["prompt_ids"], c.id
        assert conversation_ids(tok, c.messages, c.reasoning, c.content) == golden[c.id]["conversation_ids"], c.id
    h = golden["history"]
    assert prompt_ids(tok, HISTORY) == h["prompt_ids"]
    assert tok.encode(render_chat(tok, HISTORY, thinking=False), allow_special=True) == h["thinking_off"]
    assert tok.encode(render_chat(tok, HISTORY, add_generation_prompt=False, preserve_thinking=True),
                      allow_special=True) == h["preserved"]
    assert prompt_ids(tok, HISTORY, tools=TOOLS) == h["tools"]


def test_reasoning_field_aliases_render_alike(tok):
    """transformers fills `reasoning_content` from `reasoning` or `thinking`: every spelling renders the same."""
    renders = {render_chat(tok, [*HISTORY[:2], {"role": "assistant", "content": "4.", key: "Easy."}, HISTORY[3]],
                           add_generation_prompt=False, preserve_thinking=True)
               for key in ("reasoning_content", "reasoning", "thinking")}
    assert len(renders) == 1 and "<think>Easy.</think>4." in renders.pop()


def test_history_reasoning_dropped_unless_preserved(tok):
    assert "Easy." not in render_chat(tok, HISTORY)
    assert "<think>Easy.</think>4." in render_chat(tok, HISTORY, add_generation_prompt=False, preserve_thinking=True)


def test_recipe_stop(tok):
    ids = output_ids(tok, "Let me think.", "Answer.", "stop")
    assert ids == [9413, 1019, 2704, 13, END_THINK, 33853, 13, IM_END]


def test_recipe_cuts(tok):
    assert output_ids(tok, "Let me think.", "Ans", "length")[-1] != IM_END
    inside = output_ids(tok, "Let me", "", "length")
    assert END_THINK not in inside and IM_END not in inside and tok.decode(inside) == "Let me"
    assert output_ids(tok, "", "Hi", "stop") == [END_THINK, *tok.encode("Hi"), IM_END]
    # the run's own cut (a stream closed at a target, or on Ctrl-C) is a cut as max_tokens' is: the prefix, no end
    for reasoning, content in (("Let me think.", "Ans"), ("Let me", "")):
        assert output_ids(tok, reasoning, content, "cut") == output_ids(tok, reasoning, content, "length")


def test_literal_specials_in_content_stay_text(tok):
    ids = output_ids(tok, "r", "use <think> and <|im_end|> here", "stop")
    assert ids.count(END_THINK) == 1 and ids.count(IM_END) == 1 and 163606 not in ids
    assert parse_output_ids(tok, ids) == Answer("r", "use <think> and <|im_end|> here", "stop")


def test_inline_reasoning_split():
    assert split_inline_reasoning(None, "<think>abc</think>\n\nHi") == ("abc", "\n\nHi")
    assert split_inline_reasoning("", "\n<think>cut off") == ("cut off", "")
    assert split_inline_reasoning("real", "<think>x</think>y") == ("real", "<think>x</think>y")
    assert split_inline_reasoning(None, "no tags") == ("", "no tags")


def test_inline_reasoning_gives_same_ids(tok):
    assert output_ids(tok, None, "<think>abc</think>Hi", "stop") == output_ids(tok, "abc", "Hi", "stop")


def test_thinking_off(tok):
    assert output_ids(tok, "", "Hi", "stop", thinking=False) == [*tok.encode("Hi"), IM_END]
    with pytest.raises(InputError, match="reasoning"):
        output_ids(tok, "why", "Hi", "stop", thinking=False)


def test_record_loss_mask_and_output_tokens():
    r = Record(id="a", dataset="d", messages=[], reasoning="", content="", finish_reason="stop",
               prompt_ids=[1, 2, 3], output_ids=[4, 5])
    assert r.input_ids == [1, 2, 3, 4, 5] and r.loss_mask == [0, 0, 0, 1, 1]
    assert r.output_tokens == 2  # the server gave no count: the stored ids
    r.usage.completion_tokens = 7
    assert r.output_tokens == 7  # the server's count is what a token target counts


def test_batch_matches_single(tok):
    answers = [Answer("r" * i, "c" * (i % 3), "stop" if i % 2 else "length") for i in range(20)]
    answers.append(Answer("", "<think>x</think>y", "stop"))
    assert output_ids_batch(tok, answers) == [output_ids(tok, a.reasoning, a.content, a.finish_reason) for a in answers]


# Text as models write it: words, CJK, emoji, combining marks, odd whitespace, literal markup.
PIECES = st.sampled_from(["the", " cat", "\n", "\n\n", "  ", "\t", "量子", "纠缠", "🎉", "👨‍👩‍👧", "e\u0301", "é",
                          "<think>", "</think>", "<|im_end|>", "```py\n", "’", "\u00a0", "1234567", "\r\n", "ß"])
TEXT = st.one_of(st.lists(PIECES, max_size=30).map("".join), st.text(max_size=200))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reasoning=TEXT, content=TEXT, finish=st.sampled_from(["stop", "length"]))
def test_roundtrip_property(tok, reasoning, content, finish):
    ids = output_ids(tok, reasoning, content, finish)
    r, c = split_inline_reasoning(reasoning, content)
    back = parse_output_ids(tok, ids)
    assert (back.reasoning, back.content) == (r, c)
    assert back.finish_reason == finish or (finish == "length" and not ids)
    structural = [END_THINK, IM_END] if finish == "stop" else [END_THINK] if c else []
    assert [i for i in ids if i >= 163584] == structural


SAFE = st.lists(st.sampled_from(["the", " cat", "\n", "量子", "🎉", "e\u0301", "  ", "x"]), max_size=20).map("".join)


@settings(max_examples=200, deadline=None)
@given(user=SAFE.filter(bool), reasoning=SAFE, content=SAFE)
def test_prompt_plus_output_is_full_render(tok, user, reasoning, content):
    messages = [{"role": "user", "content": user}]
    assert prompt_ids(tok, messages) + output_ids(tok, reasoning, content, "stop") == \
        conversation_ids(tok, messages, reasoning, content)
