"""Tool conversations regenerated semi-on-policy: the chain (pure), the ids the model wrote, and the record."""
from __future__ import annotations

import json

import pytest

from eagledata.generation.conversations.recording import build_record
from eagledata.generation.conversations.store import Store
from eagledata.generation.conversations.turns import TOOL_MISMATCH, Conversation, model_call_ids
from eagledata.openrouter import Completion, Kind, classify_response
from eagledata.prompts import normalize_prompt
from eagledata.records import Answer, Record, ToolCall, Usage
from eagledata.text import conversation_ids, output_ids, parse_output_ids, prompt_ids
from eagledata.text.tokenizer import CALL_BEGIN, SECTION_BEGIN, SECTION_END
from tests.helpers.prompts import TOOLS, call, dataset


def served(*calls: ToolCall, content: str = "Checking.", reasoning: str = "I need tools.") -> Answer:
    return Answer(reasoning, content, "tool_calls", calls)


@pytest.fixture(scope="module")
def conv() -> Conversation:
    return Conversation.of(normalize_prompt(dataset()), "all")


def test_asks_are_cut_at_the_datasets_answers_and_its_calls_kept_to_match(conv):
    assert len(conv.asks) == 4 and conv.chained and conv.last == 4
    assert [[m["role"] for m in a] for a in conv.asks] == [["system", "user"], ["tool", "tool"], ["tool"], ["user"]]
    assert [[c.name for c in k] for k in conv.dataset_calls] == [["get_weather", "get_weather"], ["search"], []]
    assert conv.parallel_tool_calls and conv.tools == tuple(TOOLS)
    assert not Conversation.of(normalize_prompt({"id": "s", "messages": [{"role": "user", "content": "hi"}]}),
                               "all").parallel_tool_calls


def test_a_matched_loop_splices_the_datasets_results_with_the_models_ids(conv, tok):
    t1 = conv.turn()
    ours, rebuilt = model_call_ids([ToolCall("call_x9", "get_weather", '{"q": "Paris"}'),
                                    ToolCall("call_y7", "get_weather", '{"q": "Lyon"}')], t1.messages)
    assert rebuilt and [c.id for c in ours] == ["functions.get_weather:0", "functions.get_weather:1"]
    a1 = served(*ours)
    assert not t1.mismatch(a1) and not t1.ends(a1)
    t2 = t1.next(a1)
    assert t2.id == "agent-1#2" and t2.number == 2
    mine = t2.messages[2]
    assert mine == {"role": "assistant", "content": "Checking.", "reasoning": "I need tools.",
                    "reasoning_details": [{"type": "reasoning.text", "text": "I need tools."}],
                    "tool_calls": [c.to_api() for c in ours]}
    # the dataset's results, each after the call of the same name and rank: call_b (2nd) -> :1, call_a -> :0
    assert [(m["tool_call_id"], m["content"]) for m in t2.messages[3:]] == [
        ("functions.get_weather:1", "Lyon: rain"), ("functions.get_weather:0", "Paris: sun")]
    # the second round numbers on from the conversation's calls; a native id is taken as served
    ours2, rebuilt2 = model_call_ids([ToolCall("functions.search:2", "search", '{"q": "news"}')], t2.messages)
    assert not rebuilt2 and ours2[0].id == "functions.search:2"
    a2 = served(*ours2, content="", reasoning="Now search.")
    t3 = t2.next(a2)
    assert t3.messages[-1] == {"role": "tool", "tool_call_id": "functions.search:2", "content": "news: none"}
    # in the loop, each request is the last one's prompt + the model's own output + the results: on-policy ids
    tools = list(conv.tools)
    p2, p3 = prompt_ids(tok, t2.messages, tools=tools), prompt_ids(tok, t3.messages, tools=tools)
    out2 = output_ids(tok, a2.reasoning, a2.content, a2.finish_reason, tool_calls=a2.tool_calls)
    assert p3[:len(p2) + len(out2)] == p2 + out2
    # the tokenizer's prefix check: the finished conversation rendered with preserve_thinking
    assert conversation_ids(tok, t2.messages, a2.reasoning, a2.content, a2.tool_calls, tools)[
        :len(p2) + len(out2)] == p2 + out2
    # after the plain answer the loop's reasoning is dropped, as the template drops it, and the next user asks
    a3 = Answer("Think.", "Sunny and rainy; no news.", "stop")
    t4 = t3.next(a3)
    assert t4.number == 4 and t4.messages[-1] == {"role": "user", "content": "Thanks. And tomorrow?"}
    assert not any("reasoning" in m for m in t4.messages)
    assert not any("OLD" in (m.get("content") or "") for m in t4.messages)
    p4 = prompt_ids(tok, t4.messages, tools=tools)
    o4 = output_ids(tok, "r", "tomorrow: sun", "stop")
    assert conversation_ids(tok, t4.messages, "r", "tomorrow: sun", (), tools)[:len(p4) + len(o4)] == p4 + o4
    assert t4.ends(Answer("r", "x", "stop"))
    # a resume rebuilds the same request from the recorded answers
    assert conv.turn([a1, a2, a3]) == t4


