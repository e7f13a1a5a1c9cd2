"""A mistake in a run-wide setting is the run's, never its prompts' (issue 44, bug 1): it stops the run before (or
at) its first requests, names the setting, and writes nothing to failures.jsonl, so a rerun with the setting fixed
sends every prompt. Prompts failed for good are sent again on purpose with `retry_failed`; a run whose prompts all
failed is not `completed`. Against the emulator, as a user runs it."""
import json
from pathlib import Path

import pytest

from eagledata.emulator import run_emulator
from eagledata.errors import InputError
from eagledata.generation import GenerateConfig, generate
from eagledata.openrouter import PrecisionPolicy, decide, fetch_catalog
from tests.generation.test_generate import config as generate_config
from tests.generation.test_generate import dataset_dir

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.5, "content_median": 20, "content_sigma": 0.5, "max_total": 400}
BASE = {"speed": 0, "content": SMALL, "generation_delay": 0.1, "balance": 1000}
# What a provider may answer for a setting the listing cannot show (the routing's preflight has nothing to check).
REJECT = {"code": 400, "message": "Provider returned error: temperature must be in [0, 1] for this deployment"}


@pytest.fixture(scope="module")
def emu(tokenizer_dir):
    with run_emulator(BASE) as handle:
        yield handle
        assert "Traceback" not in handle.log(), handle.log()[-3000:]


def reset(emu, **overrides):
    emu.reset({**BASE, **overrides})
    return emu


def make_dataset(tmp_path: Path, n: int, name: str = "D", *, long_every: int = 0) -> Path:
    """`n` one-turn prompts `<name>-00000`…; every `long_every`-th one ~600 tokens long."""
    prompts = tmp_path / f"{name}.jsonl"
    with prompts.open("w") as f:
        for i in range(n):
            text = f"Question {i}: what is {i} squared?"
            if long_every and i % long_every == 0:
                text += " why" * 600
            f.write(json.dumps({"id": f"{name}-{i:05d}", "messages": [{"role": "user", "content": text}]}) + "\n")
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"{name}:\n  prompts: {prompts}\n")
    return datasets


def config(emu, tmp_path, datasets, **kw) -> GenerateConfig:
    """test_generate's run settings, at 8 in flight."""
    return generate_config(emu, tmp_path, datasets, **{"concurrency": 8, **kw})


folder = dataset_dir


def failures(tmp_path) -> list[dict]:
    path = folder(tmp_path) / "failures.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def records(tmp_path) -> list[dict]:
    path = folder(tmp_path) / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def routing_file(emu, tmp_path, edit) -> Path:
    """The routing decision providers.ipynb writes for the emulator's catalog, its text then edited by hand."""
    catalog = fetch_catalog(emu.base_url, "moonshotai/kimi-k2.5")
    path = decide(catalog.model, catalog.normalized(), PrecisionPolicy.for_model(catalog.model)).save(
        tmp_path / "params")
    path.write_text(edit(path.read_text()))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# -- the five run-wide mistakes: refused before the first request -------------------------------------------------
def test_max_tokens_beyond_every_endpoints_context_is_refused_before_any_request(emu, tmp_path):
    reset(emu)
    datasets = make_dataset(tmp_path, 30)
    with pytest.raises(InputError, match=r"field 'max_tokens': 300000 .*262,144"):
        generate(config(emu, tmp_path, datasets, max_tokens=300_000))
    assert emu.stats()["requests"] == 0 and not failures(tmp_path)


def test_max_tokens_beyond_every_endpoints_max_completion_tokens_is_refused(emu, tmp_path):
    """OpenRouter routes a request only to endpoints that can answer `max_tokens`: above every endpoint's
    `max_completion_tokens` (65,536 at most in the emulator's listing) none would take it."""
    reset(emu)
    datasets = make_dataset(tmp_path, 5)
    with pytest.raises(InputError, match=r"field 'max_tokens': 100000 .*max_completion_tokens.*65,536"):
        generate(config(emu, tmp_path, datasets, max_tokens=100_000))
    assert emu.stats()["requests"] == 0 and not failures(tmp_path)


@pytest.mark.parametrize("value", [-1.0, 2.5])
def test_temperature_out_of_range_is_refused_by_the_settings(value):
    with pytest.raises(InputError, match=r"field 'temperature': must be within \[0, 2\]"):
        GenerateConfig(dataset="D", temperature=value)


def test_temperature_out_of_range_is_a_usage_error_of_the_command(capsys):
    from eagledata.generate import main

    with pytest.raises(SystemExit) as stop:
        main(["--dataset", "D", "--temperature", "-1"])
    assert stop.value.code == 2 and "field 'temperature': must be within [0, 2]" in capsys.readouterr().err


