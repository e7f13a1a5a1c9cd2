"""BFCL's multi-turn tasks and backends from the `bfcl-eval` wheel, fetched from the package index at use time
(`wheels.fetch_wheel`), never installed (it pins numpy 1.26 and a dozen vendor SDKs) and never vendored: its JSON
read with zipfile, its backend sources extracted once into the cache for the worker to import.

A task (`BFCL_v4_multi_turn_base.json`, one JSON per line: id, question = user turns each a list of messages,
initial_config, involved_classes, path, excluded_function) becomes a `Task` offering the function docs of its
involved classes (`multi_turn_func_doc/*.json`, in the class order, each file's order: what BFCL offers) as
OpenAI tools (`openai_tool`). The ground truth (`possible_answer/…`: per turn, Python call strings such as
`cd(folder='document')`) is read into `Call`s with JSON arguments (`parse_call`, with `ast`, never eval)."""
from __future__ import annotations

import ast
import copy
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..wheels import Downloader, MissingPackage, extract_once, fetch_wheel, pip_download
from .backends import BFCL, BFCL_MODULES, BFCL_PACKAGE
from .calls import Call
from .tasks import Task

BFCL_REQUIREMENT = "bfcl-eval==2026.3.23"
TASKS_MEMBER = "bfcl_eval/data/BFCL_v4_multi_turn_base.json"
ANSWERS_MEMBER = "bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_base.json"
FUNC_DOC_DIR = "bfcl_eval/data/multi_turn_func_doc/"
CODE_PREFIX = BFCL_PACKAGE.replace(".", "/") + "/"  # the backends' sources in the wheel
# class -> its function docs: named as its backend module is (bfcl_eval/constants/executable_backend_config.py)
CLASS_DOCS = {name: f"{module}.json" for name, module in BFCL_MODULES.items()}
# BFCL's type names -> JSON Schema's (bfcl_eval/constants/type_mappings.py GORILLA_TO_OPENAPI); others -> string
OPENAPI_TYPES = {"integer": "integer", "number": "number", "float": "number", "double": "number",
                 "string": "string", "char": "string", "any": "string", "Any": "string", "String": "string",
                 "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "tuple": "array",
                 "ArrayList": "array", "Array": "array", "Queue": "array", "Stack": "array",
                 "dict": "object", "object": "object", "HashMap": "object", "Hashtable": "object",
                 "byte": "integer", "short": "integer", "long": "integer"}


def bfcl_wheel(cache_dir: str | Path, download: Downloader = pip_download) -> Path:
    """The `bfcl-eval` wheel in `cache_dir`, downloaded once (`pip download --no-deps`)."""
    return fetch_wheel(BFCL_REQUIREMENT, cache_dir, download)


def bfcl_code(wheel: Path, cache_dir: str | Path) -> Path:
    """The folder to import BFCL's backends from (put on the worker's path): the wheel's `func_source_code/`
    extracted once into `cache_dir`. Only that folder: the worker imports nothing else of the wheel."""
    return extract_once(wheel, CODE_PREFIX, Path(cache_dir) / (wheel.name.removesuffix(".whl") + "-backends"))


def bfcl_code_path(cache_dir: str | Path, download: Downloader = pip_download) -> list[str]:
    """The code path a `bfcl` task's environment is built with (`Task.spec(code_path=...)`): the wheel fetched and
    its backends extracted into `cache_dir` once."""
    return [str(bfcl_code(bfcl_wheel(cache_dir, download), cache_dir))]


