"""Streaming changes nothing in the data (issue 42): a seeded emulator run asked with `stream: true` and the same run
asked for JSON bodies send the same requests in the same order and write the same records, byte for byte (the
generation ids aside: the emulator draws them at random, so each is compared as the answer it names), the same
failures and the same outcome counts, with faults, provider quirks, tool calls, conversations and a target stop.

One slot and no backoff (as tests/generation/test_replay.py): what is taken next depends on the answers alone."""
import asyncio
import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, Seams
from eagledata.generation.realtime.attempt import ChatCompletions
from eagledata.generation.realtime.replay import Taped
from eagledata.generation.run import run_generation
from eagledata.openrouter import Kind, load_routing
from eagledata.openrouter.client import LOCAL_KEY
from eagledata.openrouter.stream import StreamState
from tests.helpers import ROOT

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.6, "content_median": 25, "content_sigma": 0.6, "max_total": 400}
# Every fault whose answer the client sees (streamed: an error chunk, a top-level error event, a cut line, an empty
# answer), and Retry-After 0.
FAULTS = {"rate_limit": 0.03, "bad_gateway": 0.03, "error_in_choice": 0.03, "error_top_level": 0.03,
          "midstream_error": 0.03, "empty_content": 0.03, "truncated_json": 0.03, "connection_reset": 0.02}
# The cheapest eligible endpoint serves most answers: every quirk of how answers are served, made-up call ids, and
# fallbacks to DeepInfra (its own quirks) when it fails.
QUIRKS = {"reasoning_details_only": 0.1, "inline_think": 0.08, "bare_close": 0.08, "special_spaces": 0.05,
          "literal_specials": 0.08, "reasoning_dropped": 0.15, "arguments_reserialized": 0.3}
EMULATOR = {"seed": 11, "speed": 0, "content": SMALL, "balance": 1000, "generation_delay": 0.05,
            "faults": {**FAULTS, "retry_after": 0},
            "endpoints": [{"provider": "Chutes", "quirks": QUIRKS, "tool_call_ids": "call", "error_rate": 0.1},
                          {"provider": "DeepInfra", "quirks": {"reasoning_details_only": 0.5, "inline_think": 0.2}}]}


def datasets(tmp_path: Path) -> Path:
    """The demo's three datasets (single turns, conversations, an agent's tool loops), twenty prompts each."""
    out = tmp_path / "datasets.yaml"
    prompts = ROOT / "examples" / "prompts"
    out.write_text(f"demo-a:\n  prompts: {prompts / 'demo-a.jsonl'}\n  target_output_tokens: 1500\n"
                   f"demo-b:\n  prompts: {prompts / 'demo-b.jsonl'}\n"
                   f"demo-tools:\n  prompts: {prompts / 'demo-tools.jsonl'}\n")
    return out


def config(tmp_path: Path, base_url: str, out: str, stream: bool) -> GenerateConfig:
    return GenerateConfig(dataset="all", datasets_file=str(datasets(tmp_path)), base_url=base_url,
                          output_dir=str(tmp_path / out), params_dir=str(tmp_path / "params"), concurrency=1,
                          max_tokens=400, progress=False, retry_base_s=0.0, retry_cap_s=0.0, reserve_usd=0.0,
                          provider_cooldown_s=0.0, max_attempts=4, turns="all", limit=20, stream=stream,
                          at_target="finish")  # near a cut, streams go only where they cancel


def written(tmp_path: Path, out: str, truth: dict[str, dict]) -> dict[str, tuple[str, list[dict]]]:
    """Each dataset's records.jsonl and failures.jsonl as written, each generation id replaced by the answer it names
    (the prompt's hash and attempt number at the emulator): every other byte is compared as it is."""
    got = {}
    for folder in sorted((tmp_path / out / "datasets").iterdir()):
        text = (folder / "records.jsonl").read_text()
        for line in text.splitlines():
            gid = json.loads(line)["generation_id"]
            g = truth[gid]  # an id the emulator generated and billed: the stream's own `id`
            text = text.replace(json.dumps(gid), json.dumps(f"{g['prompt_hash']}#{g['attempt']}"))
        fails = folder / "failures.jsonl"
        failed = [json.loads(line) for line in fails.read_text().splitlines()] if fails.exists() else []
        for f in failed:
            if f["error"]["class"] == "malformed":
                f["error"]["message"] = "(cut)"  # as `said`
        got[folder.name] = (text, failed)
    return got


