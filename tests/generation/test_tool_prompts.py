"""Prompt files with tools: OpenAI tool turns checked (file:line and the field), ShareGPT tool turns converted with
K2.5's own call ids, per-dataset tools, and the demo tool dataset."""
import copy
import json

import pytest

from eagledata.errors import InputError
from eagledata.generation.conversations.datasets import load_datasets
from eagledata.prompts import load_prompts, normalize_prompt, normalize_tools, scan_prompts
from tests.helpers import ROOT


def fn(name):
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object", "properties": {}}}}


TOOLS = [fn("get_weather"), fn("search_web")]


def call(cid, name, args='{"city": "Oslo"}'):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def tool_conv():
    """user → two parallel calls → both results → a third call → its result → answer → a second user."""
    return {"id": "t1", "tools": copy.deepcopy(TOOLS), "messages": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": None, "tool_calls": [call("functions.get_weather:0", "get_weather"),
                                                             call("functions.get_weather:1", "get_weather",
                                                                  {"city": "Bergen"})]},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "rain"},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": [{"type": "text", "text": "sun"}]},
        {"role": "assistant", "content": "Checking news.", "tool_calls": [call("functions.search_web:2", "search_web",
                                                                             '{"q": "storm"}')]},
        {"role": "tool", "tool_call_id": "functions.search_web:2", "content": "no storm"},
        {"role": "assistant", "content": "Sun in Oslo, rain in Bergen."},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]}


