"""Settings defined once. A stage's settings are a dataclass whose fields carry the default and a line of
help; the notebook's parameters cell, the command-line flags and the config a notebook builds
(`Config.from_params(globals())`) all come from it, so no default is typed twice.

A field may itself be a settings dataclass (`nested`): its fields appear flat in the cell and on the
command line, and come back grouped (e.g. the assembly policy inside the hidden-states config).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import yaml

from .errors import InputError

S = TypeVar("S", bound="Settings")


def setting(default: Any, help: str, *, cli_required: bool = False, cli_many: bool = False) -> Any:
    """A field with its default and help. `cli_required`: the command line must name it (the notebook
    still shows the default as an example). `cli_many`: the flag takes one or more values (`--dataset B3 B4`),
    one value standing for itself and several for their list."""
    factory = (lambda: type(default)(default)) if isinstance(default, (list, dict)) else None
    meta = {"help": help, "cli_required": cli_required, "cli_many": cli_many}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def nested(cls: type, help: str = "") -> Any:
    """A group of settings (another settings dataclass), flattened into the parent's parameters."""
    return dataclasses.field(default_factory=cls, metadata={"help": help, "nested": True})


class Settings:
    """Mixin for settings dataclasses: from notebook globals, to a parameters cell, to and from argv.

    Every value is checked against its field's declared type when the settings are made, however they are
    made (notebook, command line, code), so a wrong type fails before any work, naming the field.
    """

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.init and not f.metadata.get("nested"):
                _check_type(f.name, getattr(self, f.name), hints[f.name])

    @classmethod
    def _leaves(cls) -> Iterator[tuple[dataclasses.Field, Any, type]]:
        """(field, default, declared type) of every flat parameter, nested groups expanded in place."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.metadata.get("nested"):
                yield from hints[f.name]._leaves()
            elif f.init:
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                yield f, default, hints[f.name]

    @classmethod
    def _build(cls: type[S], values: Mapping[str, Any]) -> S:
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.metadata.get("nested"):
                kwargs[f.name] = hints[f.name]._build(values)
            elif f.name in values:
                kwargs[f.name] = values[f.name]
        return cls(**kwargs)

    @classmethod
    def from_params(cls: type[S], namespace: Mapping[str, Any], **overrides: Any) -> S:
        """The settings a notebook's parameters cell set: `Config.from_params(globals())`.

        Names the settings do not know are ignored (the notebook's own variables), except a name papermill
        injected (the kernel's input history `In` holds its cell): that one is refused, naming the closest
        parameter (`unknown_injected_names`). A value of the wrong type fails here too, naming the field, before
        any work starts.
        """
        names = [f.name for f, _, _ in cls._leaves()]
        unknown = unknown_injected_names(namespace.get("In"), names)
        if unknown:
            raise InputError("; ".join(_unknown_parameter(name, names) for name in unknown))
        values = {f.name: namespace[f.name] for f, _, _ in cls._leaves() if f.name in namespace}
        values.update(overrides)
        return cls._build(values)

    @classmethod
    def parameters_cell(cls) -> str:
        """The source of the notebook's `parameters` cell: every setting, its default and its help.

        Each line holds exactly one `=`: papermill's parameter inspection (`papermill --help-notebook`, and the
        warning every run prints) gives up on a line with two, so a help text or default with one is refused."""
        rows = [(f"{f.name} = {default!r}", f.metadata.get("help", "")) for f, default, _ in cls._leaves()]
        width = max(len(code) for code, _ in rows) + 2
        lines = [f"{code:<{width}}# {help}" if help else code for code, help in rows]
        for line in lines:
            if line.count("=") != 1:
                raise ValueError(f"{cls.__name__}: papermill cannot parse a parameters line with more than one "
                                 f"'=' (in the help or the default): {line!r}")
        return "\n".join(lines)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One `--flag-name VALUE` per setting; VALUE is YAML (`20`, `[2, 3, 5]`, `true`) or `none`."""
        for f, default, tp in cls._leaves():
            required = bool(f.metadata.get("cli_required"))
            many: dict[str, Any] = {"nargs": "+", "action": _OneOrList} if f.metadata.get("cli_many") else {}
            parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, metavar=_metavar(tp),
                                type=_cli_parser(f.name, tp), required=required,
                                default=argparse.SUPPRESS, **many,
                                help=(f.metadata.get("help", "") + ("" if required else f" (default: {default!r})"))
                .replace("%", "%%"))  # argparse formats help with %

    @classmethod
    def from_args(cls: type[S], args: argparse.Namespace) -> S:
        return cls.from_params(vars(args))


