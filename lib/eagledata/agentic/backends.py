"""The code behind an environment, built in the process that runs it (the worker, or the caller for an in-process
environment): BFCL's multi-turn backend classes loaded from the wheel's extracted sources, or a user's class.

BFCL, as its executor does (`multi_turn_utils.execute_multi_turn_func_call`): each involved class instantiated with
no arguments, then, but for the stateless MathAPI, `_load_scenario(deepcopy(initial_config[class]),
long_context=False)`. Their randomness is seeded from the scenario (`random.Random(random_seed)`), so a fresh build
replaying the same calls gives the same results. One wall-clock read would not: TravelAPI's `verify_traveler`
computes ages from `datetime.today()`; it is pinned to `BFCL_TODAY` here, so a replay on another day agrees.

A user's class (`package.module:Class`, or `path/to/file.py:Class`): constructed as `Class(initial_config)` with a
deep copy of the task's `initial_config`; its public methods are the functions (see agentic/README.md).
Stdlib only: this module runs in the worker."""
from __future__ import annotations

import copy
import datetime
import hashlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dispatch import BuildError, CallDispatcher, bind_functions

BFCL = "bfcl"  # a task's `environment` naming BFCL's backends
BFCL_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
BFCL_MODULES = {  # class -> module in BFCL_PACKAGE (bfcl_eval/constants/executable_backend_config.py)
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
BFCL_STATELESS = frozenset({"MathAPI"})  # no scenario to load (STATELESS_CLASSES)
BFCL_TODAY = datetime.date(2026, 3, 23)  # the wheel's release: the date TravelAPI computes ages on


@dataclass(frozen=True)
class EnvironmentSpec:
    """What builds one environment, as plain JSON (it crosses into the worker)."""

    task_id: str
    backend: str  # BFCL, or a user's class: "package.module:Class" or "/absolute/file.py:Class"
    initial_config: Mapping[str, Any]
    involved_classes: Sequence[str]
    tools: Sequence[Mapping[str, Any]]  # what the model is offered: the functions dispatched
    code_path: Sequence[str] = field(default_factory=list)  # where the code is imported from (prepended to sys.path)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "backend": self.backend, "initial_config": self.initial_config,
                "involved_classes": list(self.involved_classes), "tools": list(self.tools),
                "code_path": list(self.code_path)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvironmentSpec:
        return cls(d["task_id"], d["backend"], d["initial_config"], d["involved_classes"], d["tools"],
                   d.get("code_path", []))


def _use_path(code_path: Sequence[str]) -> None:
    for entry in reversed(code_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _pinned_datetime(today: datetime.date) -> type[datetime.datetime]:
    class PinnedDatetime(datetime.datetime):
        """`datetime` whose today() and now() are one fixed day (deterministic replays)."""

        @classmethod
        def today(cls) -> PinnedDatetime:
            return cls(today.year, today.month, today.day)

        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> PinnedDatetime:
            return cls(today.year, today.month, today.day, tzinfo=tz)

    return PinnedDatetime


def bfcl_class(name: str, code_path: Sequence[str]) -> type:
    """BFCL's backend class `name`, imported from the extracted sources in `code_path` (never an installed
    bfcl_eval: a module found elsewhere is refused)."""
    if name not in BFCL_MODULES:
        raise BuildError(f"involved class '{name}' is not one of BFCL's multi-turn backends "
                         f"({', '.join(BFCL_MODULES)})")
    _use_path(code_path)
    try:
        module = importlib.import_module(f"{BFCL_PACKAGE}.{BFCL_MODULES[name]}")
    except ImportError as e:
        raise BuildError(f"cannot import BFCL's {name} from {list(code_path)}: {e}") from None
    where = Path(module.__file__ or "").resolve()
    if not any(where.is_relative_to(Path(p).resolve()) for p in code_path):
        raise BuildError(f"BFCL's {name} was imported from {where}, not from the wheel's sources {list(code_path)}")
    if name == "TravelAPI" and getattr(module, "datetime", None) is datetime.datetime:
        module.datetime = _pinned_datetime(BFCL_TODAY)  # type: ignore[attr-defined]
    cls = getattr(module, name)
    assert isinstance(cls, type)
    return cls


def bfcl_instances(spec: EnvironmentSpec) -> list[object]:
    """The task's BFCL instances, each loaded with its part of the initial config, as BFCL's executor loads them."""
    instances = []
    for name in spec.involved_classes:
        instance = bfcl_class(name, spec.code_path)()
        if name not in BFCL_STATELESS:
            try:
                instance._load_scenario(copy.deepcopy(dict(spec.initial_config).get(name, {})),
                                        long_context=False)
            except Exception as e:
                raise BuildError(f"{name}._load_scenario failed on initial_config['{name}']: "
                                 f"{type(e).__name__}: {e}") from None
        instances.append(instance)
    return instances


_FILE_MODULES = threading.Lock()


def _file_module(target: str, where: str) -> Any:
    """A user's file loaded once as a module: under a lock, since the executor's threads open environments at once and
    a module is in `sys.modules` before its body has run (another thread would find it without its class); one
    whose body raised is taken out again."""
    module_name = "eagledata_user_env_" + hashlib.sha1(where.encode()).hexdigest()[:12]
    with _FILE_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(module_name, where)
            if loader_spec is None or loader_spec.loader is None:
                raise BuildError(f"environment '{target}': cannot load {where}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
        return module


def user_class(target: str, code_path: Sequence[str]) -> type:
    """A user's environment class from `package.module:Class` or `/path/file.py:Class`."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise BuildError(f"environment '{target}' is not 'package.module:Class' or 'path/to/file.py:Class'")
    _use_path(code_path)
    try:
        if where.endswith(".py"):
            module = _file_module(target, where)
        else:
            module = importlib.import_module(where)
    except BuildError:
        raise
    except Exception as e:  # the user's module failing to import, whatever it raised
        raise BuildError(f"environment '{target}': importing {where} failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise BuildError(f"environment '{target}': {where} has no class {name}")
    return cls


def build_instances(spec: EnvironmentSpec) -> list[object]:
    """The objects whose public methods the task's tools call."""
    if spec.backend == BFCL:
        return bfcl_instances(spec)
    cls = user_class(spec.backend, spec.code_path)
    try:
        return [cls(copy.deepcopy(dict(spec.initial_config)))]
    except Exception as e:
        raise BuildError(f"environment '{spec.backend}': {cls.__name__}(initial_config) failed: "
                         f"{type(e).__name__}: {e}") from None


def build_dispatcher(spec: EnvironmentSpec) -> CallDispatcher:
    """The environment of `spec`, fresh, ready for its first call; a `BuildError` names what failed."""
    return CallDispatcher(bind_functions(build_instances(spec), spec.tools))