def write(tmp_path, *objs, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def test_openai_tool_conversation_round_trips_whole(tmp_path):
    obj = tool_conv()
    ok = {"id": "plain", "messages": [{"role": "user", "content": "hi"}]}
    plain, p = load_prompts(write(tmp_path, ok, obj))
    assert p.id == "t1" and p.tools == TOOLS and plain.tools is None
    assert p.messages == obj["messages"]  # every turn kept whole: tool_calls, tool_call_id, null content, parts
    assert p.messages[2]["tool_calls"][1]["function"]["arguments"] == {"city": "Bergen"}  # as written, not re-dumped


def test_trailing_tool_call_turn_is_dropped_not_refused():
    obj = tool_conv()
    obj["messages"] = obj["messages"][:3]  # ends in the dataset's own (unanswered) calls: regenerated
    assert [m["role"] for m in normalize_prompt(obj).messages] == ["system", "user"]


def bad(mutate):
    obj = tool_conv()
    mutate(obj["messages"], obj)
    return obj


def _set(d, k, v):
    d[k] = v


@pytest.mark.parametrize("obj, field, words", [
    (bad(lambda m, o: _set(m[3], "tool_call_id", "functions.nope:9")), r"messages\[3\]\.tool_call_id",
     "answers no open call"),
    (bad(lambda m, o: m[3].pop("tool_call_id")), r"messages\[3\]\.tool_call_id", "must be a string"),
    # a third result for two calls: answers nothing
    (bad(lambda m, o: m.insert(5, {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "x"})),
     r"messages\[5\]\.tool_call_id", "answered already"),
    # a result with no tool call before it at all
    (bad(lambda m, o: m.insert(2, {"role": "tool", "tool_call_id": "x", "content": "r"})),
     r"messages\[2\]\.tool_call_id", "no assistant tool call before it"),
    (bad(lambda m, o: _set(m[2]["tool_calls"][1], "id", "functions.get_weather:0")),
     r"messages\[2\]\.tool_calls\[1\]\.id", "duplicate call id"),
    (bad(lambda m, o: _set(m[5]["tool_calls"][0]["function"], "name", "rm_rf")),
     r"messages\[5\]\.tool_calls\[0\]\.function\.name", "do not declare"),
    (bad(lambda m, o: _set(m[2], "tool_calls", [])), r"messages\[2\]\.tool_calls", "non-empty list"),
    (bad(lambda m, o: _set(m[2]["tool_calls"][0], "type", "code")), r"messages\[2\]\.tool_calls\[0\]\.type", ""),
    (bad(lambda m, o: m[2]["tool_calls"][0].pop("id")), r"messages\[2\]\.tool_calls\[0\]\.id", "non-empty"),
    (bad(lambda m, o: _set(m[2]["tool_calls"][0]["function"], "arguments", 3)),
     r"messages\[2\]\.tool_calls\[0\]\.function\.arguments", ""),
    (bad(lambda m, o: _set(m[3], "content", None)), r"messages\[3\]\.content", "must be a string"),
    # the conversation moves on with a call unanswered
    (bad(lambda m, o: m.pop(3)), r"messages\[2\]\.tool_calls\[1\]\.id", "no tool turn answering it"),
    (bad(lambda m, o: _set(o, "tools", [{"type": "function", "function": {"description": "no name"}}])),
     r"tools\[0\]\.function\.name", "non-empty string"),
    (bad(lambda m, o: _set(o, "tools", [fn("a"), fn("a")])), r"tools\[1\]\.function\.name", "declared twice"),
    (bad(lambda m, o: _set(o, "tools", {"get_weather": {}})), "tools", "must be a list"),
])
def test_bad_tool_turn_names_file_line_and_field(tmp_path, obj, field, words):
    path = write(tmp_path, {"id": "ok", "messages": [{"role": "user", "content": "q"}]}, obj)
    with pytest.raises(InputError, match=rf"p\.jsonl:2: field '{field}': .*{words}"):
        load_prompts(path)


def test_calls_are_only_checked_against_declared_tools():
    obj = tool_conv()
    del obj["tools"]
    assert normalize_prompt(obj).tools is None  # no declarations: any name goes
    with pytest.raises(InputError, match=r"messages\[2\]\.tool_calls\[0\]\.function\.name.*do not declare"):
        normalize_prompt(obj, tools=[fn("search_web")])  # the dataset's declarations count as the prompt's


def sharegpt_tools_row():
    """LLaMA-Factory's shape: `function_call` / `observation` turns, tools as a JSON string of bare functions."""
    bare = [t["function"] for t in TOOLS]
    return {"id": "sg", "tools": json.dumps(bare), "conversations": [
        {"from": "system", "value": "Use tools."},
        {"from": "human", "value": "Weather in Oslo and Bergen?"},
        {"from": "function_call", "value": json.dumps([{"name": "get_weather", "arguments": {"city": "Oslo"}},
                                                       {"name": "get_weather", "arguments": {"city": "Bergen"}}])},
        {"from": "observation", "value": "sun"},
        {"from": "observation", "value": "rain"},
        {"from": "function_call", "value": json.dumps({"name": "search_web", "arguments": '{"q": "storm"}'})},
        {"from": "function_response", "value": "no storm"},  # speculators reads this role as a tool result too
        {"from": "gpt", "value": "Sun in Oslo, rain in Bergen."},
        {"from": "human", "value": "And tomorrow?"},
        {"from": "gpt", "value": "old answer, dropped"},
    ]}


def test_sharegpt_function_call_and_observation_get_native_ids():
    p = normalize_prompt(sharegpt_tools_row())
    assert p.tools == TOOLS  # the JSON string parsed, bare functions wrapped
    assert [m["role"] for m in p.messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool",
                                               "assistant", "user"]
    first, second = p.messages[2]["tool_calls"], p.messages[5]["tool_calls"]
    # ids count the conversation's calls from 0, as K2.5 writes them; object arguments dumped as the template would
    assert first == [call("functions.get_weather:0", "get_weather", '{"city": "Oslo"}'),
                     call("functions.get_weather:1", "get_weather", '{"city": "Bergen"}')]
    assert second == [call("functions.search_web:2", "search_web", '{"q": "storm"}')]  # a string kept as written
    assert [(m["tool_call_id"], m["content"]) for m in p.messages if m["role"] == "tool"] == [
        ("functions.get_weather:0", "sun"), ("functions.get_weather:1", "rain"), ("functions.search_web:2", "no storm")]
    assert p.messages[2]["content"] == ""


@pytest.mark.parametrize("mutate, field, words", [
    (lambda c: c.pop(4), r"conversations\[2\]\.value", "1 of its calls have no tool result"),  # 2 calls, 1 result
    (lambda c: c.insert(2, {"from": "observation", "value": "x"}), r"conversations\[2\]\.from",
     "no function_call turn before it"),
    (lambda c: _set(c[2], "value", "get_weather(Oslo)"), r"conversations\[2\]\.value", "must be JSON"),
    (lambda c: _set(c[2], "value", json.dumps({"arguments": {}})), r"conversations\[2\]\.value", "needs a non-empty"),
    (lambda c: _set(c[5], "value", json.dumps({"name": "rm_rf", "arguments": {}})), r"conversations\[5\]\.value",
     "do not declare"),
])
def test_bad_sharegpt_tool_turns_name_the_turn(tmp_path, mutate, field, words):
    row = sharegpt_tools_row()
    mutate(row["conversations"])
    with pytest.raises(InputError, match=rf"p\.jsonl:1: field '{field}': .*{words}"):
        load_prompts(write(tmp_path, row))


def test_specforge_turns_keep_tool_calls_and_parse_tools_string():
    obj = tool_conv()
    row = {"id": "sf", "tools": json.dumps(TOOLS), "conversations": obj["messages"]}
    row["conversations"][4]["content"] = "sun"  # SpecForge turns carry text
    row["conversations"][0]["loss"] = 0  # other keys are not passed on
    p = normalize_prompt(row)
    assert p.tools == TOOLS and p.messages[0] == {"role": "system", "content": "Use tools."}
    assert p.messages[2]["tool_calls"] == obj["messages"][2]["tool_calls"] and p.messages[3]["tool_call_id"]
    row["conversations"][3]["tool_call_id"] = "nope"
    with pytest.raises(InputError, match=r"conversations\[3\]\.tool_call_id"):
        normalize_prompt(row)


def test_normalize_tools_shapes():
    assert normalize_tools(None) is None and normalize_tools("") is None and normalize_tools([]) is None
    assert normalize_tools(json.dumps(TOOLS)) == TOOLS
    with pytest.raises(InputError, match=r"field 'tools'.*not valid JSON"):
        normalize_tools("[{")


# -- per-dataset tools -------------------------------------------------------------------------------------------

def test_dataset_tools_inline_and_file_are_the_default(tmp_path):
    own = tool_conv()
    own["tools"] = [fn("get_weather"), fn("search_web"), fn("read_file")]
    none = tool_conv()
    none["id"] = "t2"
    del none["tools"]
    explicit_none = {"id": "t3", "tools": [], "messages": [{"role": "user", "content": "hi"}]}
    prompts = write(tmp_path, own, none, explicit_none)
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "datasets.yaml").write_text(
        f"inline:\n  prompts: {prompts}\n  tools:\n"
        + "".join(f"  - {json.dumps(t)}\n" for t in TOOLS)
        + f"from_file: {{prompts: {prompts}, tools: tools.json}}\n"  # relative to the datasets file
        + f"plain: {{prompts: {prompts}}}\n")
    specs = load_datasets(tmp_path / "datasets.yaml")
    assert specs["inline"].tools == TOOLS and specs["from_file"].tools == TOOLS and specs["plain"].tools is None
    for name in ("inline", "from_file"):
        got = {p.id: p.tools for p in scan_prompts(specs[name].prompts, tools=specs[name].tools)}
        assert got == {"t1": own["tools"], "t2": TOOLS, "t3": None}  # the prompt's own tools win; [] means none
    assert {p.id: p.tools for p in scan_prompts(prompts)}["t2"] is None


