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


def test_a_list_or_mapping_passed_as_a_string_says_to_use_papermills_yaml_flag():
    """papermill's -p passes `{a: 1}` or `[2, 3]` as a string: the error says to use -y."""
    from eagledata.openrouter import ProvidersConfig

    with pytest.raises(InputError, match=r"^field 'stream_cancellation': must be dict or none, got '\{A: true\}' "
                                         r'\(papermill -p passes it as text: '
                                         r'use -y "stream_cancellation: \{A: true\}"\)$'):
        ProvidersConfig.from_params({"stream_cancellation": "{A: true}"})
    with pytest.raises(InputError, match=r'-y "layers: \[2, 3\]"'):
        HiddenStatesConfig.from_params({"layers": "[2, 3]"})
    with pytest.raises(InputError, match=r"^field 'stream_cancellation': must be dict or none, got 'A'$"):  # no hint
        ProvidersConfig.from_params({"stream_cancellation": "A"})
    with pytest.raises(InputError, match=r"^field 'stream_cancellation': must be dict or none, got ''$"):
        ProvidersConfig.from_params({"stream_cancellation": ""})


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


# -- a name papermill injected must be a parameter -------------------------------------------------------------
def kernel_globals(*cells: str, **values) -> dict:
    """A notebook kernel's globals as `from_params(globals())` sees them: IPython's own names, the input history
    `In` (every cell run, as run; papermill's injected cell among them) and the values the cells left."""
    return {"In": ["", *cells], "Out": {}, "_ih": ["", *cells], "_oh": {}, "_dh": [], "_": "", "__": "", "___": "",
            "_i1": cells[0] if cells else "", "get_ipython": object, "exit": object, "quit": object, "open": open,
            "__name__": "__main__", "__builtins__": {}, **values}


def test_an_injected_typo_is_refused_naming_the_closest_parameter():
    """`papermill generate.ipynb out.ipynb -p max_spend 0.0001`: the cap's real name is max_spend_usd, so the run
    would have had no cap. The settings refuse it before any work, naming the parameter meant."""
    namespace = kernel_globals(GenerateConfig.parameters_cell(), "# Parameters\nmax_spend = 0.0001\n",
                               max_spend=0.0001)
    with pytest.raises(InputError) as e:
        GenerateConfig.from_params(namespace)
    assert str(e.value) == "unknown parameter 'max_spend' (did you mean 'max_spend_usd'?)"
    with pytest.raises(InputError, match=r"^unknown parameter 'Concurency' \(did you mean 'concurrency'\?\); "
                                         r"unknown parameter 'dataset_file' \(did you mean 'datasets_file'\?\)$"):
        GenerateConfig.from_params(kernel_globals("# Parameters\ndataset = 'B4'\nConcurency = 8\n"
                                                  "dataset_file = 'x.yaml'\n"))


def test_an_injected_name_like_no_parameter_lists_them_all():
    from eagledata.text import TokenizerReportConfig

    with pytest.raises(InputError) as e:
        TokenizerReportConfig.from_params(kernel_globals("# Parameters\nbudget_usd = 20\n"))
    assert str(e.value) == ("unknown parameter 'budget_usd' (the parameters are: tokenizer, records, truth, limit, "
                            "fail_on_mismatch)")


def test_a_valid_injection_passes_and_nothing_else_in_the_kernel_is_taken_for_a_parameter():
    """Only the names papermill's injected cell assigns are checked: not imports, IPython's names (In, Out, _, __,
    _i1, get_ipython, exit, quit), the notebook's own variables, nor papermill's own PAPERMILL_*_PATH. `-y` YAML
    lists and dicts come as one literal, or over several lines when papermill formats them with black."""
    injected = ("# Parameters\ndatasets = [\n    'B1',\n    'B2',\n]\nname = 'x'\nlayers = [2, 3, 5]\n"
                "max_length = 4096\nPAPERMILL_INPUT_PATH = 'notebooks/hidden_states.ipynb'\n"
                "PAPERMILL_OUTPUT_PATH = 'out.ipynb'\n")
    namespace = kernel_globals(HiddenStatesConfig.parameters_cell(), injected,
                               "import pandas as pd\nfrom eagledata.training import assemble\ncfg = None\n",
                               datasets=["B1", "B2"], name="x", layers=[2, 3, 5], max_length=4096,
                               PAPERMILL_INPUT_PATH="notebooks/hidden_states.ipynb", PAPERMILL_OUTPUT_PATH="out.ipynb",
                               pd=object, assemble=print, cfg=None, tok=None)
    cfg = HiddenStatesConfig.from_params(namespace)
    assert (cfg.job.name, cfg.job.options.layers, cfg.assembly.max_length) == ("x", [2, 3, 5], 4096)
    routing = "# Parameters\nprice_mix = {'Chutes': 0.5, 'Novita': 0.5}\ndatasets_file = 'params/datasets.yaml'\n"
    from eagledata.generation import BudgetConfig

    assert BudgetConfig.from_params(kernel_globals(routing, price_mix={"Chutes": 0.5, "Novita": 0.5})).price_mix \
        == {"Chutes": 0.5, "Novita": 0.5}


def test_without_an_injection_nothing_is_refused():
    """JupyterLab, no papermill: the cells run in any order, the settings cell again and again; the notebook's
    variables, imports and a cell the user typed are never taken for injected parameters."""
    cells = [GenerateConfig.parameters_cell(), "import pandas as pd\ncfg = GenerateConfig.from_params(globals())",
             "summary = {'stop_reason': 'completed'}\nmax_spend = 1.0  # a typo in a cell of one's own",
             "import pandas as pd\ncfg = GenerateConfig.from_params(globals())"]
    assert GenerateConfig.from_params(kernel_globals(*cells, summary={}, pd=object, max_spend=1.0)) == GenerateConfig()
    assert GenerateConfig.from_params({"dataset": "B4", "In": "not a history"}).dataset == "B4"


def test_the_latest_injection_is_the_one_checked():
    """A report's injected cell edited and run again in JupyterLab: the fixed cell is the injection in force."""
    bad, fixed = "# Parameters\nmax_spend = 0.1\n", "# Parameters\nmax_spend_usd = 0.1\n"
    assert GenerateConfig.from_params(kernel_globals(bad, fixed, max_spend_usd=0.1)).max_spend_usd == 0.1
    with pytest.raises(InputError, match="'max_spend'"):
        GenerateConfig.from_params(kernel_globals(fixed, bad, max_spend_usd=0.1))


def test_in_a_real_ipython_shell(tmp_path, monkeypatch):
    """The same checks in IPython itself (its history and names, not a stand-in): cells run as a kernel runs them."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell(config=config)
    try:
        def run(source: str):
            return shell.run_cell(source, store_history=True)

        settings = "from eagledata.generation import GenerateConfig\ncfg = GenerateConfig.from_params(globals())"
        assert run(GenerateConfig.parameters_cell()).success
        for _ in range(2):  # Run All, then the settings cell again: no injection, nothing refused
            assert run(settings).success and run("import os\nx = 1\n_ + 1 if False else None").success
        assert run("# Parameters\nmax_spend_usd = 0.0001\ndataset = ['demo-a', 'demo-b']\n").success
        assert run(settings).success and shell.user_ns["cfg"].max_spend_usd == 0.0001
        assert run("# Parameters\nmax_spend = 0.0001\n").success
        result = run(settings)
        assert isinstance(result.error_in_exec, InputError)
        assert str(result.error_in_exec) == "unknown parameter 'max_spend' (did you mean 'max_spend_usd'?)"
    finally:
        shell.history_manager.end_session()
        InteractiveShell.clear_instance()
