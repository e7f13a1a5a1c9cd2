"""vLLM's speculative-decoding counters read as τ (quality/vllm_tau.py). The metrics text is the one vLLM 0.32 on CPU
served for SmolLM2 with the make-quality off-policy EAGLE-3 checkpoint, MT-Bench's first 10 questions (k = 5, 96 new
tokens): its counters gave exactly our tau.json's figures on the same questions."""
import json
import math

import pytest

from eagledata.quality.vllm_tau import (
    TOLERANCE,
    CountMismatch,
    SpecCounts,
    check_agreement,
    compare,
    main,
    spec_counts,
)

LABELS = 'engine="0",model_name="target"'
METRICS = f"""# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{{LABELS}}} 1740.0
vllm:spec_decode_num_drafts_created{{{LABELS}}} 1.796432073491237e+09
vllm:spec_decode_num_draft_tokens_total{{{LABELS}}} 8700.0
vllm:spec_decode_num_accepted_tokens_total{{{LABELS}}} 36.0
vllm:spec_decode_num_accepted_tokens_created{{{LABELS}}} 1.796432073491273e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS}, position="0"}} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS}, position="1"}} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS}, position="2"}} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS}, position="3"}} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS}, position="4"}} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{{{LABELS}, position="0"}} 1.7964320734912965e+09
vllm:num_requests_running{{{LABELS}}} 0.0
"""
OURS = {"tau_pooled": 1.0206896551724138, "verify_forwards": 1740, "output_tokens": 1796,
        "per_position_acceptance": [0.017241379310344827, 0.0028735632183908046, 0.0005747126436781609, 0.0, 0.0]}


def test_vllm_counters_read_as_tau_and_acceptance_per_position():
    c = spec_counts(METRICS)
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_position) == (1740, 8700, 36, [30, 5, 1, 0, 0])
    assert c.tau == pytest.approx(1 + 36 / 1740) and c.draft_tokens == 5 * c.drafts  # k = 5 every step
    assert c.acceptance() == pytest.approx([30 / 1740, 5 / 1740, 1 / 1740, 0, 0])
    # two engines: their counters add up; the `_created` timestamps and other metrics are not counts
    two = spec_counts(METRICS + METRICS.replace('engine="0"', 'engine="1"'))
    assert (two.drafts, two.accepted, two.per_position) == (3480, 72, [60, 10, 2, 0, 0])


def test_a_server_without_speculative_decoding_has_no_tau():
    c = spec_counts('vllm:num_requests_running{engine="0"} 0.0\n')
    assert c == SpecCounts() and math.isnan(c.tau) and c.acceptance() == []


def test_ours_beside_vllms_on_the_same_questions():
    row = compare(OURS, spec_counts(METRICS), 1796)
    assert row["tau_pooled"]["ours"] == pytest.approx(row["tau_pooled"]["vllm"], abs=1e-12)
    assert row["verifying_steps"] == {"ours": 1740, "vllm": 1740} and row["output_tokens"] == {"ours": 1796,
                                                                                             "vllm": 1796}
    assert row["acceptance"]["ours"] == pytest.approx(row["acceptance"]["vllm"])


# -- the check: vLLM's count and ours must agree ------------------------------------------------------------------
def test_a_count_within_tolerance_passes():
    near = dict(OURS, tau_pooled=OURS["tau_pooled"] + 0.015)
    for ours in (OURS, near):
        row = check_agreement(ours, spec_counts(METRICS), 1796)
        assert abs(row["tau_pooled"]["difference"]) <= TOLERANCE == 0.02


@pytest.mark.parametrize("off", [+0.05, -0.05, +0.021])
def test_a_count_that_disagrees_fails_naming_both_figures(off):
    """The plant: a tau.json whose pooled τ is off against the frozen metrics text."""
    planted = dict(OURS, tau_pooled=OURS["tau_pooled"] + off)
    with pytest.raises(CountMismatch, match=rf"ours {planted['tau_pooled']:.4f} .* vLLM {1 + 36 / 1740:.4f} "):
        check_agreement(planted, spec_counts(METRICS), 1796)


def test_vllms_count_per_draft_is_what_ours_is_held_to():
    """Where some of our forwards carried no draft (prompt lookup), our count per draft is the one vLLM's matches."""
    ours = dict(OURS, tau_pooled=1.01, tau_per_draft=OURS["tau_pooled"])
    check_agreement(ours, spec_counts(METRICS))
    with pytest.raises(CountMismatch, match="no speculative draft"):
        check_agreement(OURS, spec_counts('vllm:num_requests_running{engine="0"} 0.0\n'))
    with pytest.raises(CountMismatch, match="no pooled acceptance length"):
        check_agreement({"tau_pooled": None}, spec_counts(METRICS))


def test_the_command_exits_non_zero_on_a_count_mismatch(tmp_path, capsys):
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(METRICS)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(OURS))
    bad.write_text(json.dumps(dict(OURS, tau_pooled=OURS["tau_pooled"] + 0.05)))
    assert main(["--metrics", str(metrics), "--ours", str(good), "--out", str(tmp_path / "v.json")]) == 0
    assert json.loads((tmp_path / "v.json").read_text())["agrees"] is True
    capsys.readouterr()
    assert main(["--metrics", str(metrics), "--ours", str(bad), "--out", str(tmp_path / "v.json")]) == 1
    err = capsys.readouterr().err
    assert "pooled acceptance length differs by 0.0500 > 0.02" in err and "ours 1.0707" in err and "vLLM 1.0207" in err
    assert json.loads((tmp_path / "v.json").read_text())["agrees"] is False


def test_questions_are_asked_at_once_each_ones_turns_in_order_on_its_own_answer():
    """`ask` with concurrency 3 over 7 two-turn questions: at most 3 requests in flight and more than one at some
    point; every second turn carries its own question's first answer, stripped; the tokens the server counted."""
    import threading
    import time

    import httpx

    from eagledata.quality.vllm_tau import ask

    lock, flight, most = threading.Lock(), [0], [0]
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with lock:
            flight[0] += 1
            most[0] = max(most[0], flight[0])
            seen.append(body["messages"])
        time.sleep(0.02)
        with lock:
            flight[0] -= 1
        first = body["messages"][0]["content"]
        answer = f"  answer to {first} turn {len(body['messages']) // 2}  "
        return httpx.Response(200, json={"usage": {"completion_tokens": 5},
                                         "choices": [{"message": {"content": answer}}]})

    questions = [[f"q{i}", f"q{i} again"] for i in range(7)]
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        tokens = ask(client, "http://127.0.0.1:1/v1", questions, max_new_tokens=16, concurrency=3)
    assert tokens == 7 * 2 * 5 and 1 < most[0] <= 3
    seconds = [m for m in seen if len(m) == 3]
    assert sorted(m[0]["content"] for m in seconds) == [f"q{i}" for i in range(7)]
    assert all(m[1] == {"role": "assistant", "content": f"answer to {m[0]['content']} turn 0"} for m in seconds)
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        ask(httpx.Client(), "http://127.0.0.1:1/v1", questions, max_new_tokens=16, concurrency=0)