@pytest.mark.parametrize("entry, where", [
    ("tools: 3", r"datasets\.yaml field 'd\.tools': must be a list"),
    ("tools: [{type: function, function: {description: x}}]", r"datasets\.yaml field 'd\.tools\[0\]\.function\.name'"),
    ("tools: missing.json", r"datasets\.yaml field 'd\.tools': cannot read"),
    ("tools: bad.json", r"bad\.json:1: not valid JSON"),
    ("tools: worse.json", r"worse\.json field 'tools\[1\]\.function\.name'"),
])
def test_bad_dataset_tools_name_file_and_field(tmp_path, entry, where):
    (tmp_path / "bad.json").write_text("[{")
    (tmp_path / "worse.json").write_text(json.dumps([fn("a"), fn("a")]))
    (tmp_path / "datasets.yaml").write_text(f"d: {{prompts: p.jsonl, {entry}}}\n")
    with pytest.raises(InputError, match=where):
        load_datasets(tmp_path / "datasets.yaml")


def test_a_bad_call_against_dataset_tools_names_the_prompt_line(tmp_path):
    obj = tool_conv()
    del obj["tools"]
    with pytest.raises(InputError, match=r"p\.jsonl:1: field 'messages\[2\]\.tool_calls\[0\]\.function\.name'"):
        scan_prompts(write(tmp_path, obj), tools=[fn("search_web")])


# -- the demo dataset --------------------------------------------------------------------------------------------

def test_demo_tools_dataset_is_valid_and_covers_the_cases():
    prompts = load_prompts(ROOT / "examples/prompts/demo-tools.jsonl")
    assert len(prompts) >= 10 and all(p.tools for p in prompts)
    rounds = [sum(1 for m in p.messages if m.get("tool_calls")) for p in prompts]
    assert max(rounds) >= 2 and 0 in rounds  # several tool rounds; tools declared but never called
    assert any(len(m.get("tool_calls") or ()) >= 2 for p in prompts for m in p.messages)  # parallel calls
    assert any(m["role"] == "user" and any(x["role"] == "tool" for x in p.messages[:i])
               for p in prompts for i, m in enumerate(p.messages))  # a second user turn after the tool loop
    for p in prompts:  # the model's own ids: functions.NAME:IDX, counted over the conversation
        ids = [c["id"] for m in p.messages for c in m.get("tool_calls") or ()]
        names = [c["function"]["name"] for m in p.messages for c in m.get("tool_calls") or ()]
        assert ids == [f"functions.{n}:{i}" for i, n in enumerate(names)], p.id
        assert all(isinstance(c["function"]["arguments"], str) and json.loads(c["function"]["arguments"]) is not None
                   for m in p.messages for c in m.get("tool_calls") or ())


def test_demo_tools_render_through_k25_template(tok):
    """Every call renders with its id and every result as `## Return of <id>`, and the declarations are rendered: what
    the validator accepts is a conversation K2.5's own template writes out whole."""
    from eagledata.text.sequences import render_chat

    for p in load_prompts(ROOT / "examples/prompts/demo-tools.jsonl"):
        text = render_chat(tok, p.messages, tools=p.tools)
        assert "<|im_system|>tool_declare<|im_middle|>" in text, p.id
        for m in p.messages:
            for c in m.get("tool_calls") or ():
                assert f"<|tool_call_begin|>{c['id']}<|tool_call_argument_begin|>{c['function']['arguments']}" in text
            if m["role"] == "tool":
                assert f"## Return of {m['tool_call_id']}\n{m['content']}" in text, p.id