def _schema(node: Any) -> Any:
    """A BFCL parameter schema as JSON Schema: types renamed everywhere (nested items and properties too), a
    property without a type made a string (as BFCL does); floats keep BFCL's hint (`format: float` and the sentence
    it adds to the description)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    kind = node.get("type")
    if isinstance(kind, str):
        out["type"] = OPENAPI_TYPES.get(kind, "string")
        if kind == "float":
            out["format"] = "float"
            out["description"] = out.get("description", "") + " This is a float type value."
    if isinstance(node.get("properties"), dict):
        out["properties"] = {name: _schema(p if "type" in p else {**p, "type": "string"})
                             for name, p in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        out["items"] = _schema(node["items"])
    return out


def openai_tool(doc: Mapping[str, Any]) -> dict[str, Any]:
    """One BFCL function doc as the OpenAI `tools` entry the model is offered (BFCL's `convert_to_tool` for
    OpenAI chat completions, its `response` schema left out: it is not part of a tool)."""
    params = _schema(copy.deepcopy(dict(doc["parameters"])))
    params["type"] = "object"
    params.setdefault("properties", {})
    return {"type": "function",
            "function": {"name": doc["name"], "description": doc.get("description", ""), "parameters": params}}


def _member(wheel: zipfile.ZipFile, member: str, path: Path) -> bytes:
    try:
        return wheel.read(member)
    except KeyError:
        raise MissingPackage(f"the wheel has no {member} (is it {BFCL_REQUIREMENT}?)", path) from None


def _lines(data: bytes, where: str) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InputError(f"not valid JSON: {e.msg}", where, i) from None
    return rows


def function_docs(wheel_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """{class: its function docs in file order} for BFCL's eight multi-turn backends."""
    path = Path(wheel_path)
    try:
        with zipfile.ZipFile(path) as wheel:
            return {cls: _lines(_member(wheel, FUNC_DOC_DIR + name, path), f"{path}!{FUNC_DOC_DIR}{name}")
                    for cls, name in CLASS_DOCS.items()}
    except zipfile.BadZipFile as e:
        raise MissingPackage(f"not a wheel (zip): {e}; delete it and fetch it again", path) from None


def task_from_bfcl(entry: Mapping[str, Any], docs: Mapping[str, list[dict[str, Any]]]) -> Task:
    """One BFCL task line as a Task: its user turns as they are, the tools of its involved classes."""
    classes = list(entry["involved_classes"])
    unknown = [c for c in classes if c not in docs]
    if unknown:
        raise InputError(f"involved class(es) {unknown} are not multi-turn backends", field="involved_classes")
    tools = [openai_tool(d) for c in classes for d in docs[c]]
    return Task(entry["id"], [list(turn) for turn in entry["question"]], tools, BFCL,
                dict(entry.get("initial_config", {})), classes)


def read_bfcl_tasks(wheel_path: str | Path, member: str = TASKS_MEMBER) -> list[Task]:
    """BFCL's multi-turn tasks (the 200 base ones by default) as Tasks, in file order."""
    path = Path(wheel_path)
    docs = function_docs(path)
    with zipfile.ZipFile(path) as wheel:
        rows = _lines(_member(wheel, member, path), f"{path}!{member}")
    tasks = []
    for i, row in enumerate(rows, 1):
        try:
            tasks.append(task_from_bfcl(row, docs))
        except InputError as e:
            raise e.at(f"{path}!{member}", i) from None
    return tasks


def parse_call(text: str, parameters: Mapping[str, Any]) -> Call:
    """A BFCL ground-truth call string (`mv(source='a', destination='b')`; a positional argument takes the tool's
    parameter in that place) as a Call with JSON arguments. Literals only: `ast.literal_eval`, nothing run."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a call of a plain name")
        names = list(parameters.get("properties", {}))
        if len(node.args) > len(names):
            raise ValueError(f"{len(node.args)} positional arguments for {len(names)} parameters")
        args = {names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("**kwargs")
            args[kw.arg] = ast.literal_eval(kw.value)
    except (SyntaxError, ValueError) as e:
        raise InputError(f"cannot read the call {text!r}: {e}") from None
    return Call(node.func.id, json.dumps(args))


def read_ground_truth(wheel_path: str | Path, tasks: list[Task],
                      member: str = ANSWERS_MEMBER) -> dict[str, list[list[Call]]]:
    """{task id: per user turn, the calls BFCL's ground truth makes}, as Calls on the tasks' tools."""
    path = Path(wheel_path)
    with zipfile.ZipFile(path) as wheel:
        rows = _lines(_member(wheel, member, path), f"{path}!{member}")
    by_id = {t.id: t for t in tasks}
    out = {}
    for i, row in enumerate(rows, 1):
        task = by_id.get(row["id"])
        if task is None:
            continue
        params = {t["function"]["name"]: t["function"]["parameters"] for t in task.tools}
        try:
            out[task.id] = [[parse_call(c, params.get(c.split("(")[0].strip(), {})) for c in turn]
                            for turn in row["ground_truth"]]
        except InputError as e:
            raise e.at(f"{path}!{member}", i) from None
    return out

