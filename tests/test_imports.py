"""The library's import graph, read from the source (every import, lazy ones included): no cycles, and the
stages import one way."""
from __future__ import annotations

from tests.helpers.imports import import_graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_library_has_no_import_cycles():
    graph = import_graph()
    assert "eagledata.training.job" in graph and len(graph) > 50  # the walk found the library
    assert cycles(graph) == []


def test_a_planted_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_stages_import_one_way():
    graph = import_graph()

    def stage_deps(stage: str) -> set[str]:
        return {d.split(".")[1] for m, deps in graph.items() if m.startswith(f"eagledata.{stage}")
                for d in deps if d.count(".") >= 1 and not d.startswith(f"eagledata.{stage}")}

    assert not stage_deps("text") & {"openrouter", "generation", "training", "emulator"}
    assert not stage_deps("openrouter") & {"text", "generation", "training", "emulator"}
    assert not stage_deps("training") & {"openrouter", "generation", "emulator"}
    assert not stage_deps("emulator") & {"openrouter", "generation", "training", "moonshot"}
    assert not stage_deps("moonshot") & {"text", "openrouter", "generation", "training", "emulator"}
    assert "eagledata.retry" in graph["eagledata.training.vllm_backend"]
    assert "eagledata.retry" in graph["eagledata.generation.policy"]
