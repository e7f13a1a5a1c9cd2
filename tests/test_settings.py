"""Settings defined once: the parameters cell, the command-line flags and the config all come from the fields."""
import argparse

import pytest

from eagledata.errors import InputError
from eagledata.generation import GenerateConfig
from eagledata.training import AssemblyPolicy, ExtractionJob, ExtractOptions, HiddenStatesConfig


def all_settings():
    from eagledata.notebooks import parameter_settings

    return list(parameter_settings().values())


@pytest.mark.parametrize("cls", all_settings(), ids=lambda c: c.__name__)
def test_parameters_cell_gives_back_the_defaults(cls):
    namespace: dict = {}
    exec(cls.parameters_cell(), namespace)
    assert cls.from_params(namespace) == cls()


def test_from_params_takes_known_names_and_ignores_the_notebooks_own():
    cfg = GenerateConfig.from_params({"dataset": "B4", "max_spend_usd": 20, "display": print, "Path": object})
    assert (cfg.dataset, cfg.max_spend_usd, cfg.concurrency) == ("B4", 20, 2000)


def test_nested_settings_come_back_grouped():
    cfg = HiddenStatesConfig.from_params({"name": "x", "storage": "fp8", "max_length": 4096, "layers": [2, 3, 5]})
    assert cfg.job == ExtractionJob(name="x", options=ExtractOptions(storage="fp8", layers=[2, 3, 5]))
    assert cfg.assembly == AssemblyPolicy(max_length=4096)


@pytest.mark.parametrize("name,value", [("concurrency", "2000"), ("concurrency", True), ("storage", "int3"),
                                        ("max_spend_usd", "20"), ("layers", "2,3,5")])
def test_a_wrong_type_names_the_field(name, value):
    cls = HiddenStatesConfig if name in ("storage", "layers") else GenerateConfig
    with pytest.raises(InputError, match=f"field '{name}'"):
        cls.from_params({name: value})


def test_settings_made_in_code_are_checked_too():
    with pytest.raises(InputError, match="field 'concurrency'"):
        GenerateConfig(concurrency=0)
    with pytest.raises(InputError, match="field 'backend'"):
        GenerateConfig(backend="vllm")
    with pytest.raises(InputError, match="field 'final'"):
        ExtractOptions(final="post-norm")


def parse(cls, *argv):
    parser = argparse.ArgumentParser()
    cls.add_arguments(parser)
    return cls.from_args(parser.parse_args(argv))


def test_command_line_flags():
    cfg = parse(GenerateConfig, "--dataset", "123", "--max-spend-usd", "20", "--limit", "none",
                "--temperature", "0.6", "--backend", "local", "--progress", "false")
    assert (cfg.dataset, cfg.max_spend_usd, cfg.limit, cfg.temperature, cfg.backend, cfg.progress) == \
        ("123", 20, None, 0.6, "local", False)
    assert cfg.reserve_usd == GenerateConfig().reserve_usd  # unset flags keep the one default
    job = parse(ExtractionJob, "--name", "n", "--model", "m", "--layers", "[2, 3, 5]", "--storage", "fp8")
    assert job.options == ExtractOptions(layers=[2, 3, 5], storage="fp8")
    job = parse(ExtractionJob, "--name", "n", "--model", "m", "--backend", "vllm", "--server", "http://h:8000/v1",
                "--server-concurrency", "64")
    assert (job.backend, job.vllm.server, job.vllm.server_concurrency) == ("vllm", "http://h:8000/v1", 64)


def test_command_line_rejects_bad_values_and_missing_required(capsys):
    with pytest.raises(SystemExit):
        parse(GenerateConfig, "--dataset", "B1", "--concurrency", "many")
    assert "concurrency" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(GenerateConfig)  # --dataset is required on the command line
    assert "--dataset" in capsys.readouterr().err


# Same name, another meaning: hidden_states.ipynb's `model` is the checkpoint (a hub id or directory) the states
# are computed with, not the API model id of providers/budget/generate; its `backend` says what computes them
# (transformers here, or a vLLM server), not which API generate talks to.
OTHER_MEANING = {("HiddenStatesConfig", "model"), ("HiddenStatesConfig", "backend")}


def test_one_default_per_setting_across_notebooks_and_commands():
    """A name shared by several notebooks or commands has one default everywhere (eagledata.defaults), so e.g.
    the reserve cannot be 1.0 in the command and 5.0 in a notebook."""
    from eagledata.defaults import SHARED

    seen: dict[str, dict[str, object]] = {}
    for cls in all_settings():
        for f, default, _ in cls._leaves():
            if (cls.__name__, f.name) not in OTHER_MEANING:
                seen.setdefault(f.name, {})[cls.__name__] = default
    shared_names = {name for name, where in seen.items() if len(where) > 1}
    assert shared_names <= set(SHARED), f"declare these with defaults.shared(): {shared_names - set(SHARED)}"
    for name in shared_names:
        assert set(map(repr, seen[name].values())) == {repr(SHARED[name][0])}, (name, seen[name])
    assert {"reserve_usd", "tokenizer", "max_tokens", "concurrency", "model", "output_dir"} <= shared_names


def test_command_flags_default_to_the_notebook_parameters():
    from eagledata.generate import main  # noqa: F401  (the command builds its parser from GenerateConfig)

    parser = argparse.ArgumentParser()
    GenerateConfig.add_arguments(parser)
    cfg = GenerateConfig.from_args(parser.parse_args(["--dataset", "B4"]))
    namespace: dict = {}
    exec(GenerateConfig.parameters_cell(), namespace)
    assert cfg == GenerateConfig.from_params({**namespace, "dataset": "B4"})
    assert cfg.reserve_usd == 5.0


def test_every_command_help_renders(capsys):
    """argparse formats help texts with %: a setting's help that says "4 %" must not break --help."""
    from eagledata import generate, hidden_states

    for main in (generate.main, hidden_states.main):
        with pytest.raises(SystemExit) as exit_:
            main(["--help"])
        assert exit_.value.code == 0
    assert "~4 % of a K2.5 forward" in " ".join(capsys.readouterr().out.split())
