"""Several datasets in one run against the emulator: one pool, one budget, one spender per account."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagledata.aio import run_sync
from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, generate, run_generation
from eagledata.generation.money.spender import AccountBusy, SpenderLock
from eagledata.generation.policy import StopReason
from eagledata.generation.realtime.pacing import MAX_OVERSHOOT
from eagledata.generation.report.progress import TIMELINE_COLUMNS
from eagledata.notebooks import read_results
from eagledata.openrouter import Kind, Outcome, PrecisionPolicy, complete, decide, fetch_catalog, resolve_api_key
from eagledata.records import load_records
from tests.helpers import ROOT
from tests.helpers.kills import kill_while_writing
from tests.helpers.records import answers_and_pauses

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.6, "content_median": 20, "content_sigma": 0.5, "max_total": 400}
BASE = {"speed": 0.5, "content": SMALL, "generation_delay": 0.1, "balance": 1000}


@pytest.fixture(scope="module")
def emu(tokenizer_dir):
    with run_emulator(BASE) as handle:
        yield handle
        assert "Traceback" not in handle.log(), handle.log()[-3000:]


def reset(emu, **overrides):
    emu.reset({**BASE, **overrides})
    return emu


def make_datasets(tmp_path: Path, sizes: dict[str, int], targets: dict[str, int] | None = None) -> Path:
    lines = []
    for name, n in sizes.items():
        prompts = tmp_path / f"{name}.jsonl"
        with prompts.open("w") as f:
            for i in range(n):
                msgs = [{"role": "user", "content": f"{name} question {i}: why is {i} + 1 larger than {i}?"}]
                f.write(json.dumps({"id": f"{name}-{i:05d}", "messages": msgs}) + "\n")
        lines.append(f"{name}:\n  prompts: {prompts}\n")
        if targets and name in targets:
            lines.append(f"  target_output_tokens: {targets[name]}\n")
    (tmp_path / "datasets.yaml").write_text("".join(lines))
    return tmp_path / "datasets.yaml"


def config(emu, tmp_path, datasets, **kw) -> GenerateConfig:
    base = dict(dataset=["A", "B", "C"], datasets_file=str(datasets), base_url=emu.base_url,
                output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), concurrency=60, max_tokens=400,
                progress=False, retry_base_s=0.01, retry_cap_s=0.2, reserve_usd=0.0, account_refresh_s=0.5,
                account_lag_s=0.1)
    base.update(kw)
    return GenerateConfig(**base)


def folder(tmp_path, name) -> Path:
    return tmp_path / "out" / "datasets" / name


def exactly_once(tmp_path, name: str, n: int) -> tuple[list, list]:
    records, paused = answers_and_pauses(load_records(folder(tmp_path, name) / "records.jsonl"))
    failures_file = folder(tmp_path, name) / "failures.jsonl"
    failures = [json.loads(x) for x in failures_file.read_text().splitlines()] if failures_file.exists() else []
    ids = [r.id for r in records] + [f["id"] for f in failures]
    assert len(ids) == len(set(ids)), f"{name}: a prompt finished twice"
    assert set(ids) <= {f"{name}-{i:05d}" for i in range(n)}
    assert {r.id.rpartition("~")[0] for r in paused} <= {f"{name}-{i:05d}" for i in range(n)}
    assert all(r.dataset == name for r in records + paused)
    return records, failures


def test_one_run_meets_every_target_without_passing_it(emu, tmp_path):
    """Three datasets with targets of three sizes share 60 slots: each ends at its target, at most 5 % over;
    each keeps its own files and summary; the run's summary holds them all."""
    reset(emu, seed=31)
    sizes, targets = {"A": 2000, "B": 2000, "C": 2000}, {"A": 6000, "B": 12000, "C": 18000}
    datasets = make_datasets(tmp_path, sizes, targets)
    # JSON answers: the run's last account reading must hold every charge (a stream the run cuts at a target is
    # billed as far as it got when the server sees it closed, a moment after the run may have read the account)
    summary = generate(config(emu, tmp_path, datasets, stream=False))
    assert summary["stop_reason"] == "target_reached" and set(summary["datasets"]) == {"A", "B", "C"}
    for name, target in targets.items():
        records, failures = exactly_once(tmp_path, name, sizes[name])
        tokens = sum(r.output_tokens for r in records)
        assert target <= tokens <= target * (1 + MAX_OVERSHOOT), (name, tokens / target)
        own = json.loads((folder(tmp_path, name) / "summary.json").read_text())
        assert own == {**summary["datasets"][name], "timeline": own["timeline"]}
        assert own["dataset"] == name and own["stop_reason"] == "target_reached" and own["output_tokens"] == tokens
        assert own["run"]["shared_with"] == sorted(set(targets) - {name})
    stats = emu.stats()
    in_flight = TIMELINE_COLUMNS.index("in_flight")
    assert max(row[in_flight] for row in summary["timeline"]) <= 60
    cut = sum(s["run"]["finish_reasons"].get("cut", 0) for s in summary["datasets"].values())
    assert stats["in_flight_peak"] <= 60 + cut  # the server sees a stream the run cut end a moment later
    assert summary["run"]["charged_usd"] == pytest.approx(stats["charged_usd"], rel=1e-9)
    shares = sum(s["run"]["charged_usd"] for s in summary["datasets"].values())
    assert shares == pytest.approx(stats["charged_usd"], rel=1e-6)  # each dataset's share of the one account
    # resume: every dataset is at its target; nothing is sent and the account is not read (nothing listens there)
    catalog = fetch_catalog(emu.base_url, "moonshotai/kimi-k2.5")
    decide(catalog.model, catalog.normalized(), PrecisionPolicy.for_model(catalog.model)).save(tmp_path / "params")
    again = generate(config(emu, tmp_path, datasets, base_url="http://127.0.0.1:9/api/v1"))
    assert again["stop_reason"] == "target_reached" and again["run"]["recorded"] == 0


