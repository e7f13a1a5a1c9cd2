"""The library's import graph, read from the source (every import, lazy ones included): no cycles, and the
stages import one way."""
from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib"


def import_graph(root: Path = LIB) -> dict[str, set[str]]:
    """{module: the library modules it imports}, packages by their dotted name; a parent package is not an edge."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[:len(here) - (node.level - 1)]
                    base = ".".join(here + ([node.module] if node.module else []))
                named.add(base)
                named.update(f"{base}.{a.name}" for a in node.names)
        deps = set()
        for dotted in named:
            parts = dotted.split(".")
            deps.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {d for d in deps if d in modules and d != name and not name.startswith(d + ".")}
    return graph


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
    assert not stage_deps("emulator") & {"openrouter", "generation", "training"}
    assert "eagledata.retry" in graph["eagledata.training.vllm_backend"]
    assert "eagledata.retry" in graph["eagledata.generation.policy"]