INJECTED_CELL_COMMENT = "# Parameters"  # the first line of the cell papermill injects (tagged injected-parameters)


def unknown_injected_names(history: Any, parameters: Sequence[str]) -> list[str]:
    """The names the latest papermill-injected cell in `history` assigns that are not in `parameters`, in order.

    Why: papermill injects `-p`/`-y` names as plain assignments after the parameters cell and, for a name the
    notebook does not declare, only logs "Passed unknown parameter"; the settings never read it, so a typo
    (`-p max_spend 0.0001` for `max_spend_usd`) would silently run with the default (no spend cap). The kernel's
    input history (`In`: every cell as run) keeps the injected cell, which starts with papermill's
    `# Parameters` comment; the latest such cell is the injection in force (a report's injected cell edited and
    run again in JupyterLab). Without one (JupyterLab, the command line, code), nothing is refused: the
    notebook's own variables are never taken for parameters. `PAPERMILL_*` names (`--inject-paths`) are
    papermill's own.
    """
    if not isinstance(history, (list, tuple)):
        return []
    injected = [cell for cell in history
                if isinstance(cell, str) and cell.split("\n", 1)[0].strip() == INJECTED_CELL_COMMENT]
    if not injected:
        return []
    try:
        statements = ast.parse(injected[-1]).body
    except SyntaxError:
        return []
    targets = [target for statement in statements if isinstance(statement, ast.Assign) for target in statement.targets]
    targets += [s.target for s in statements if isinstance(s, (ast.AnnAssign, ast.AugAssign))]
    assigned = dict.fromkeys(node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name))
    return [name for name in assigned if name not in parameters and not name.startswith("PAPERMILL_")]


def _unknown_parameter(name: str, parameters: Sequence[str]) -> str:
    """`unknown parameter 'max_spend' (did you mean 'max_spend_usd'?)`, or the list of parameters if none is close."""
    close = difflib.get_close_matches(name, parameters, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"the parameters are: {', '.join(parameters)}"
    return f"unknown parameter {name!r} ({hint})"


class _OneOrList(argparse.Action):
    """`--flag A` gives "A", `--flag A B` gives ["A", "B"] (and `--flag "[A, B]"` the list as YAML)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values[0] if len(values) == 1 else list(values))


def _union_args(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _check_type(name: str, value: Any, tp: Any) -> None:
    for option in _union_args(tp):
        origin = typing.get_origin(option) or option
        if option is type(None) and value is None:
            return
        if origin is Literal and value in typing.get_args(option):
            return
        if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if origin in (str, bool, list, dict, tuple) and isinstance(value, origin):
            return
        if origin is typing.Any:
            return
    hint = ""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{") and any(
            typing.get_origin(o) in (list, dict) for o in _union_args(tp)):
        # papermill's -p passes a value as a string; its -y reads YAML
        hint = f' (papermill -p passes it as text: use -y "{name}: {value}")'
    raise InputError(f"must be {_metavar(tp)}, got {value!r}{hint}", field=name)


def _metavar(tp: Any) -> str:
    names = []
    for option in _union_args(tp):
        if typing.get_origin(option) is Literal:
            names.append("|".join(map(str, typing.get_args(option))))
        elif option is type(None):
            names.append("none")
        else:
            names.append(getattr(typing.get_origin(option) or option, "__name__", str(option)))
    return " or ".join(names)


def _cli_parser(name: str, tp: Any):
    """Strings stay strings (a dataset called `123` is not a number); everything else is read as YAML."""
    takes_str = any(o is str or typing.get_origin(o) is Literal for o in _union_args(tp))

    def parse(text: str) -> Any:
        value = None if text.strip().lower() in ("", "none", "null") else yaml.safe_load(text)
        if takes_str and value is not None and not isinstance(value, (list, dict)):
            value = text
        try:
            _check_type(name, value, tp)
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value

    parse.__name__ = _metavar(tp)
    return parse