@pytest.mark.parametrize("edit, field, at, says", [
    (lambda t: t.replace("provider:\n", "provider:\n  only:\n  - nosuch\n", 1), "provider.only", "- nosuch",
     r"'nosuch' is no endpoint of moonshotai/kimi-k2\.5 .*DeepInfra"),
    (lambda t: t.replace("provider:\n", "provider:\n  ignor:\n  - fireworks\n", 1), "provider.ignor", "ignor:",
     r"not a field of OpenRouter's provider object; did you mean 'ignore'\?"),
    (lambda t: t.replace("  sort: price\n", "  sort: cheapest\n", 1), "provider.sort", "sort: cheapest",
     r"'cheapest' is not one of price, throughput, latency"),
], ids=["only-nosuch", "ignor", "sort-cheapest"])
def test_a_routing_file_mistake_is_refused_before_any_request(emu, tmp_path, edit, field, at, says):
    reset(emu)
    path = routing_file(emu, tmp_path, edit)
    datasets = make_dataset(tmp_path, 30)
    with pytest.raises(InputError, match=rf"{path}:{line_of(path, at)} field '{field}': {says}"):
        generate(config(emu, tmp_path, datasets))
    assert emu.stats()["requests"] == 0 and not failures(tmp_path)


# -- a setting only the service can judge: the same 400 for many prompts stops the run ----------------------------
def test_the_same_400_for_many_prompts_stops_the_run_and_a_rerun_sends_them(emu, tmp_path):
    reset(emu, reject=REJECT)
    datasets = make_dataset(tmp_path, 60)
    with pytest.raises(RuntimeError, match=r"request_rejected: temperature: 400"):
        generate(config(emu, tmp_path, datasets))
    summary = json.loads((folder(tmp_path) / "summary.json").read_text())
    reason = summary["stop_reason"]
    assert reason.startswith("request_rejected: temperature: 400 ") and REJECT["message"] in reason, reason
    assert summary["fatal_error"]["status"] == 400 and summary["fatal_error"]["message"] == REJECT["message"]
    assert not failures(tmp_path) and summary["failures"] == 0 and summary["remaining"] == 60
    assert emu.stats()["requests"] < 60  # stopped at its first requests, not after every prompt
    reset(emu)  # the setting fixed (here: the provider takes it again), the same run goes on
    again = generate(config(emu, tmp_path, datasets))
    assert again["stop_reason"] == "completed" and again["records"] == 60 and not failures(tmp_path)


def test_prompts_that_fail_among_answers_still_fail_for_good(emu, tmp_path):
    """A prompt's own fault (too long for every endpoint) is the prompt's: written to failures.jsonl, while the
    others are answered, and the run completes."""
    from eagledata.emulator.catalog import default_endpoints

    reset(emu, seed=5, endpoints=[{"provider": e.provider, "context_length": 1000} for e in default_endpoints()])
    datasets = make_dataset(tmp_path, 40, long_every=4)
    summary = generate(config(emu, tmp_path, datasets))
    assert summary["stop_reason"] == "completed"
    assert {f["id"] for f in failures(tmp_path)} == {f"D-{i:05d}" for i in range(0, 40, 4)}
    assert all(f["error"]["class"] == "bad_request" for f in failures(tmp_path))
    assert len(records(tmp_path)) == 30


# -- everything failed: not completed; failures sent again on purpose ---------------------------------------------
def test_a_run_whose_prompts_all_failed_is_not_completed_and_retry_failed_sends_them_again(emu, tmp_path):
    from eagledata.emulator.catalog import default_endpoints

    reset(emu, endpoints=[{"provider": e.provider, "context_length": 1000} for e in default_endpoints()])
    datasets = make_dataset(tmp_path, 4, long_every=1)  # every prompt too long: each one's own fault
    summary = generate(config(emu, tmp_path, datasets))
    assert summary["stop_reason"] == "all_failed" and summary["records"] == 0 and summary["failures"] == 4
    again = generate(config(emu, tmp_path, datasets))  # nothing to send: still not completed
    assert again["stop_reason"] == "all_failed" and again["run"]["failed"] == 0
    reset(emu)  # the endpoints' context grown back: the same prompts fit now
    sent = emu.stats()["requests"]
    retried = generate(config(emu, tmp_path, datasets, retry_failed=True))
    assert retried["stop_reason"] == "completed" and retried["records"] == 4 and retried["failures"] == 0
    assert emu.stats()["requests"] - sent == 4 and not failures(tmp_path) and len(records(tmp_path)) == 4
    kept = folder(tmp_path) / "failures.retried.jsonl"  # what failed before is kept, apart
    assert sorted(json.loads(line)["id"] for line in kept.read_text().splitlines()) == \
        [f"D-{i:05d}" for i in range(4)]


def test_the_report_of_an_all_failed_run_does_not_say_100_percent(emu, tmp_path):
    from eagledata.emulator.catalog import default_endpoints
    from eagledata.generation.report.run_report import RunHealth

    reset(emu, endpoints=[{"provider": e.provider, "context_length": 1000} for e in default_endpoints()])
    datasets = make_dataset(tmp_path, 4, long_every=1)
    summary = generate(config(emu, tmp_path, datasets))
    assert [d.share for d in RunHealth.of_summary(summary).datasets] == [0.0]