def test_money_for_part_of_the_targets_is_shared_in_proportion(emu, tmp_path):
    """The balance buys ~60 % of the targets: every dataset ends near the same fraction of its own target."""
    reset(emu, seed=32, balance=0.06)
    sizes, targets = {"A": 3000, "B": 3000, "C": 3000}, {"A": 10000, "B": 15000, "C": 20000}
    datasets = make_datasets(tmp_path, sizes, targets)
    summary = generate(config(emu, tmp_path, datasets))
    assert summary["stop_reason"] == "balance_reserve_reached"
    shares = {n: summary["datasets"][n]["output_tokens"] / t for n, t in targets.items()}
    assert 0.4 < min(shares.values()) and max(shares.values()) < 0.85, shares
    assert max(shares.values()) - min(shares.values()) <= 0.10, shares  # within ±5 points of one fraction
    assert all(s["stop_reason"] == "balance_reserve_reached" for s in summary["datasets"].values())
    assert emu.stats()["charged_usd"] <= 0.06 + 1e-12


def test_a_dataset_without_target_takes_the_slots_the_others_leave(emu, tmp_path):
    reset(emu, seed=33)
    sizes = {"A": 1500, "B": 1500, "C": 40}
    datasets = make_datasets(tmp_path, sizes, {"A": 5000, "B": 5000})
    summary = generate(config(emu, tmp_path, datasets))
    by = summary["datasets"]
    assert by["C"]["stop_reason"] == "completed" and by["C"]["records"] == 40
    assert by["A"]["stop_reason"] == by["B"]["stop_reason"] == "target_reached"


