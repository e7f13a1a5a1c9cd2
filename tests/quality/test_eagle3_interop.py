"""τ with an EAGLE-3 drafter as speculators 0.9.0 trains and saves it (`make test-interop`: .venv-interop).

A tiny Llama target; its own greedy answers exported in the speculators layout (extract) and trained on by
speculators' own loop on CPU (`python -m eagledata.quality.train`); then, in the speculators environment
(tests/helpers/interop/eagle3_drafting.py), our drafting of the saved checkpoint is held to speculators' own
forward chain by chain, speculative decoding with it is lossless, and the trained drafter beats the same drafter
with random layers; finally the τ command itself runs there on a planted question file and writes tau.json.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from eagledata.quality.measure import measure_command
from eagledata.quality.speculative import Verifier, greedy_decode
from eagledata.quality.tau import read_tau
from eagledata.training import ExtractOptions, extract
from eagledata.training.assembly import Sample
from tests.helpers import HELPERS
from tests.helpers.quality import prompts, sharp_llama, word_tokenizer

pytestmark = pytest.mark.interop
K = 4
ANSWER = 40  # tokens of each training answer
TRAIN_FLAGS = ["--speculator-type", "eagle3", "--hidden-states-backend", "file", "--draft-vocab-size", "64",
               "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0",
               "--on-missing", "raise", "--mask-token-id", "0", "--total-seq-len", "256", "--seed", "0",
               "--lr", "3e-3", "--epochs", "4"]


def run_interop(interop_python, args, tmp_path, timeout=900):
    """A command in the speculators environment, eagledata's lib/ first on its path."""
    _, env_extra = measure_command(interop_python)
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run([interop_python, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path)


def test_an_eagle3_drafter_trained_by_speculators_drafts_losslessly_and_beats_random_layers(interop_python,
                                                                                            tmp_path):
    model = sharp_llama(seed=0, num_layers=8)
    verifier = tmp_path / "target"
    model.save_pretrained(verifier)
    word_tokenizer().save_pretrained(verifier)
    target = Verifier(model)
    train_prompts = prompts(64, seed=1)
    samples = []
    for i, p in enumerate(train_prompts):
        answer = greedy_decode(target, p, max_new_tokens=ANSWER)
        samples.append(Sample(id=f"s{i}", dataset="tiny", input_ids=p + answer,
                              loss_mask=[0] * len(p) + [1] * len(answer), truncated=True))
    data = extract(samples, tmp_path, "spec", model, options=ExtractOptions(layout="speculators"),
                   progress=False).directory

    out = tmp_path / "train"
    out.mkdir()
    done = run_interop(interop_python, ["-m", "eagledata.quality.train", str(out / "m.jsonl"),
                                        *TRAIN_FLAGS, "--verifier-name-or-path", str(verifier), "--data-path",
                                        str(data), "--save-path", str(out / "checkpoints"), "--log-dir",
                                        str(out / "logs")], out)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = max((p for p in (out / "checkpoints").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))

    spec = tmp_path / "spec.json"
    held_out = prompts(6, seed=2)
    spec.write_text(json.dumps({"k": K, "max_new_tokens": 48, "prompts": held_out,
                                "sequences": [held_out[i] + greedy_decode(target, held_out[i], max_new_tokens=24)
                                              for i in range(2)]}))
    report_file = tmp_path / "report.json"
    done = run_interop(interop_python, [str(HELPERS / "interop" / "eagle3_drafting.py"), str(checkpoint),
                                        str(verifier), str(spec), str(report_file)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_file.read_text())
    # speculators' defaults: the aux layers of the EAGLE-3 rule, a sliding-window layer, post-norm chain states
    assert report["config"] == {"aux_layers": [2, 4, 5], "layer_types": ["sliding_attention"],
                                "sliding_window": 2048, "norm_output": True, "draft_vocab_size": 64}
    # our chains = speculators' own forward: the tokens, and every step's logits to float rounding (7e-7 of the
    # largest logit measured), with the default window and with one short enough to bind (a chain step that
    # anchors its window on itself instead of the last verified row: 0.05)
    for chain in (report["chain"], report["chain_window"]):
        assert chain["compared"] > 200 and chain["mismatches"] == 0 and chain["max_logit_difference"] < 1e-4, chain
    assert all(report["lossless"]) and len(report["lossless"]) == 12
    trained = sum(report["tau_trained"]) / 6
    untrained = sum(report["tau_untrained"]) / 6
    assert untrained < 1.3 and trained > untrained + 0.3, report  # measured: 1.02 and 1.70

    # the τ command, in the environment where the checkpoint loads, on a planted question file
    questions = tmp_path / "question.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "x", "turns": [f"w{10 + i} w{40 + i}",
                                                                                          f"w{70 + i}"]}) + "\n"
                                 for i in range(3)))
    tau = tmp_path / "quality" / "tiny" / "on_policy" / "tau.json"
    cmd, env_extra = measure_command(interop_python, "--verifier", str(verifier), "--drafter", f"eagle3:{checkpoint}",
                                     "--questions", str(questions), "--out", str(tau), "--k", str(K),
                                     "--max-new-tokens", "24", "--samples", str(len(samples)))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **env_extra))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = read_tau(tau)
    assert (doc["questions"], doc["turns"], doc["k"], doc["samples"]) == (3, 6, K, 64)
    assert doc["drafter"] == f"eagle3:{checkpoint}" and doc["tau_mean"] > 1


def test_the_batched_eagle3_drafter_drafts_what_one_drafter_per_row_drafts(interop_python, tmp_path):
    """`BatchEagle3Drafter` (each chain step one forward for all rows) against `PerRow` of `Eagle3Drafter` (one
    forward per row and step) on a speculators-built drafter in batched decodes where rows start, accept and finish
    at different steps: every call's chains are the same and every step's draft logits to float rounding (7e-7 of
    the largest measured; a chain step one slot off, planted: 0.02; query heads paired with the wrong key/value
    head: 0.05), with the sliding window binding or not and `norm_output` on or off
    (tests/helpers/interop/eagle3_batched.py), and both decodes are plain greedy decoding."""
    model = sharp_llama(seed=0, num_layers=8, hidden_size=128)  # 4 query heads on 2 key/value heads
    verifier = tmp_path / "target"
    model.save_pretrained(verifier)
    word_tokenizer().save_pretrained(verifier)
    report_file = tmp_path / "batched.json"
    done = run_interop(interop_python, [str(HELPERS / "interop" / "eagle3_batched.py"), str(verifier),
                                        str(report_file)], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(report_file.read_text())["cases"]
    assert [(c["norm_output"], c["window"]) for c in cases] == [(True, 2048), (True, 6), (False, 6)]
    for case in cases:
        assert case["calls"] > 30 and case["distinct"] > 10 and case["lossless"], case
        assert case["equal"] and case["max_logit_difference"] < 1e-4, case
