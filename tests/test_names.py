"""One meaning per type name across the library (issue 60): no public class, Protocol or type alias is defined in two
modules of lib/eagledata, unless the pair is listed below with why both sides are the same thing. Read from the
source: a module-level `class X` or `X = ...` / `X: TypeAlias = ...` whose name is CapWords (constants are
UPPER_CASE, private names start with `_`); imports are uses, not definitions."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "lib" / "eagledata"
TYPE_NAME = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")  # CapWords with a lower-case letter: not a CONSTANT

# Intentional pairs: the emulator plays the services, and where it models the very thing a client reads it takes the
# client's word for it. Each entry pins its modules: a third definition, or one of these moving, fails the test.
ALLOWED = {
    # one provider's deployment of the model in OpenRouter's endpoints listing: the listing the emulator serves, and
    # the same listing as the client normalizes it (prices per M, problems noted)
    "Endpoint": {"emulator/catalog.py", "openrouter/catalog.py"},
    # the books of one account's money: the emulated service's (credits bought, usage charged, worst cases in
    # flight) and the run's own of that account (what it may still commit, what it has booked)
    "Ledger": {"emulator/credits.py", "generation/money/ledger.py"},
}


def type_definitions(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{public type name: the modules (paths under `package`) that define it at module level}."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                if TYPE_NAME.fullmatch(name):
                    found.setdefault(name, set()).add(module)
    return found


def defined_twice(found: dict[str, set[str]], allowed: dict[str, set[str]] = ALLOWED) -> dict[str, list[str]]:
    """The names defined in more than one module, but for the allowed pairs exactly as listed."""
    return {name: sorted(modules) for name, modules in sorted(found.items())
            if len(modules) > 1 and allowed.get(name) != modules}


def test_no_type_name_has_two_meanings_across_the_library():
    found = type_definitions()
    assert {"BatchRun", "Seams", "Verifier", "Drafter"} <= set(found)  # the walk reads the library
    assert defined_twice(found) == {}


def test_every_allowed_pair_is_still_there():
    """An allowed pair that one side renamed away is an entry to delete, not a licence for later."""
    found = type_definitions()
    assert {name: found.get(name) for name in ALLOWED} == ALLOWED


def test_a_planted_duplicate_is_found(tmp_path):
    """The check has teeth: a class and a type alias of one name in two modules (the issue's `Drafter`), and an
    allowed name defined a third time, are reported; a constant, a private name and an import are not."""
    (tmp_path / "quality").mkdir()
    (tmp_path / "emulator").mkdir()
    (tmp_path / "quality" / "config.py").write_text(
        'from typing import Literal\nfrom .speculative import Verifier\nDrafter = Literal["self", "random"]\n'
        "MAX_K = 8\n_Hidden = int\n")
    (tmp_path / "quality" / "speculative.py").write_text(
        "from typing import Protocol\nclass Drafter(Protocol): ...\nclass Verifier: ...\nMAX_K = 9\n_Hidden = str\n")
    (tmp_path / "emulator" / "catalog.py").write_text("class Endpoint: ...\n")
    (tmp_path / "openrouter.py").write_text("class Endpoint: ...\n")
    (tmp_path / "third.py").write_text("Endpoint: type = dict\n")
    found = type_definitions(tmp_path)
    assert defined_twice(found, {"Endpoint": {"emulator/catalog.py", "openrouter.py"}}) == {
        "Drafter": ["quality/config.py", "quality/speculative.py"],
        "Endpoint": ["emulator/catalog.py", "openrouter.py", "third.py"]}
    (tmp_path / "third.py").unlink()
    assert defined_twice(type_definitions(tmp_path), {"Endpoint": {"emulator/catalog.py", "openrouter.py"}}) == {
        "Drafter": ["quality/config.py", "quality/speculative.py"]}
