"""The target's scores of every output token, taken during extraction (`eagledata.training.scoring`): exact
against the model's own logits, chunked, stored with the states (every layout, resume), carried and filtered by
an export."""
import json
import random

import pytest
import torch

from eagledata.errors import InputError
from eagledata.training import ExtractOptions, HiddenStates, Sample, extract
from eagledata.training.convert import convert
from eagledata.training.memory import kimi_k25_config
from eagledata.training.scoring import (
    ExcludeSamples,
    audit_cost,
    read_scores,
    score_sample,
    scored_tokens,
    token_logprobs,
)
from eagledata.training.source import scored_positions
from eagledata.training.tiny import build_tiny_model

V = 512


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", hidden_size=64, num_layers=4, vocab_size=V, seed=3)


def make_samples(n=14, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, output = rng.randint(3, 30), rng.randint(1, 50)
        ids = [rng.randrange(V) for _ in range(prompt + output)]
        out.append(Sample(f"s{i}", "B1" if i % 3 else "B2", ids, [0] * prompt + [1] * output, False,
                          provider="A" if i % 2 else "B", sampling='{"temperature":1.0}'))
    return out


def reference_logprobs(model, sample):
    """float64 log-softmax of the model's own logits, at the scored positions."""
    with torch.no_grad():
        logits = model(torch.tensor([sample.input_ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return torch.tensor([lp[j - 1, sample.input_ids[j]].item() for j in scored_positions(sample)], dtype=torch.float64)


def run(samples, out, model, name="set", **kw):
    return extract(samples, out, name, model, options=ExtractOptions(**kw), progress=False)


def test_scored_positions_are_the_output_tokens_that_have_a_context():
    s = Sample("x", "", [5, 6, 7, 8, 9], [0, 0, 1, 1, 1], False)
    assert scored_positions(s) == [2, 3, 4]
    assert scored_positions(Sample("y", "", [5, 6], [1, 1], False)) == [1]  # position 0 has no context
    where, tokens, counts = scored_tokens([s, Sample("y", "", [5, 6], [1, 1], False)])
    assert where == [(0, 1), (0, 2), (0, 3), (1, 0)] and tokens == [7, 8, 9, 6] and counts == [3, 1]


class CountingHead(torch.nn.Module):
    """The model's LM head, recording how many rows each call gets (the audit's peak is one chunk's logits)."""

    def __init__(self, head):
        super().__init__()
        self.head, self.rows = head, []

    def forward(self, h):
        self.rows.append(h.shape[0])
        return self.head(h)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_log_probabilities_equal_the_full_log_softmax(model, chunk):
    samples = make_samples(5)
    longest = max(len(s) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(samples):
        ids[r, :len(s)], mask[r, :len(s)] = torch.tensor(s.input_ids), 1
    with torch.no_grad():
        final = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        where, tokens, counts = scored_tokens(samples)
        head = CountingHead(model.lm_head)
        got = token_logprobs(final, where, tokens, head, chunk).split(counts)
    assert max(head.rows) == min(chunk, len(tokens)) and sum(head.rows) == len(tokens)
    for s, lp in zip(samples, got):
        assert lp.dtype == torch.float32
        torch.testing.assert_close(lp.double(), reference_logprobs(model, s), atol=1e-4, rtol=1e-5)


def test_sample_score_statistics():
    sc = score_sample(torch.tensor([-0.005, -0.3, -1.2, -25.0]))
    assert sc.tokens == 4 and sc.nll_max == 25.0
    assert sc.nll_sum == pytest.approx(26.505) and sc.nll_sumsq == pytest.approx(0.005**2 + 0.09 + 1.44 + 625)
    assert sc.mean_nll == pytest.approx(26.505 / 4)
    assert sum(sc.hist) == 4 and sc.hist[0] == 1 and sc.hist[4] == 1 and sc.hist[6] == 1 and sc.hist[-1] == 1
    for bad in (float("-inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^non-finite log-probabilities$") as e:
            score_sample(torch.tensor([-1.0, bad]))
        assert type(e.value) is ValueError


def test_extraction_stores_each_samples_exact_score_in_every_layout(model, tmp_path):
    samples = make_samples()
    lines = {}
    for layout, final in (("eagledata", None), ("speculators", None), ("specforge", None)):
        r = run(samples, tmp_path / layout, model, layout=layout, final=final, max_tokens_per_batch=200,
                score_chunk_tokens=16)
        assert r.complete
        rows = read_scores(r.directory)
        assert [x.id for x in rows] == [s.id for s in samples]  # set order, every sample once
        for x, s in zip(rows, samples):
            assert (x.dataset, x.provider, x.sampling) == (s.dataset, s.provider, s.sampling)
            ref = -reference_logprobs(model, s)
            assert x.score.tokens == len(scored_positions(s))
            assert x.score.nll_sum == pytest.approx(float(ref.sum()), rel=1e-5, abs=1e-4)
            assert x.score.nll_max == pytest.approx(float(ref.max()), rel=1e-5, abs=1e-4)
        m = r.manifest["scoring"]
        assert m["scored_samples"] == len(samples) and m["unscored_samples"] == 0
        assert m["scored_tokens"] == sum(len(scored_positions(s)) for s in samples)
        lines[layout] = [(x.id, x.score.tokens, round(x.score.nll_sum, 3)) for x in rows]
        # the index a trainer reads is unchanged: no score keys in it
        assert all(set(json.loads(line)) == {"id", "shard", "offset", "length"}
                   for line in (r.directory / "index.jsonl").read_text().splitlines())
    assert lines["eagledata"] == lines["speculators"] == lines["specforge"]


# Float32 rounding: CPU matmul kernels round differently for different batch shapes (a resume may batch the rest
# otherwise), so a score recomputed in another batch agrees to float32 precision, not bit for bit. The log-softmax is
# float32 over a 512-word vocabulary: per token |error| <~ 1e-5 relative; summed over <= 50 tokens, 1e-5 relative
# (1e-4 absolute near zero) is ~100x the spread measured here (4e-9 relative on an Intel Xeon) and ~1e5x under the
# gap between two different models' sums.
SCORE_RTOL, SCORE_ATOL = 1e-5, 1e-4


def test_scores_survive_a_kill_and_resume(model, tmp_path):
    """What was stored before the kill stays byte for byte; the rest is scored again to float32 precision; no sample
    is lost or doubled."""
    samples = make_samples()
    whole = run(samples, tmp_path / "whole", model, max_tokens_per_batch=120)

    def kill(n):
        if n == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(samples, tmp_path / "cut", "set", model, options=ExtractOptions(max_tokens_per_batch=120,
                                                                                  shard_bytes=1), progress=False,
                on_batch=kill)
    cut = tmp_path / "cut" / "hidden_states" / "set"
    stored = {json.loads(line)["id"]: json.loads(line)["score"]
              for part in (cut / "index.parts").glob("*.jsonl") for line in part.read_text().splitlines()}
    shards_before = {p.name: p.read_bytes() for p in cut.glob("shard-*.safetensors")}
    assert 0 < len(stored) < len(samples) and shards_before
    again = run(samples, tmp_path / "cut", model, max_tokens_per_batch=300)  # another batch size
    assert again.skipped == len(stored) and again.extracted == len(samples) - len(stored)
    assert {p.name: p.read_bytes() for p in cut.glob("shard-*.safetensors") if p.name in shards_before} == shards_before
    resumed, fresh = read_scores(again.directory), read_scores(whole.directory)
    assert [r.id for r in resumed] == [r.id for r in fresh] == [s.id for s in samples]  # every sample once, in order
    for r, f in zip(resumed, fresh):
        if r.id in stored:  # carried from before the kill, exactly
            assert r.score.to_dict() == stored[r.id]
        assert (r.dataset, r.provider, r.sampling, r.score.tokens) == \
            (f.dataset, f.provider, f.sampling, f.score.tokens)
        assert sum(r.score.hist) == sum(f.score.hist) == r.score.tokens
        for name in ("nll_sum", "nll_sumsq", "nll_max"):
            assert getattr(r.score, name) == pytest.approx(getattr(f.score, name), rel=SCORE_RTOL, abs=SCORE_ATOL), \
                (r.id, name)


def test_score_off_writes_no_scores_and_a_decoder_without_head_is_refused(model, tmp_path):
    samples = make_samples(4)
    r = run(samples, tmp_path, model, score=False)
    assert r.manifest["scoring"] is None and not (r.directory / "scores.jsonl").exists()
    with pytest.raises(InputError, match="LM head"):
        run(samples, tmp_path / "bare", model.model)  # the decoder alone: nothing to score with
    run(samples, tmp_path / "bare2", model.model, score=False)  # it still extracts states


def test_export_leaves_out_a_provider_and_outliers_and_records_why(model, tmp_path):
    samples = make_samples()
    src = run(samples, tmp_path, model, name="src", layout="speculators").directory
    rows = {r.id: r for r in read_scores(src)}
    worst = max(rows.values(), key=lambda r: r.score.mean_nll if r.provider == "B" else 0)
    bound = worst.score.mean_nll - 1e-6  # leaves out exactly the worst of B's samples (and any of A above it)
    above = {i for i, r in rows.items() if r.score.mean_nll > bound}
    exclude = ExcludeSamples(providers=("A",), max_sample_nll=bound, ids=("s0",), reason="A is suspect: z 9.1")
    dst = tmp_path / "export"
    r = convert(src, dst, "speculators", exclude=exclude, progress=False)
    gone = {s.id for s in samples if s.provider == "A"} | above | {"s0"}
    kept = [s for s in samples if s.id not in gone]
    hs = HiddenStates(dst)
    assert hs.ids == [s.id for s in kept]  # rows renumbered, in set order
    ex = r.manifest["excluded"]
    assert ex["providers"] == ["A"] and ex["max_sample_nll"] == bound and ex["ids"] == ["s0"]
    assert ex["reason"] == "A is suspect: z 9.1" and ex["samples"] == len(gone) and ex["excluded_ids"] == sorted(gone)
    assert ex["by"]["listed"] == 1 and ex["by"]["provider A"] == sum(s.provider == "A" for s in samples)
    assert [x.id for x in read_scores(dst)] == [s.id for s in kept]
    for s in kept:
        assert hs[s.id].input_ids.tolist() == s.input_ids
    # a resume must apply the same rule
    with pytest.raises(InputError, match="exclude"):
        convert(src, dst, "speculators", exclude=ExcludeSamples(providers=("B",)), progress=False)
    with pytest.raises(InputError, match="not in the set"):
        convert(src, tmp_path / "x", "eagledata", exclude=ExcludeSamples(ids=("nope",)), progress=False)


def test_export_refuses_to_judge_unscored_samples(model, tmp_path):
    src = run(make_samples(4), tmp_path, model, score=False).directory
    with pytest.raises(InputError, match="no score"):
        convert(src, tmp_path / "x", "eagledata", exclude=ExcludeSamples(providers=("A",)), progress=False)


def test_audit_adds_under_5_percent_of_a_k25_forward_and_a_chunk_bounded_peak():
    cost = audit_cost(kimi_k25_config(), chunk_tokens=512)
    assert 30e9 < cost["decoder_parameters"] < 31e9  # + embedding and head (2 x 1.17 B): K2.5's 32 B active
    assert cost["added_flops_per_token"] == 2 * 7168 * 163_840 + 5 * 163_840
    assert cost["ratio"] < 0.05
    assert cost["peak_bytes"] == 512 * 163_840 * 8  # float32 logits + logsumexp's temporary


def test_convert_command_takes_the_exclusion(model, tmp_path, capsys):
    from eagledata.hidden_states import main

    samples = make_samples(6)
    src = run(samples, tmp_path, model, name="src").directory
    assert main(["convert", "--layout", "eagledata", str(src), str(tmp_path / "out"), "--exclude-providers", "B",
                 "--reason", "B suspect"]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["excluded"] == sum(s.provider == "B" for s in samples)
    assert HiddenStates(tmp_path / "out").ids == [s.id for s in samples if s.provider != "B"]