@pytest.mark.parametrize("k, answer", [
    (0, served(ToolCall("functions.get_weather:0", "get_weather", "{}"))),  # one call where the dataset made two
    (0, Answer("r", "It is sunny.", "stop")),  # a plain answer where the dataset called
    (0, served(ToolCall("functions.search:0", "search", "{}"), ToolCall("functions.search:1", "search", "{}"))),
    (2, served(ToolCall("functions.search:3", "search", "{}"))),  # a call where the dataset answered plainly
])
def test_a_mismatch_ends_the_conversation_after_the_tool_call_turn(conv, k, answer):
    good = [served(ToolCall("functions.get_weather:0", "get_weather", "{}"),
                   ToolCall("functions.get_weather:1", "get_weather", "{}")),
            served(ToolCall("functions.search:2", "search", "{}"))]
    t = conv.turn(good[:k])
    assert t.mismatch(answer) and t.ends(answer) and t.next(answer) is None
    cut = Answer("r", "", "length")
    assert not t.mismatch(cut) and t.ends(cut)  # a cut ends it too, but is not a mismatch


def test_the_record_keeps_tools_calls_with_the_models_ids_and_says_what_was_rebuilt(conv, tok, tmp_path):
    t1 = conv.turn()
    served_calls = (ToolCall("call_x9", "get_weather", '{"q":"Paris"}'), ToolCall("call_y7", "get_weather", "{}"))
    c = Completion(answer=served(*served_calls), provider="P", model="m", generation_id="g",
                   usage=Usage(10, 20, 5, 0.001))
    r = build_record(tok, turn=t1, dataset="D", prompt_ids=prompt_ids(tok, t1.messages, tools=TOOLS), completion=c,
                     attempts=1)
    assert [x["id"] for x in r.tool_calls] == ["functions.get_weather:0", "functions.get_weather:1"]
    assert r.meta["served_tool_call_ids"] == ["call_x9", "call_y7"] and "ended" not in r.meta
    assert r.tools == TOOLS and r.finish_reason == "tool_calls"
    assert r.output_ids[-1] == 163586 and r.output_ids[-2] == SECTION_END and SECTION_BEGIN in r.output_ids
    assert r.output_ids.count(CALL_BEGIN) == 2
    back = parse_output_ids(tok, r.output_ids)
    assert back == r.answer and back.tool_calls[0].arguments == '{"q":"Paris"}'  # arguments exactly as served
    line = json.loads(r.to_json())
    assert Record.from_dict(line) == r
    # a mismatch is said in the record, so a resume knows the conversation ended
    lone = Completion(answer=served(served_calls[0]), provider="P", model="m", generation_id="g2", usage=Usage())
    r2 = build_record(tok, turn=t1, dataset="D", prompt_ids=[1], completion=lone, attempts=1)
    assert r2.meta["ended"] == TOOL_MISMATCH
    store = Store.open(tmp_path / "D")
    store.add_record(r2)
    assert store.conversations_finished == 1 and not store.chains
    # a record without tools writes neither field: records of plain prompts are as before
    plain = Record(id="x", dataset="D", messages=[], reasoning="", content="c", finish_reason="stop")
    assert "tools" not in json.loads(plain.to_json()) and "tool_calls" not in json.loads(plain.to_json())


def test_a_resume_continues_the_loop_from_the_recorded_answers(conv, tok, tmp_path):
    store = Store.open(tmp_path / "D")
    turn, records = conv.turn(), []
    for calls in [(ToolCall("call_1", "get_weather", "{}"), ToolCall("call_2", "get_weather", "{}")),
                  (ToolCall("call_3", "search", "{}"),)]:
        c = Completion(answer=served(*calls), provider="P", model="m", generation_id=turn.id, usage=Usage())
        r = build_record(tok, turn=turn, dataset="D", prompt_ids=[1], completion=c, attempts=1)
        store.add_record(r)
        records.append(r)
        turn = turn.next(r.answer)
    store.close()
    again = Store.open(tmp_path / "D")
    history = again.history("agent-1")
    assert [r.turn for r in history] == [1, 2]
    assert conv.turn([r.answer for r in history]) == turn
    assert turn.messages[-1]["tool_call_id"] == "functions.search:2"


def test_the_service_answer_with_tool_calls_is_read():
    body = {"id": "g", "provider": "P", "model": "m", "choices": [{"finish_reason": "tool_calls", "message": {
        "content": None, "reasoning": "think", "tool_calls": [call("call_1", "search", '{"q": "a"}')]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9}}
    out = classify_response(200, {}, json.dumps(body).encode())
    assert out.kind is Kind.OK
    a = out.completion.answer
    assert a.tool_calls == (ToolCall("call_1", "search", '{"q": "a"}'),) and a.finish_reason == "tool_calls"
    # some servers say `stop` for a tool-call answer: the model ended it with its calls either way
    body["choices"][0]["finish_reason"] = "stop"
    assert classify_response(200, {}, json.dumps(body).encode()).completion.answer.finish_reason == "tool_calls"
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = []
    body["choices"][0]["message"]["content"] = "x"
    assert classify_response(200, {}, json.dumps(body).encode()).error_class == "malformed"
    body["choices"][0]["message"]["tool_calls"] = [{"id": "c", "function": "search"}]
    assert classify_response(200, {}, json.dumps(body).encode()).error_class == "malformed"
