"""The README's try-it-offline command on a fresh checkout (issue 44: "Trying it on your own data, offline").

A copy of the repository's tracked files, the user's own prompts file put where the README says, and the README's
own lines run as written: records come back, written under outputs/emulator/, with no network beyond 127.0.0.1
(every other address goes to a dead proxy) and no key in the environment.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eagledata.notebooks import read_results

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Trying your own file offline"


def readme_commands() -> list[str]:
    """The section's first bash block, line by line (comments cut)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(SECTION):], re.S)
    assert block, f"README.md: no bash block under {SECTION!r}"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def fresh_checkout(dest: Path) -> Path:
    """The tracked files as they are in this working tree (what a clone plus local edits would hold), and the venv
    `make setup` would have made."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def offline_env() -> dict[str, str]:
    """No key, no hub, and any address but this machine's through a proxy that is not there."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "EAGLEDATA_PROJECT_ROOT")}
    dead = "http://127.0.0.1:9"
    return {**env, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead, "http_proxy": dead,
            "https_proxy": dead, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "HF_HUB_OFFLINE": "1"}


def own_prompts() -> str:
    """A newcomer's small file: a plain question, a two-turn chat (ShareGPT) and an agent conversation with tools."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    rows = [
        {"id": "q1", "messages": [{"role": "user", "content": "Name three prime numbers."}]},
        {"id": "chat1", "conversations": [{"from": "human", "value": "Hi! What is a tokenizer?"},
                                          {"from": "gpt", "value": "It splits text into tokens."},
                                          {"from": "human", "value": "And a chat template?"}]},
        {"id": "agent1", "tools": tools, "messages": [
            {"role": "user", "content": "Umbrella in Bergen today?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Bergen\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "light rain, 9 °C"}]},
    ]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def test_the_readme_offline_command_works_on_a_fresh_checkout(tmp_path):
    commands = readme_commands()
    assert commands[-1] == ".venv/bin/papermill notebooks/generate.ipynb out.ipynb -p dataset mine -p base_url emulator"
    repo = fresh_checkout(tmp_path / "checkout")
    (repo / "data").mkdir()
    (repo / "data" / "mine.jsonl").write_text(own_prompts())  # the README's `cp /path/to/your.jsonl data/mine.jsonl`
    for command in commands:
        if command.startswith(("make setup", "mkdir -p data && cp ")):
            continue  # the venv is linked in, the file put in place above
        done = subprocess.run(["bash", "-c", command], cwd=repo, env=offline_env(), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    summary = read_results(repo / "out.ipynb")["summary"]
    assert summary["stop_reason"] == "completed" and summary["failures"] == 0
    records = [json.loads(line) for line in
               (repo / "outputs" / "emulator" / "datasets" / "mine" / "records.jsonl").read_text().splitlines()]
    turns = {(r["conversation_id"], r["turn"]) for r in records}
    assert summary["records"] == len(records) == len(turns) >= 4  # agent1's loop goes on if its call matched
    assert {("q1", 1), ("chat1", 1), ("chat1", 2), ("agent1", 1)} <= turns
    assert not (repo / "outputs" / "datasets").exists() and not (repo / "params" / "routing").exists()
    assert summary["base_url"].startswith("http://127.0.0.1:")  # the run's own emulator, gone with it
    text = "".join("".join(o.get("text", "")) for c in json.loads((repo / "out.ipynb").read_text())["cells"]
                   for o in c.get("outputs", []))
    assert "base_url emulator: an emulator at http://127.0.0.1:" in text and "outputs/emulator/datasets" in text


@pytest.mark.parametrize("notebook", ["providers"])
def test_providers_with_the_emulator_keeps_its_decision_out_of_params(tmp_path, notebook):
    """The emulated catalog's routing decision goes to outputs/emulator/params/, never to the real params/."""
    repo = fresh_checkout(tmp_path / "checkout")
    done = subprocess.run([str(repo / ".venv" / "bin" / "papermill"), f"notebooks/{notebook}.ipynb", "out.ipynb",
                           "-p", "base_url", "emulator"], cwd=repo, env=offline_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    routing = read_results(repo / "out.ipynb")["routing"]
    assert routing["file"] == "outputs/emulator/params/routing/kimi-k2.5.yaml"
    assert (repo / routing["file"]).is_file() and not (repo / "params" / "routing").exists()
    assert read_results(repo / "out.ipynb")["catalog"]["source"] == "emulator"


# -- the settings and the library, without a notebook ----------------------------------------------------------
def test_an_emulator_run_moves_only_the_default_folders():
    from eagledata.generation import BudgetConfig, GenerateConfig
    from eagledata.openrouter import ProvidersConfig

    for cls in (GenerateConfig, BudgetConfig, ProvidersConfig):
        cfg = cls(base_url="emulator")
        assert (cfg.output_dir, cfg.params_dir) == ("outputs/emulator", "outputs/emulator/params"), cls.__name__
        mine = cls(base_url="emulator", output_dir="/data/try", params_dir="/data/try/params")
        assert (mine.output_dir, mine.params_dir) == ("/data/try", "/data/try/params"), cls.__name__
        real = cls()
        assert (real.output_dir, real.params_dir) == ("outputs", "params"), cls.__name__
    assert BudgetConfig(base_url="emulator").routing_path() == Path("outputs/emulator/params/routing/kimi-k2.5.yaml")


def test_the_command_takes_the_emulator_and_its_speed():
    import argparse

    from eagledata.errors import InputError
    from eagledata.generation import GenerateConfig

    parser = argparse.ArgumentParser()
    GenerateConfig.add_arguments(parser)
    cfg = GenerateConfig.from_args(parser.parse_args(["--dataset", "mine", "--base-url", "emulator",
                                                      "--emulator-speed", "0.5"]))
    assert (cfg.base_url, cfg.emulator_speed, cfg.output_dir) == ("emulator", 0.5, "outputs/emulator")
    assert GenerateConfig().emulator_speed == 0.02
    with pytest.raises(InputError, match="emulator_speed"):
        GenerateConfig(emulator_speed=-1.0)


def test_budget_prices_from_the_emulator_catalog(tmp_path):
    import asyncio

    from eagledata.generation import BudgetConfig, plan_prices

    cfg = BudgetConfig(base_url="emulator", params_dir=str(tmp_path / "params"), output_dir=str(tmp_path))
    basis = asyncio.run(plan_prices(cfg))
    assert basis.routing_file is None and "(emulator)" in basis.note
    assert basis.prices.completion_per_m == 2.2  # the emulated catalog's cheapest eligible endpoint (Chutes)


def test_an_emulator_never_outlives_the_process_that_started_it(tmp_path):
    """A kernel killed mid-run (SIGKILL: no finally runs) leaves no emulator listening behind: it watches its parent."""
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom eagledata.emulator import run_emulator\n"
        "with run_emulator(speed=0) as emu:\n    print(emu.process.pid, flush=True)\n    time.sleep(600)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        pid = int(child.stdout.readline())
        assert _alive(pid)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 60  # a hang guard: it looks for its parent every second or so
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid), "the emulator outlived the process that started it"
    finally:
        child.kill()


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
