"""A seeded run against the emulator, taped, and its answers replayed through the engine in virtual time make the same
decisions: the same requests in the same order (retries and next turns included), the same stops, the same records.
This is what lets the benches (bench/pacing_replay.py) measure the engine itself on saved answers."""
import asyncio
import json
from dataclasses import replace

import pytest

from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, Seams
from eagledata.generation.clock import InlineExecutor, run_virtual
from eagledata.generation.realtime.attempt import ChatCompletions
from eagledata.generation.realtime.replay import Replayed, Taped, request_key, taken_order
from eagledata.generation.run import run_generation
from eagledata.openrouter import Kind, Outcome, load_routing

SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.6, "content_median": 25, "content_sigma": 0.6, "max_total": 400}
# Faults whose answer and cost the client sees at once (no mid-answer cut, whose cost only the account knows), and
# Retry-After 0: with one slot and no backoff, what is taken next depends on the answers alone, not on the wall clock.
FAULTS = {"rate_limit": 0.04, "bad_gateway": 0.05, "unavailable": 0.03, "error_in_choice": 0.02,
          "empty_content": 0.03, "truncated_json": 0.02}


def datasets(tmp_path):
    """A: single-turn with a target; B: conversations of 1-3 user turns; C: a few. One slot: at each take nothing is
    in flight, so pacing's answer depends on what is recorded alone, never on when its estimates were refreshed
    (a wall-clock tick in the run, a virtual one in the replay)."""
    files = {}
    for name, n in (("A", 60), ("B", 40), ("C", 6)):
        path = tmp_path / f"{name}.jsonl"
        with path.open("w") as f:
            for i in range(n):
                turns = 1 + i % 3 if name == "B" else 1
                msgs = []
                for k in range(turns):
                    msgs.append({"role": "user", "content": f"{name} {i} turn {k}: why is {i * 7 + k} odd or even?"})
                    if k + 1 < turns:
                        msgs.append({"role": "assistant", "content": "(the dataset's answer)"})
                f.write(json.dumps({"id": f"{name}-{i:03d}", "messages": msgs}) + "\n")
        files[name] = path
    out = tmp_path / "datasets.yaml"
    out.write_text(f"A:\n  prompts: {files['A']}\n  target_output_tokens: 1800\n"
                   f"B:\n  prompts: {files['B']}\n"
                   f"C:\n  prompts: {files['C']}\n")
    return out


def config(tmp_path, base_url, out):
    return GenerateConfig(dataset="all", datasets_file=str(datasets(tmp_path)), base_url=base_url,
                          output_dir=str(tmp_path / out), params_dir=str(tmp_path / "params"), concurrency=1,
                          max_tokens=400, progress=False, retry_base_s=0.0, retry_cap_s=0.0, reserve_usd=0.0,
                          provider_cooldown_s=0.0, max_attempts=4, turns="all",
                          stream=False)  # a tape holds answers, not how fast each streamed: pacing on streams and
    # the routing near a cut depend on that timing, so the replayed run asks for JSON bodies


def records(tmp_path, out):
    """Each dataset's records and failures as written, the generation's timing left out."""
    got = {}
    for name in ("A", "B", "C"):
        folder = tmp_path / out / "datasets" / name
        lines = [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]
        for r in lines:
            r.get("meta", {}).pop("latency_s", None)
        fails = folder / "failures.jsonl"
        got[name] = (lines, fails.read_text() if fails.exists() else "")
    return got


@pytest.fixture
def taped_run(tmp_path, tokenizer_dir, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    emu_cfg = {"seed": 7, "speed": 0, "content": SMALL, "balance": 1000,
               "faults": {**FAULTS, "retry_after": 0}}
    with run_emulator(emu_cfg) as emu:
        cfg = config(tmp_path, emu.base_url, "real")
        routing = asyncio.run(load_routing(cfg.model, params_dir=cfg.params_dir, base_url=cfg.base_url,
                                           api_key_env=cfg.api_key_env))
        taped = Taped(ChatCompletions())
        summary = asyncio.run(run_generation(cfg, seams=Seams(transport=taped, routing=routing)))
    return routing, taped.tape, summary


def replay(tmp_path, routing, tape, out="replayed", transport=None):
    cfg = config(tmp_path, "http://127.0.0.1:9/api/v1", out)  # nothing listens: every answer is the tape's
    served = transport or Replayed(tape)
    seams = Seams(transport=served, account=served.account, routing=routing, executor=InlineExecutor())
    return run_virtual(run_generation(cfg, seams=seams)), served


def test_a_replay_in_virtual_time_decides_as_the_run_did(tmp_path, taped_run):
    routing, tape, real = taped_run
    errors = [t.outcome.error_class for t in tape if t.outcome.kind is not Kind.OK]
    assert len(errors) >= 8 and {"rate_limit", "bad_gateway"} <= set(errors)  # retries were part of the run
    assert real["datasets"]["A"]["stop_reason"] == "target_reached"
    assert real["datasets"]["B"]["stop_reason"] == real["datasets"]["C"]["stop_reason"] == "completed"

    summary, served = replay(tmp_path, routing, tape)

    assert taken_order(served.sent) == taken_order([t.body for t in tape])  # the same takes, in the same order
    assert served.sent == [t.body for t in tape] and served.left == 0        # the same bodies, provider filter too
    assert summary["stop_reason"] == real["stop_reason"]
    for name in ("A", "B", "C"):
        mine, theirs = summary["datasets"][name], real["datasets"][name]
        assert (mine["stop_reason"], mine["records"], mine["output_tokens"]) == \
            (theirs["stop_reason"], theirs["records"], theirs["output_tokens"])
    assert records(tmp_path, "replayed") == records(tmp_path, "real")


def test_a_replay_that_decides_otherwise_is_caught(tmp_path, taped_run):
    """The comparison can fail: the same tape with one failed attempt turned into its later success makes the
    replay send other requests (that prompt is not retried), and the checks above see it."""
    routing, tape, real = taped_run
    i = next(i for i, t in enumerate(tape) if t.outcome.error_class == "bad_gateway")
    ok_later = next(t for t in tape[i + 1:] if request_key(t.body) == request_key(tape[i].body))
    changed = [*tape[:i], replace(tape[i], outcome=ok_later.outcome), *tape[i + 1:]]

    summary, served = replay(tmp_path, routing, changed, "changed")

    assert taken_order(served.sent) != taken_order([t.body for t in tape])
    assert served.left >= 1  # the retry's answer was never asked for
    assert records(tmp_path, "changed") != records(tmp_path, "real")  # its record says one attempt, not two


def test_an_answer_is_replayed_after_its_latency(tmp_path):
    """Virtual time: the tape's latencies, not the wall clock's."""
    from eagledata.generation.realtime.replay import Taken

    body = {"messages": [{"role": "user", "content": "hi"}]}
    served = Replayed([Taken(body, 0.0, 12.5, Outcome(Kind.RETRY, "bad_gateway", 502))])

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        outcome = await served.handle_request(None, body)
        return loop.time() - t0, outcome

    waited, outcome = run_virtual(main())
    assert waited == pytest.approx(12.5) and outcome.error_class == "bad_gateway" and served.left == 0