def test_a_finished_dataset_in_the_list_sends_nothing_and_all_means_the_file(emu, tmp_path):
    reset(emu, seed=34)
    sizes = {"A": 30, "B": 30, "C": 30}
    datasets = make_datasets(tmp_path, sizes)
    first = generate(config(emu, tmp_path, datasets, dataset="A"))
    assert first["dataset"] == "A" and first["records"] == 30 and "datasets" not in first  # one name: as before
    bodies = []

    class Spy:
        async def handle_request(self, client, body, state=None):
            bodies.append(body["messages"][-1]["content"])
            return await complete(client, body)

    summary = run_sync(run_generation(config(emu, tmp_path, datasets, dataset="all"), transport=Spy()),
                       "run_generation")
    assert list(summary["datasets"]) == ["A", "B", "C"] and summary["stop_reason"] == "completed"
    assert summary["datasets"]["A"]["run"]["recorded"] == 0 and not any(b.startswith("A ") for b in bodies)
    assert len(bodies) >= 60 and summary["records"] == 90
    for name in sizes:
        records, failures = exactly_once(tmp_path, name, 30)
        assert len(records) + len(failures) == 30


@pytest.fixture
def other_key(monkeypatch):
    monkeypatch.setenv("EAGLEDATA_OTHER_KEY", "sk-or-v1-another-account")


def test_a_second_run_on_the_same_account_is_refused(emu, tmp_path, other_key):
    """While one run spends on an account, another on this machine stops before any request, naming it."""
    reset(emu, seed=35)
    datasets = make_datasets(tmp_path, {"A": 20, "B": 20, "C": 20})
    holder = SpenderLock.acquire(emu.base_url, resolve_api_key(emu.base_url),
                                 describe={"datasets": ["B3", "B4"], "output_dir": "/elsewhere/outputs"})
    try:
        with pytest.raises(AccountBusy, match=rf"pid {os.getpid()} .*datasets B3, B4 into /elsewhere/outputs"):
            generate(config(emu, tmp_path, datasets))
        assert emu.stats()["requests"] == 0
        other = generate(config(emu, tmp_path, datasets, dataset="A", api_key_env="EAGLEDATA_OTHER_KEY"))
        assert other["records"] == 20  # another key is another account
    finally:
        holder.close()
    assert generate(config(emu, tmp_path, datasets))["records"] == 60  # released: it runs


