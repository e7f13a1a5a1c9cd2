"""How the emulated agent writes its calls beyond the plan (issue 61 item 5, `tool_style`): arguments taken from the
task and the earlier tool results, as an agent reuses a file name an `ls` listed; slips (a name no tool declares,
arguments that are not JSON, a required argument left out, a wrong type) at their rates; nothing drawn when off."""
from __future__ import annotations

import json
import random

import pytest

from eagledata.emulator import parse_config
from eagledata.emulator.toolcalls import ARG_WORDS, CallStyle, context_words, plan
from eagledata.errors import InputError

TOOLS = [{"type": "function", "function": {"name": "cat", "parameters": {
    "type": "object", "properties": {"file_name": {"type": "string"}, "lines": {"type": "integer"}},
    "required": ["file_name"]}}}]
MESSAGES = [{"role": "user", "content": "Show me what report_2024.txt says."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.ls:0", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "functions.ls:0", "content": '{"files": ["notes.md", "budget.csv"]}'}]


def calls(style: CallStyle, n: int = 400) -> list:
    """`n` draws of the one call the plan makes for MESSAGES (tool_choice required: always a call)."""
    p = plan(MESSAGES, TOOLS, tool_choice="required", style=style)
    assert p is not None
    return [p.draw(random.Random(seed))[0] for seed in range(n)]


def test_arguments_reuse_the_tasks_words_and_the_earlier_results():
    """At context_share 1 every string argument is a word of the task or of a tool result after it (the file
    names an `ls` returned among them). Planted: share 0 draws the fixed word list, none of these."""
    words = context_words(MESSAGES)
    assert {"report_2024.txt", "notes.md", "budget.csv"} <= set(words)
    got = {json.loads(c.arguments)["file_name"] for c in calls(CallStyle(context_share=1.0))}
    assert got <= set(words) and {"notes.md", "budget.csv"} <= got
    plain = {json.loads(c.arguments)["file_name"] for c in calls(CallStyle())}
    assert not plain & set(words)


def test_slips_come_at_their_rates_each_as_an_agent_makes_it():
    """Each slip at 10 %: an undeclared name (`cat_v2`, its id naming it), arguments that do not parse, the required
    `file_name` left out, a value of another type; the rest well formed. Rates within ±5 points over 400 calls."""
    style = CallStyle(slips=(("unknown_name", 0.1), ("bad_json", 0.1), ("missing_required", 0.1),
                             ("wrong_type", 0.1)))
    seen = {"unknown_name": 0, "bad_json": 0, "missing_required": 0, "wrong_type": 0, "fine": 0}
    for c in calls(style):
        if c.name != "cat":
            assert c.name == "cat_v2" and c.id.startswith("functions.cat_v2:")
            seen["unknown_name"] += 1
            continue
        try:
            args = json.loads(c.arguments)
        except json.JSONDecodeError:
            seen["bad_json"] += 1
            continue
        if "file_name" not in args:
            seen["missing_required"] += 1
        elif not isinstance(args["file_name"], str) or not isinstance(args["lines"], int):
            seen["wrong_type"] += 1
        else:
            seen["fine"] += 1
    for kind in ("unknown_name", "bad_json", "missing_required", "wrong_type"):
        assert 0.05 <= seen[kind] / 400 <= 0.15, seen
    assert seen["fine"] / 400 >= 0.5


def test_off_by_default_no_draw_is_made():
    """The default style draws nothing extra: each call is what the emulator drew before styles existed (a string
    from ARG_WORDS, an integer 0-100, in the schema's order), seed for seed, and so with every rate at 0. Planted: a
    slip drawn even at rate 0 shifts the draws."""
    p = plan(MESSAGES, TOOLS, tool_choice="required")
    zero = plan(MESSAGES, TOOLS, tool_choice="required", style=CallStyle(0.0, (("bad_json", 0.0),)))
    assert p is not None and zero is not None and p.context == () and parse_config({}).tool_style == CallStyle()
    for seed in range(50):
        r = random.Random(seed)
        before = json.dumps({"file_name": r.choice(ARG_WORDS), "lines": r.randint(0, 100)}, ensure_ascii=False)
        assert p.draw(random.Random(seed))[0].arguments == zero.draw(random.Random(seed))[0].arguments == before


def test_the_config_names_a_bad_setting():
    cfg = parse_config({"tool_style": {"context_share": 0.7, "slips": {"bad_json": 0.01, "unknown_name": 0.02}}})
    assert cfg.tool_style == CallStyle(0.7, (("unknown_name", 0.02), ("bad_json", 0.01)))
    with pytest.raises(InputError, match="tool_style.slips.typo"):
        parse_config({"tool_style": {"slips": {"typo": 0.1}}})
    with pytest.raises(InputError, match="tool_style.context_share"):
        parse_config({"tool_style": {"context_share": 2}})
    with pytest.raises(InputError, match="add up to more than 1"):
        parse_config({"tool_style": {"slips": {"bad_json": 0.6, "wrong_type": 0.6}}})
