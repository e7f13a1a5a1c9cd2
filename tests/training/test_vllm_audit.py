"""The fidelity audit through a real vLLM (`make test-vllm`; marked `vllm`, left out of `make test`).

The audit's honest case (`three_providers` of tests/helpers/audit_providers.py: A and B sample from the tiny target,
C from a copy rounded to 3 bits, plus one junk sample of A), scored by the vllm backend: the target's
log-probabilities come back as `prompt_logprobs` in the same request that carries the hidden-states file. vLLM
computes in bf16, the transformers path in float32: the audit must reach the same verdicts, and each sample's score
must agree with the transformers one within that rounding.
"""
from __future__ import annotations

import pytest
import torch

from eagledata.training import ExtractOptions, extract, extract_with_vllm
from eagledata.training.audit import audit
from eagledata.training.scoring import read_scores
from eagledata.training.vllm_backend import VllmOptions
from tests.helpers.audit_providers import three_providers
from tests.helpers.vllm_server.harness import start_vllm

pytestmark = pytest.mark.vllm
LAYERS = [1, 2, 3]  # the 4-layer target's EAGLE-3 rule repeats a layer, which vLLM cannot capture


@pytest.fixture(scope="module")
def providers(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm-audit")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only contend with the server for the 2 cores
    try:
        target, samples = three_providers()
        target.save_pretrained(str(base / "checkpoint"))
        reference = extract(samples, base / "transformers", "tiny", target, progress=False,
                            options=ExtractOptions(layers=LAYERS, max_tokens_per_batch=4096))
    finally:
        torch.set_num_threads(threads)
    server = start_vllm(base / "checkpoint", base / "connector", layers=LAYERS)
    try:
        got = extract_with_vllm(samples, base / "vllm", "tiny", base / "checkpoint", progress=False,
                                vllm=VllmOptions(server=server.url, shared_storage_path=str(base / "connector")),
                                options=ExtractOptions(layers=LAYERS))
    finally:
        server.stop()
    assert got.complete and got.manifest["backend"] == "vllm"
    return read_scores(reference.directory), read_scores(got.directory)


def test_vllm_scores_equal_the_transformers_scores_within_bf16(providers):
    reference, got = providers
    assert [r.id for r in got] == [r.id for r in reference]
    for a, b in zip(got, reference):
        assert (a.provider, a.sampling, a.score.tokens) == (b.provider, b.sampling, b.score.tokens)
        # per token, bf16 logits of this peaked head (|logit| up to ~40, spacing 0.25) move an NLL by ~0.1
        assert abs(a.score.mean_nll - b.score.mean_nll) < 0.25 + 0.02 * b.score.mean_nll, a.id


def test_the_audit_through_vllm_flags_the_degraded_provider_and_the_junk_sample(providers):
    """144 samples (48 per provider, 16..48 output tokens each) plus one junk; significance 0.01."""
    _, got = providers
    report = audit(got)
    print(report.table()[["samples", "tokens", "mean_nll", "diff", "z", "df", "p_adjusted", "verdict"]].to_string())
    assert report.suspects == ["C"]
    assert report.provider("C").p_adjusted < report.significance and report.provider("C").diff > 0
    assert {p.provider: p.verdict for p in report.providers} == {"A": "consistent", "B": "consistent",
                                                                 "C": "suspect"}
    assert report.to_publish()["outliers"] == ["A-junk"]