def test_two_commands_on_one_account_the_second_is_refused(emu, tmp_path):
    """The user's way: a run in one terminal, the same command in another."""
    reset(emu, speed=0.5, seed=36)
    datasets = make_datasets(tmp_path, {"A": 400, "B": 400})
    cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "A", "B", "--datasets-file", str(datasets),
           "--base-url", emu.base_url, "--output-dir", str(tmp_path / "out"), "--params-dir", str(tmp_path / "params"),
           "--concurrency", "20", "--max-tokens", "400", "--progress", "false", "--reserve-usd", "0"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while emu.stats()["requests"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        elsewhere = [str(tmp_path / "out2") if arg == str(tmp_path / "out") else arg for arg in cmd]
        second = subprocess.run(elsewhere, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert re.search(rf"another run is spending on this account .*pid {first.pid} ", second.stderr), second.stderr
        refused = tmp_path / "out2" / "datasets" / "A" / "records.jsonl"
        assert not refused.exists() or refused.stat().st_size == 0  # nothing was sent, nothing recorded
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)


def test_usage_this_run_did_not_book_is_noticed(emu, tmp_path):
    """Another spender on the key (here: the test, sending requests of its own) shows in the summary."""
    reset(emu, seed=37)
    datasets = make_datasets(tmp_path, {"A": 150, "B": 150, "C": 150})
    calls = []

    class WithAStranger:
        async def handle_request(self, client, body, state=None):
            calls.append(1)
            if len(calls) % 3 == 0:  # someone else's request on the same key, not booked by the run
                await complete(client, body)
            return await complete(client, body)

    summary = run_sync(run_generation(config(emu, tmp_path, datasets), transport=WithAStranger()), "run_generation")
    run = summary["run"]
    assert run["foreign_usd"] > 0.2 * run["charged_usd"] > 0
    assert run["charged_usd"] == pytest.approx(emu.stats()["charged_usd"], rel=1e-9)


def test_unreadable_answers_are_settled_before_a_money_stop(emu, tmp_path):
    """Half the answers are lost on the way back (billed, never read): they are booked at their bound, ~5 times
    what they cost. The run must not stop on those bookings: the account settles them, and the cap is spent."""
    reset(emu, speed=0.1, seed=38)
    datasets = make_datasets(tmp_path, {"A": 2000, "B": 2000})
    rng = random.Random(38)

    class Lossy:
        async def handle_request(self, client, body, state=None):
            out = await complete(client, body)
            if out.kind is Kind.OK and rng.random() < 0.5:
                return Outcome(Kind.RETRY, "connection", None, "connection reset after the answer was billed")
            return out

    cap = 0.03
    summary = run_sync(run_generation(config(emu, tmp_path, datasets, dataset=["A", "B"], max_spend_usd=cap,
                                             concurrency=30, max_attempts=40), transport=Lossy()), "run_generation")
    charged = emu.stats()["charged_usd"]
    assert summary["stop_reason"] == "max_spend_reached"
    assert 0.8 * cap <= charged <= cap


def test_kills_and_resume_over_several_datasets(emu, tmp_path):
    """Three datasets in one command, SIGKILLed four times at random moments: resumed, every prompt of every
    dataset is finished exactly once."""
    reset(emu, speed=0.25, seed=39)
    sizes = {"A": 400, "B": 300, "C": 300}
    datasets = make_datasets(tmp_path, sizes)
    cmd = [sys.executable, "-m", "eagledata.generate", "--dataset", "A", "B", "C", "--datasets-file", str(datasets),
           "--base-url", emu.base_url, "--output-dir", str(tmp_path / "out"), "--params-dir", str(tmp_path / "params"),
           "--concurrency", "200", "--max-tokens", "400", "--progress", "false", "--reserve-usd", "0"]
    rng = random.Random(39)
    kills, _ = kill_while_writing(cmd, [folder(tmp_path, n) / "records.jsonl" for n in sizes], rng, 4)
    assert kills >= 3, "the runs finished before they could be killed"
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "3 datasets: completed" in final.stdout, final.stdout
    for name, n in sizes.items():
        records, failures = exactly_once(tmp_path, name, n)
        assert len(records) + len(failures) == n and not failures


def test_stop_reasons_are_the_documented_ones():
    """docs/FORMATS.md lists exactly the registry's stop reasons."""
    text = (ROOT / "docs" / "FORMATS.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `stop_reason` |"))
    documented = set(re.findall(r"`([a-z_]+)`", row.split("|")[3]))
    assert documented == {r.value for r in StopReason}, documented ^ {r.value for r in StopReason}
    assert "`fatal_<class>`" in row and "`error: <Type>: <message>`" in row


def test_notebook_runs_a_list_and_reports_each_dataset(emu, tokenizer_dir, tmp_path, execute_notebook):
    reset(emu, seed=40)
    datasets = make_datasets(tmp_path, {"A": 300, "B": 300}, {"A": 4000, "B": 6000})
    out = execute_notebook("generate", dataset=["A", "B"], datasets_file=str(datasets), base_url=emu.base_url,
                           tokenizer=str(tokenizer_dir), output_dir=str(tmp_path / "out"),
                           params_dir=str(tmp_path / "params"), concurrency=10, max_tokens=400)
    results = read_results(out)
    summary = results["summary"]
    assert summary["stop_reason"] == "target_reached" and set(summary["datasets"]) == {"A", "B"}
    assert "timeline" not in summary["datasets"]["A"]
    table = results["datasets"]
    assert [row["dataset"] for row in table] == ["A", "B"]
    for row in table:
        assert row["stop_reason"] == "target_reached" and 1.0 <= row["share_of_target"] <= 1 + MAX_OVERSHOOT