def said(outcome) -> tuple:
    """An outcome as the engine acts on it and failures.jsonl shows it; a cut answer's message says how it was cut
    (a JSON body, or a stream before [DONE]), the only words that differ."""
    cut = outcome.error_class == "malformed"
    return outcome.kind, outcome.error_class, outcome.status, outcome.retry_after, outcome.provider, \
        "(cut)" if cut else outcome.message


def answer(outcome, truth: dict[str, dict]):
    """An outcome's Completion, its generation id named as the answer it is (as in `written`)."""
    c = outcome.completion
    if c is None:
        return None
    g = truth[c.generation_id]
    return dataclasses.replace(c, generation_id=f"{g['prompt_hash']}#{g['attempt']}")


TIMED = {"output_tokens_per_s", "target_met_s", "provider_health", "timing", "pool",  # the clock's
         "charged_usd", "spend_usd", "wasted_usd", "usd_per_m_output",  # the account's, as of its last reading
         "read_back"}  # a broken stream's cost, read by the id its header gave (a broken JSON body names none)


def counts(summary: dict) -> dict:
    """What a run's summary counts (outcomes by class, providers, finish reasons, tokens, fidelity), the clock's
    figures aside."""
    return {name: {"stop_reason": d["stop_reason"], "records": d["records"], "failures": d["failures"],
                   "fidelity": d["fidelity"], "run": {k: v for k, v in d["run"].items() if k not in TIMED}}
            for name, d in summary["datasets"].items()} | {"stop_reason": summary["stop_reason"]}


@pytest.fixture(scope="module")
def emulator(tokenizer_dir):
    with run_emulator(EMULATOR) as emu:
        yield emu
        assert "Traceback" not in emu.log(), emu.log()[-3000:]


def run(tmp_path: Path, emu, stream: bool, out: str, transport=None):
    """One seeded run from a fresh emulator state: (tape, summary, the emulator's ground truth by generation id)."""
    emu.reset()
    cfg = config(tmp_path, emu.base_url, out, stream)
    routing = asyncio.run(load_routing(cfg.model, params_dir=cfg.params_dir, base_url=cfg.base_url,
                                       api_key_env=cfg.api_key_env))
    taped = Taped(transport or ChatCompletions())
    summary = asyncio.run(run_generation(cfg, seams=Seams(transport=taped, routing=routing)))
    return taped.tape, summary, {g["generation_id"]: g for g in emu.ground_truth()}


@pytest.fixture(scope="module")
def plain(tmp_path_factory, emulator):
    """The run asked for JSON bodies (`stream: false`), once for the module."""
    tmp_path = tmp_path_factory.mktemp("plain")
    tape, summary, truth = run(tmp_path, emulator, False, "out")
    return tmp_path, tape, summary, truth


def test_streamed_and_json_answers_write_the_same_records(plain, emulator):
    tmp_path, tape, summary, truth = plain
    s_tape, s_summary, s_truth = run(tmp_path, emulator, True, "streamed")

    assert all(t.body["stream"] is False for t in tape) and all(t.body["stream"] is True for t in s_tape)
    assert [{**t.body, "stream": None} for t in s_tape] == [{**t.body, "stream": None} for t in tape]
    assert [said(t.outcome) for t in s_tape] == [said(t.outcome) for t in tape]
    assert [answer(t.outcome, s_truth) for t in s_tape] == [answer(t.outcome, truth) for t in tape]
    assert written(tmp_path, "streamed", s_truth) == written(tmp_path, "out", truth)
    assert counts(s_summary) == counts(summary)

    # what the run went through, both ways
    classes = {t.outcome.error_class for t in tape}
    assert {"ok", "error_in_choice", "error_in_body", "malformed", "empty", "bad_gateway", "rate_limit",
            "connection", "reasoning_missing"} <= classes, classes
    quirks = {g["quirk"] for g in truth.values() if g.get("quirk")}
    assert {"reasoning_details_only", "inline_think", "bare_close", "literal_specials"} <= quirks, quirks
    records = [json.loads(line) for text, _ in written(tmp_path, "out", truth).values() for line in text.splitlines()]
    assert any(r.get("tool_calls") for r in records) and any(r["turn"] > 1 for r in records)
    assert any(r["meta"].get("served_tool_call_ids") for r in records)  # made-up call ids rebuilt, streamed too
    assert summary["datasets"]["demo-a"]["stop_reason"] == "target_reached"


