"""No kept record's ids disagree with the service's own count (`usage.completion_tokens`) by more than its provider's
offset plus `recording.COUNT_TOLERANCE`: the check on constructed answers, the refusal's way through the parts (not
written, retried with its provider ignored, counted in the summary), and the planted case of issue 44 through a real
emulator run (billed reasoning withheld while the answer quotes a literal `</think>`)."""
import asyncio
import json
from collections import Counter

import pytest

from eagledata.emulator import run_emulator
from eagledata.generation import GenerateConfig, generate
from eagledata.generation.conversations.fidelity import FidelityJudge
from eagledata.generation.conversations.recording import COUNT_DISAGREES, COUNT_TOLERANCE, build_record, count_refusal
from eagledata.openrouter import Kind, PrecisionPolicy, classify_response, decide, fetch_catalog
from eagledata.openrouter.answers import BARE_CLOSE
from eagledata.records import load_records
from eagledata.text import output_ids
from tests.helpers.parts import Scripted, answered, completion, endpoint, routing, send


def check(diff):
    return {"repaired": "", "completion_diff": diff, "prompt_diff": 0}


def test_the_tolerance_is_one_token_beyond_the_providers_offset(tok):
    c = completion(tok)
    assert COUNT_TOLERANCE == 1
    for offset in (0, -1):  # a provider counting `<|im_end|>`, and one that does not
        for diff in (offset - 1, offset, offset + 1):  # at the tolerance either way: kept
            assert count_refusal(c, check(diff), offset) is None, (offset, diff)
        for diff in (offset - 2, offset + 2, offset + 298):  # one past it: refused, whatever the direction
            refused = count_refusal(c, check(diff), offset)
            assert refused is not None and refused.kind is Kind.RETRY and refused.error_class == COUNT_DISAGREES
            assert refused.completion is c and refused.provider == "Sim" and f"({diff:+d})" in refused.message


def test_answers_without_a_count_and_a_local_servers_own_ids(tok):
    """Served whole with no count: kept (nothing to hold it to). A repair with no count: refused (a repair is an
    inference the count must confirm). A local server's own ids: never refused, they are the truth."""
    c = completion(tok, completion_tokens=0)
    assert count_refusal(c, check(None), 0) is None
    c.repaired = BARE_CLOSE
    refused = count_refusal(c, check(None), 0)
    assert refused is not None and "no completion count" in refused.message
    assert count_refusal(completion(tok), check(300), 0, server_ids=True) is None


def test_the_judge_holds_each_provider_to_its_own_offset():
    """Learned from kept answers (0 or -1 on those that end in `<|im_end|>`, tool calls included; 0 on cut ones);
    0 for a provider not yet seen."""
    judge = FidelityJudge()
    assert judge.completion_offset("New", "stop") == 0
    for finish in ("stop", "stop", "tool_calls", "length"):
        judge.answer("NoImEnd", check(0 if finish == "length" else -1), finish)
    assert [judge.completion_offset("NoImEnd", f) for f in ("stop", "tool_calls", "length")] == [-1, -1, 0]
    assert judge.providers["NoImEnd"].count_mismatch == 0  # its tool-call answers' -1 is its offset too


def incident(tok, reasoning_tokens=297, extra=298):
    """Issue 44's answer: no reasoning text in any field while `reasoning_tokens` are billed, and content quoting a
    literal `</think>`; the service counts `extra` tokens more than the bare-close split rebuilds."""
    content = "The template closes reasoning with the `</think>` tag, then the answer follows."
    rebuilt = len(output_ids(tok, *content.split("</think>", 1), "stop"))
    body = {"id": "gen-planted", "provider": "Quoter", "model": "moonshotai/kimi-k2.5-0127",
            "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": content,
                                                              "reasoning": None, "reasoning_details": []}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": rebuilt + extra, "cost": 0.002,
                      "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}}
    return classify_response(200, {}, json.dumps(body).encode())


def test_the_planted_answer_is_a_bare_close_repair_the_count_refuses(parts, tok):
    """The classifier takes it for a bare close (it cannot tell the literal from the control token); built, its
    ids are 298 short of the service's count, and the provider's verdict (consistent) does not keep it."""
    outcome = incident(tok)
    assert outcome.kind is Kind.OK and outcome.completion.repaired == BARE_CLOSE
    p = parts({"A": 1})
    work = p.dispatcher.take(0.0)
    asyncio.run(p.requester.prepare(work))
    record = build_record(tok, turn=work.turn, dataset="A", prompt_ids=work.prompt_ids, completion=outcome.completion,
                          attempts=1)
    assert record.meta["fidelity"]["completion_diff"] == 298
    assert p.recorder.fidelity.providers == {}  # no verdict against it yet: consistent
    refused = p.recorder.contradicted(record, outcome.completion)
    assert refused is not None and refused.error_class == COUNT_DISAGREES
    assert "(+298), beyond Quoter's offset +0 ± 1 (repaired: bare_close)" in refused.message


