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
    # the agentic environments need only the shared modules (their worker imports as little as it can)
    assert not stage_deps("agentic") & {"text", "openrouter", "generation", "training", "emulator", "moonshot",
                                        "quality"}
    assert "eagledata.wheels" in graph["eagledata.agentic.bfcl"]
    assert "eagledata.retry" in graph["eagledata.training.vllm_backend"]
    assert "eagledata.retry" in graph["eagledata.generation.policy"]


# generation/'s rooms, lowest first: a room imports only from those before it (a module at generation/'s top level
# is a room of its own): the rules and records, the money, the report, the settings, the plan, the run's datasets,
# then the two routes side by side, and the entry that chooses between them.
GENERATION_ROOMS = ["policy", "conversations", "money", "report", "config", "clock", "plan", "lanes",
                    "realtime", "batch", "run"]


def upward_imports(graph: dict[str, set[str]], rooms: list[str] = GENERATION_ROOMS) -> list[str]:
    """Imports from a generation room to a later one (or to one not in `rooms`), and from a room to the package
    above it (`eagledata.generation` itself: its public names are for notebooks, not for its rooms)."""
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["eagledata", "generation"] else None

    found = []
    for module, deps in sorted(graph.items()):
        here = room(module)
        if here is None:
            continue
        for dep in sorted(deps):
            there = room(dep)
            if dep == "eagledata.generation" or (there is not None and there != here and (
                    here not in rooms or there not in rooms or rooms.index(there) > rooms.index(here))):
                found.append(f"{module} -> {dep}")
    return found


def test_generation_rooms_import_downward_only():
    graph = import_graph()
    assert {"eagledata.generation.realtime.engine", "eagledata.generation.batch.route"} <= set(graph)
    assert upward_imports(graph) == []
    # the two routes are siblings: neither imports the other
    assert not {d for m, deps in graph.items() if m.startswith("eagledata.generation.batch") for d in deps
                if d.startswith("eagledata.generation.realtime")}


def test_a_planted_upward_import_is_found():
    graph = {"eagledata.generation.money.ledger": {"eagledata.generation.realtime.pacing"},
             "eagledata.generation.realtime.pacing": {"eagledata.generation.money.flights"},
             "eagledata.generation.plan.budget": {"eagledata.generation"}}
    assert upward_imports(graph) == ["eagledata.generation.money.ledger -> eagledata.generation.realtime.pacing",
                                     "eagledata.generation.plan.budget -> eagledata.generation"]


def test_no_module_outside_text_names_the_kimi_tokenizer():
    """Stages take the text stage's `Tokenizer` interface: a second model family is a tokenizer, not a rewrite."""
    from tests.helpers import ROOT

    named = [str(p.relative_to(ROOT)) for p in (ROOT / "lib" / "eagledata").rglob("*.py")
             if "KimiTokenizer" in p.read_text(encoding="utf-8") and "text" not in p.relative_to(ROOT).parts[2:3]]
    assert named == []


# The modules that assemble a run (or a plan) from a notebook's settings: they read the settings class whole and hand
# every other module what it needs (lib/eagledata/README.md, "Where settings live").
ASSEMBLERS = {
    "eagledata.generation.config", "eagledata.generation", "eagledata.generation.run",
    "eagledata.generation.lanes", "eagledata.generation.realtime.engine", "eagledata.generation.realtime.parts",
    "eagledata.generation.batch.route", "eagledata.generation.plan.budget", "eagledata.generation.plan.route_plan",
    "eagledata.notebooks", "eagledata.generate"}
SETTINGS_CLASSES = {"GenerateConfig", "BudgetConfig"}


def readers_of_settings(root=None) -> set[str]:
    """The library modules that name generation's settings classes."""
    import ast

    from tests.helpers.imports import LIB
    out = set()
    for path in (root or LIB).rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if names & SETTINGS_CLASSES:
            parts = list(path.relative_to(root or LIB).with_suffix("").parts)
            out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_settings_classes_are_read_only_where_a_run_is_assembled():
    """Issue 60 item 5: a domain module takes the settings it needs as arguments; the whole GenerateConfig or
    BudgetConfig reaches only the modules that assemble a run or a plan (the reporters read what the ledger owns
    from the ledger, and what they only show from `RunShown` / `BatchShown`)."""
    assert readers_of_settings() <= ASSEMBLERS, readers_of_settings() - ASSEMBLERS


def test_a_planted_reader_of_the_settings_is_found(tmp_path):
    pkg = tmp_path / "eagledata" / "generation" / "realtime"
    pkg.mkdir(parents=True)
    (pkg / "reporter.py").write_text("from ..config import GenerateConfig\n\ndef show(cfg: GenerateConfig): ...\n")
    assert readers_of_settings(tmp_path) - ASSEMBLERS == {"eagledata.generation.realtime.reporter"}
