"""The emulated model follows a dataset's tool calls at `tool_follow_rate` (issue 44, "Tool loops that end at once").

Without it the model plans its calls from the task text alone, so a dataset made by another agent matches by chance
only and its conversations end at turn 1. With the dataset known (`tool_datasets`), each round calls what the
dataset's answer called with the configured chance, drawn from the seed: the same seed, the same rounds.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from eagledata.emulator import create_app, parse_config
from eagledata.emulator.toolcalls import DatasetCalls, planned_calls
from eagledata.errors import InputError
from eagledata.generation.conversations.turns import Conversation
from eagledata.prompts import load_prompts
from eagledata.records import Answer, ToolCall, native_call_id

ROOT = Path(__file__).resolve().parents[2]
DEMO_TOOLS = ROOT / "examples" / "prompts" / "demo-tools.jsonl"
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.3, "content_median": 10, "content_sigma": 0.3, "max_total": 300}


def first_asks() -> list[tuple[Conversation, tuple[str, ...]]]:
    """Each demo tool conversation's first request and the names the dataset's answer to it called."""
    out = []
    for p in load_prompts(DEMO_TOOLS):
        conv = Conversation.of(p)
        if conv.dataset_calls:
            out.append((conv, tuple(c.name for c in conv.dataset_calls[0])))
    return out


def answers(config: dict) -> tuple[list[tuple[str, ...]], dict]:
    """The names each first request is answered with, and the emulator's stats, in process."""
    from eagledata.text import load_tokenizer

    app = create_app(parse_config({"speed": 0, "content": SMALL, **config}), load_tokenizer(None))

    async def go() -> tuple[list[tuple[str, ...]], dict]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://emu/api/v1/") as c:
            got = []
            for conv, _ in first_asks():
                body = {"model": "moonshotai/kimi-k2.5", "messages": conv.turn().messages, "tools": list(conv.tools),
                        "parallel_tool_calls": conv.parallel_tool_calls, "max_tokens": 2000}
                r = await c.post("chat/completions", json=body, headers={"Authorization": "Bearer k"})
                message = r.json()["choices"][0]["message"]
                got.append(tuple(x["function"]["name"] for x in message.get("tool_calls") or ()))
            return got, (await c.get("http://emu/admin/stats")).json()

    return asyncio.run(go())


def test_the_dataset_index_has_every_answer_of_the_tool_conversations():
    calls = DatasetCalls.load([str(DEMO_TOOLS)])
    convs = [Conversation.of(p) for p in load_prompts(DEMO_TOOLS)]
    assert len(calls) == sum(len(c.dataset_calls) for c in convs) == 34
    for c in convs:  # every point of every conversation, as the client sends it, finds the dataset's answer there
        answered: list[Answer] = []
        for k, dataset in enumerate(c.dataset_calls):
            names = tuple(x.name for x in dataset)
            assert calls.follows(c.turn(answered).messages, 1.0, 0) == (True, names), (c.id, k)
            base = sum(len(a.tool_calls) for a in answered)  # the model's own ids, not the dataset's
            ours = tuple(ToolCall(native_call_id(n, base + i), n, "{}") for i, n in enumerate(names))
            answered.append(Answer("thinking", "", "tool_calls" if ours else "stop", ours))
    assert calls.follows([{"role": "user", "content": "another conversation"}], 1.0, 0) is None


def test_rate_one_follows_every_round_and_rate_zero_keeps_the_plan():
    expected = [names for _, names in first_asks()]
    followed, stats = answers({"tool_datasets": [str(DEMO_TOOLS)], "tool_follow_rate": 1.0})
    assert followed == expected and stats["tool_rounds"] == {"followed": 17}
    own, stats = answers({"tool_datasets": [str(DEMO_TOOLS)], "tool_follow_rate": 0.0})
    plan = [planned_calls(conv.turn().messages, conv.tools, conv.parallel_tool_calls) for conv, _ in first_asks()]
    assert own == plan and stats["tool_rounds"] == {"own": 17}
    assert sum(a == b for a, b in zip(own, expected)) == 6  # the plan matches 6 of the 17 by chance only
    unknown, stats = answers({})  # no dataset given: the plan, as before the setting existed
    assert unknown == plan and stats["tool_rounds"] == {}


def test_which_rounds_follow_is_fixed_by_the_seed():
    rounds = [json.dumps(answers({"tool_datasets": [str(DEMO_TOOLS)], "tool_follow_rate": 0.5, "seed": s})[1]
                         ["tool_rounds"], sort_keys=True) for s in (1, 1, 2, 3)]
    assert rounds[0] == rounds[1]  # the same seed, the same rounds
    calls = DatasetCalls.load([str(DEMO_TOOLS)])
    picks = {s: [calls.follows(conv.turn().messages, 0.5, s)[0] for conv, _ in first_asks()] for s in range(6)}
    assert len({tuple(v) for v in picks.values()}) > 1  # another seed, other rounds
    assert picks == {s: [calls.follows(conv.turn().messages, 0.5, s)[0] for conv, _ in first_asks()]
                     for s in range(6)}


def test_bad_settings_name_the_field(tmp_path):
    with pytest.raises(InputError, match="tool_follow_rate"):
        parse_config({"tool_follow_rate": 1.5})
    with pytest.raises(InputError, match=r"tool_datasets.*not found"):
        parse_config({"tool_datasets": [str(tmp_path / "missing.jsonl")]})
    with pytest.raises(InputError, match="tool_datasets"):
        parse_config({"tool_datasets": "one.jsonl"})
