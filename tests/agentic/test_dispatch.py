"""Dispatch by name: the arguments' fit to the tool's schema, BFCL's way of showing results and errors."""
from __future__ import annotations

import json

import pytest

from eagledata.agentic.calls import Call, result_text
from eagledata.agentic.dispatch import BuildError, CallDispatcher, argument_problem, bind_functions

PARAMS = {"type": "object", "required": ["name", "count"], "properties": {
    "name": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
    "flag": {"type": "boolean"}, "mode": {"type": "string", "enum": ["a", "b"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "where": {"type": "object", "required": ["x"], "properties": {"x": {"type": "number"}}}}}


@pytest.mark.parametrize("arguments, problem", [
    ({"name": "n", "count": 1}, None),
    ({"name": "n", "count": 2.0, "ratio": 1, "flag": False, "mode": "a", "tags": [], "where": {"x": 1.5}}, None),
    ({"name": "n", "count": 1, "ratio": None}, None),  # null for an optional parameter: its default
    ({"name": "n"}, "missing required argument 'count'"),
    ({}, "missing required arguments 'name', 'count'"),
    ({"name": "n", "count": 1, "other": 1}, "got an unexpected keyword argument 'other'"),
    ({"name": 1, "count": 1}, "argument 'name' must be string, got integer"),
    ({"name": "n", "count": True}, "argument 'count' must be integer, got boolean"),
    ({"name": "n", "count": 1.5}, "argument 'count' must be integer, got number"),
    ({"name": None, "count": 1}, "argument 'name' must be string, got null"),
    ({"name": "n", "count": 1, "mode": "c"}, "argument 'mode' must be one of [\"a\", \"b\"], got \"c\""),
    ({"name": "n", "count": 1, "tags": ["x", 2]}, "argument 'tags[1]' must be string, got integer"),
    ({"name": "n", "count": 1, "where": {}}, "argument 'where' misses its field 'x'"),
    ({"name": "n", "count": 1, "where": {"x": "1"}}, "argument 'where.x' must be number, got string"),
])
def test_arguments_fit_the_schema_or_say_why(arguments, problem):
    assert argument_problem(PARAMS, arguments) == problem


def test_results_are_shown_as_bfcl_shows_them():
    class Sub(str):
        pass

    assert result_text("plain") == "plain"
    assert result_text({"a": [1, "é"]}) == '{"a": [1, "\\u00e9"]}'  # json.dumps' defaults, as BFCL calls it
    assert result_text({"a": {1, 2}}) == "{'a': {1, 2}}"  # not JSON: str()
    assert result_text([1, "a"]) == "[1, 'a']" and result_text(None) == "None" and result_text(Sub("s")) == "s"


class Box:
    def __init__(self):
        self.items = []

    def put(self, name: str, count: int) -> dict:
        self.items.append((name, count))
        return {"size": len(self.items)}

    def _hidden(self) -> None: ...


def tool(name, params=PARAMS):
    return {"type": "function", "function": {"name": name, "parameters": params}}


def test_a_call_reaches_the_public_method_of_its_name_only():
    box = Box()
    put_params = {"type": "object", "required": ["name", "count"],
                  "properties": {"name": {"type": "string"}, "count": {"type": "integer"}}}
    dispatcher = CallDispatcher(bind_functions([object(), box], [tool("put", put_params)]))
    assert dispatcher.execute(Call("put", json.dumps({"name": "a", "count": 2}))).text == '{"size": 1}'
    assert box.items == [("a", 2)]
    assert dispatcher.execute(Call("_hidden", "{}")).error == "unknown_function"
    assert dispatcher.execute(Call("__init__", "{}")).error == "unknown_function"
    with pytest.raises(BuildError, match="tool '_hidden' has no public method in Box"):
        bind_functions([box], [tool("_hidden")])
    # a schema wider than the signature: the signature has the last word
    wide = CallDispatcher(bind_functions([box], [tool("put")]))
    said = wide.execute(Call("put", json.dumps({"name": "a", "count": 1, "ratio": 0.5})))
    assert said.error == "invalid_arguments" and "put() got an unexpected keyword argument 'ratio'" in said.text