class DropsADelta(ChatCompletions):
    """A planted bug: the stream's 3rd content delta of every answer is lost in assembly."""

    async def handle_request(self, client, body, state=None):
        state = StreamState()
        seen = 0
        delta = state._delta

        def dropping(d):
            nonlocal seen
            if isinstance(d.get("content"), str) and d["content"]:
                seen += 1
                if seen == 3:
                    return
            delta(d)

        state._delta = dropping
        return await super().handle_request(client, body, state)


def test_a_lost_delta_is_caught(plain, emulator):
    """The comparison can fail: a stream that loses one piece of content writes other records."""
    tmp_path, tape, summary, truth = plain
    s_tape, s_summary, s_truth = run(tmp_path, emulator, True, "planted", DropsADelta())
    assert any(t.outcome.kind is Kind.OK for t in s_tape)
    assert written(tmp_path, "planted", s_truth) != written(tmp_path, "out", truth)


@pytest.mark.parametrize("keepalive_s, stalls", [(0.2, False), (5.0, True)])
def test_the_stall_timeout_counts_keepalives_and_closes_a_silent_stream(tmp_path, tokenizer_dir, keepalive_s, stalls):
    """stall_timeout_s (0.6 s) below the time to the first token (Chutes' ~1.6 s): with OpenRouter's keepalive
    comments every 0.2 s each answer is waited for and kept; with none for 5 s every attempt is closed at the stall
    and retried (client_timeout), and the prompts fail after max_attempts, none waiting the 5 s out. Closed before its
    first token, not after the wait: the service saw each of the 8 attempts closed, and no answer was recorded (a bound
    on the run's wall seconds said so too, but depended on the machine's load)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Q{i}"}]}) + "\n"
                               for i in range(4)))
    (tmp_path / "datasets.yaml").write_text(f"P:\n  prompts: {prompts}\n")
    with run_emulator({"seed": 3, "speed": 1, "content": SMALL, "balance": 100, "processing_interval": keepalive_s,
                       "endpoints": [{"provider": "Chutes", "error_rate": 0.0}]}) as emu:
        cfg = GenerateConfig(dataset="P", datasets_file=str(tmp_path / "datasets.yaml"), base_url=emu.base_url,
                             output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), concurrency=4,
                             max_tokens=400, progress=False, retry_base_s=0.0, retry_cap_s=0.0, reserve_usd=0.0,
                             max_attempts=2, stream=True, stall_timeout_s=0.6)
        # the emulator's first answers wait on its tokenizer's warm-up before a byte goes out: not the service's way
        httpx.post(f"{emu.base_url}/chat/completions", headers={"Authorization": f"Bearer {LOCAL_KEY}"},
                   json={"model": cfg.model, "max_tokens": 8,
                   "messages": [{"role": "user", "content": "warm up"}]}, timeout=60).raise_for_status()
        summary = asyncio.run(run_generation(cfg))
        outcomes = emu.stats()["outcomes"]
    errors = summary["run"]["errors"]
    if stalls:
        assert (summary["stop_reason"], summary["failures"], errors) == ("all_failed", 4, {"client_timeout": 8})
        assert outcomes == {"ok": 1, "cancelled": 8}, outcomes  # the warm-up; then 8 closed before an answer
        failures = [json.loads(x) for x in (tmp_path / "out" / "datasets" / "P" / "failures.jsonl").open()]
        assert {f["error"]["message"] for f in failures} == {"stalled: no bytes for 0.6 s"}
    else:
        assert (summary["stop_reason"], summary["records"], errors) == ("completed", 4, {})
