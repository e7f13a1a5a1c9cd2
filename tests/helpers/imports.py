"""The library's import graph, read from the source (every import, lazy ones included): test_imports.py holds
it to no cycles and one-way stages; a test of a module may hold that module's own imports to it."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

LIB = ROOT / "lib"


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