def test_a_contradicted_answer_is_refused_retried_elsewhere_and_counted(parts, tok):
    faithful = completion(tok, provider="Dear").usage.completion_tokens
    off = answered(tok, provider="Dear", cost=0.002, completion_tokens=faithful + COUNT_TOLERANCE + 1)
    at_tolerance = answered(tok, provider="Cheap", cost=0.001, completion_tokens=faithful + COUNT_TOLERANCE)
    p = parts({"A": 1}, routing=routing(endpoint("Cheap"), endpoint("Dear"), provider={"sort": "price"}),
              transport=Scripted(off, at_tolerance))
    send(p, 0.0)
    work = send(p, 5.0)
    sent = p.requester.transport.sent
    assert sent[1]["provider"] == {"sort": "price", "ignore": ["Dear"]}  # retried without the provider refused
    records = load_records(work.lane.store.files.records)
    assert [(r.provider, r.meta["attempts"], r.meta["fidelity"]["completion_diff"]) for r in records] == \
        [("Cheap", 2, COUNT_TOLERANCE)]
    stats = work.lane.stats
    assert stats.counts == Counter({"retried": 1, "recorded": 1}) and stats.errors == Counter({COUNT_DISAGREES: 1})
    assert stats.booked_usd == pytest.approx(0.003)  # the refused answer was paid for: booked at its cost
    books = p.recorder.fidelity.providers["Dear"].to_dict()
    assert (books["answers"], books["refused"], books["count_refused"], books["count_mismatch"]) == (1, 1, 1, 0)
    assert work.lane.fidelity.summary()["providers"]["Dear"]["count_refused"] == 1  # the dataset's summary


# -- the planted case through a real emulator run ------------------------------------------------------------------
SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.5, "content_median": 20, "content_sigma": 0.5, "max_total": 400}


def _ep(provider, price, **kw):
    return {"provider": provider, "slug": provider.lower(), "quantization": "int4", "prompt_price": price,
            "completion_price": 5 * price, "latency": 1.0, "throughput": 40, "capacity": 1000, **kw}


def test_withheld_reasoning_beside_a_literal_close_is_refused_in_a_run(tokenizer_dir, tok, tmp_path):
    """Every answer quotes `</think>` (the prompts ask about the tags); Quoter, the cheapest, withholds the billed
    reasoning of one answer in ten, so its verdict stays `consistent`. Those answers are refused (`count_disagrees`),
    retried without Quoter, and counted in the summary; no kept record's ids leave the service's count beyond its
    provider's offset and the tolerance, and every kept record's ids are the emulator's own."""
    n = 160
    content = {**SMALL, "literal_close": 1.0}
    cfg_emu = {"speed": 0, "seed": 44, "content": content, "balance": 1000, "replace_endpoints": True,
               "endpoints": [_ep("Quoter", 0.40, quirks={"reasoning_dropped": 0.1}),
                             _ep("Plain", 0.44, usage_counts_im_end=False)]}
    with run_emulator(cfg_emu) as emu:
        prompts = tmp_path / "D.jsonl"
        with prompts.open("w") as f:
            for i in range(n):
                msgs = [{"role": "user", "content": f"Question {i}: what does the </think> tag close?"}]
                f.write(json.dumps({"id": f"D-{i:04d}", "messages": msgs}) + "\n")
        (tmp_path / "datasets.yaml").write_text(f"D:\n  prompts: {prompts}\n")
        catalog = fetch_catalog(emu.base_url, "moonshotai/kimi-k2.5")
        decide(catalog.model, catalog.normalized(), PrecisionPolicy.for_model(catalog.model)).save(tmp_path / "params")
        cfg = GenerateConfig(dataset="D", datasets_file=str(tmp_path / "datasets.yaml"), base_url=emu.base_url,
                             output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), concurrency=40,
                             max_tokens=1000, progress=False, retry_base_s=0.01, retry_cap_s=0.1, reserve_usd=0.0)
        summary = generate(cfg)
        truth = {g["generation_id"]: g for g in emu.ground_truth()}
        assert "Traceback" not in emu.log(), emu.log()[-3000:]
    withheld = [g for g in truth.values() if g["quirk"] == "reasoning_dropped"]
    assert len(withheld) >= 5 and all("</think>" in g["content"] and g["reasoning_tokens"] > 0 for g in withheld)
    d = tmp_path / "out" / "datasets" / "D"
    records = load_records(d / "records.jsonl")
    assert sorted(r.id for r in records) == [f"D-{i:04d}" for i in range(n)]  # every prompt kept once, none failed
    assert not (d / "failures.jsonl").exists() or not (d / "failures.jsonl").read_text().strip()
    kept = {r.generation_id for r in records}
    assert not kept & {g["generation_id"] for g in withheld}  # no planted answer kept
    offsets = {"Quoter": 0, "Plain": -1}  # Plain does not count `<|im_end|>`
    for r in records:
        diff = r.meta["fidelity"]["completion_diff"]
        ended = r.finish_reason in ("stop", "tool_calls")
        assert abs(diff - (offsets[r.provider] if ended else 0)) <= COUNT_TOLERANCE, (r.id, r.provider, diff)
        g = truth[r.generation_id]
        assert r.output_ids == g["output_ids"] or not g["retokenizes"], r.id
    # retried elsewhere: each planted prompt's record is Plain's
    planted = {g["prompt_hash"] for g in withheld}
    assert planted and all(r.provider == "Plain" for r in records if truth[r.generation_id]["prompt_hash"] in planted)
    # counted in the summary: the provider's books and the run's errors
    quoter = summary["fidelity"]["providers"]["Quoter"]
    assert quoter["count_refused"] == quoter["refused"] == len(withheld), quoter
    assert summary["run"]["errors"].get(COUNT_DISAGREES) == len(withheld)
    assert json.loads((d / "summary.json").read_text())["fidelity"] == summary["fidelity"]
