"""The canonical experiment's whole path at test size (`make test-interop`: speculators 0.9.0 in .venv-interop):
ShareGPT-shaped prompts → both arms → equal supervised tokens → hidden states → speculators' own training loop →
τ on MT-Bench-shaped questions, with the three checks: speculative decoding emits plain greedy decoding's tokens
(every drafter, both turns: the arms, the bounds and the free baselines n-gram and EAGLE-3 with random layers), the
target drafting for itself gives τ = k + 1, random weights τ ≈ 1. vLLM's count is off here (no vLLM in make
test-interop; test_run_checks.py fakes it)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from eagledata.notebooks import read_results, run_notebook
from eagledata.quality.arms import ARMS
from eagledata.quality.experiment import Experiment, ExperimentSeams
from eagledata.quality.measure import HFChat, load_causal_lm, load_hf_tokenizer
from eagledata.quality.speculative import Verifier, greedy_decode
from eagledata.quality.tau import read_tau
from tests.helpers.quality_experiment import tiny_config

pytestmark = pytest.mark.interop


def test_the_whole_experiment_at_test_size(interop_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # as a Jupyter kernel (quality.ipynb, make quality) sets it: issue 60
    config = tiny_config(tmp_path, interop_python=interop_python)
    said: list[str] = []
    summary = Experiment(config, ExperimentSeams(say=said.append)).run()
    files = Experiment(config).files

    # the trainer's console in plain text: its own progress lines, no control code in any command's log
    for arm in ARMS:
        log = (files.arm(arm) / "train" / "train.log").read_text(encoding="utf-8")
        assert re.search(r"\n\d\d:\d\d:\d\d INFO epoch 2/2 step (\d+)/\1 loss \d[\d.e+]* [\d.]+ (it/s|s/it) ETA 0s "
                         r"val loss \d[\d.e+]* \| epoch 2 done", log)
    for log_file in (tmp_path / "outputs").rglob("*.log"):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", log_file.read_text(encoding="utf-8").replace("\n", ""))
    assert not any(re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line) for line in said)

    # equal supervised tokens, and each arm's τ file says what it trained on
    rows = {r["drafter"]: r for r in summary["rows"]}
    assert set(rows) == {*ARMS, "self", "random", "ngram", "eagle3-random"} == {*ARMS, *config.bounds}
    for arm in ARMS:
        doc = read_tau(files.tau(arm))
        assert doc["supervised_tokens"] == summary["supervised_tokens"] > 0 and doc["train_seconds"] > 0
        assert doc["drafter"] == f"eagle3:{files.checkpoint(arm)}" and (files.checkpoint(arm) / "config.json").is_file()
        assert (files.export(arm) / "token_freq.pt").is_file()
        # all of the arm's training samples trained on, the held-out ones validated on, per epoch in tau.json
        assert doc["train_samples"] == Experiment(config).arm_data.split(arm)[0] and doc["validation_samples"] > 0
        assert [e["epoch"] for e in doc["epoch_losses"]] == list(range(config.epochs))
        assert all(e["train_loss"] > 0 and e["validation_loss"] > 0 for e in doc["epoch_losses"])
        assert summary["epoch_losses"][arm] == doc["epoch_losses"]
        assert (files.export(arm) / f"d2t-{config.draft_vocab_size}.npy").is_file()  # built from the shared counts
        assert 1 <= doc["tau_mean"] <= config.k + 1 and doc["questions"] == 2 and doc["turns"] == 4
    d2t = [np.load(files.export(arm) / f"d2t-{config.draft_vocab_size}.npy") for arm in ARMS]
    assert (d2t[0] == d2t[1]).all()  # one draft vocabulary for both arms
    # the bounds: k + 1 exactly, and about 1
    assert rows["self"]["tau_mean"] == config.k + 1 and rows["self"]["per_position_acceptance"] == [1.0] * config.k
    assert rows["random"]["tau_mean"] < 1.3
    # the baselines on the arms' questions, the EAGLE-3 one through the EAGLE-3 path on the on-policy checkpoint
    assert rows["ngram"]["questions"] == rows["eagle3-random"]["questions"] == rows["on_policy"]["questions"]
    assert read_tau(files.bound("eagle3-random"))["drafter"] == f"eagle3-random:{files.checkpoint('on_policy')}"
    assert set(summary["per_category"]) >= {*ARMS, "ngram", "eagle3-random"} and summary["vllm"] is None
    # every drafter measured against the one greedy trace, recorded by plain greedy decoding (τ = 1)
    assert {read_tau(p)["verify"] for p in [*map(files.tau, ARMS), *map(files.bound, config.bounds)]} == {"trace"}
    assert read_tau(files.bound("none"))["tau_mean"] == 1.0 and files.trace.is_file()

    # lossless: every drafter emitted plain greedy decoding's tokens, turn by turn
    def outputs(path):
        return [json.loads(line)["output_ids"] for line in path.read_text().splitlines()]

    transcripts = {arm: outputs(files.tau(arm).with_name("tau.transcripts.jsonl")) for arm in ARMS}
    transcripts.update({d: outputs(files.bound(d).with_name("tau.transcripts.jsonl")) for d in config.bounds})
    assert all(t == transcripts["self"] for t in transcripts.values())
    target_dir = summary["target"]
    chat = HFChat(load_hf_tokenizer(target_dir))
    model = load_causal_lm(target_dir)
    first = json.loads(files.tau("on_policy").with_name("tau.transcripts.jsonl").read_text().splitlines()[0])
    from eagledata.quality.sources import read_mtbench

    question = read_mtbench(next((tmp_path / "cache").glob("nvidia_mtbench*.whl"))).questions[0]
    greedy = greedy_decode(Verifier(model), chat.render([{"role": "user", "content": question.turns[0]}]),
                           max_new_tokens=config.max_new_tokens, stop_ids=chat.stop_ids(model))
    assert first["output_ids"][0] == greedy

    # a rerun keeps every stage
    said.clear()
    again = Experiment(config, ExperimentSeams(say=said.append)).run()
    assert again["rows"] == summary["rows"] and not any(line.endswith("...") for line in said)

    # quality.ipynb on the finished experiment (every stage kept): the table, the plot and the conclusion
    params = {f: getattr(config, f) for f in ("experiment", "output_dir", "cache_dir", "target", "conversations",
                                              "max_turns", "answer_tokens", "sample_tokens", "batch_size", "epochs",
                                              "lr", "draft_vocab_size", "total_seq_len", "k", "questions",
                                              "max_new_tokens", "bound_questions", "threads", "interop_python",
                                              "regenerate", "validation_conversations", "data_seed", "bounds",
                                              "vllm_check")}
    half = summary["supervised_tokens"] // 2  # and a learning curve's smaller size on its data: speculators' own
    params["curve_tokens"] = [half]  # trainer reads the view of each arm's rows, τ of both arms against the trace
    out = run_notebook("quality", tmp_path / "quality.out.ipynb", params, cwd=tmp_path, project_root=tmp_path)
    results = read_results(out)
    published = results["quality"]
    assert published["rows"] == summary["rows"] and "supervised tokens per arm" in published["conclusion"]
    assert published["per_category"] == summary["per_category"] and "ngram" in published["baseline_verdict"]
    sized = Experiment(tiny_config(tmp_path, experiment=f"{config.experiment}-t{half}")).files
    assert [(r["supervised_tokens"], r["arm"]) for r in results["curve"]["rows"]] == [
        (half, "on_policy"), (half, "off_policy"), (summary["supervised_tokens"], "on_policy"),
        (summary["supervised_tokens"], "off_policy")]
    assert results["curve"]["fit"]["sizes"] == [half, summary["supervised_tokens"]]
    assert results["curve"]["differences"][1]["mean"] == pytest.approx(summary["difference"]["mean"])
    for arm in ARMS:
        doc = read_tau(sized.tau(arm))
        assert doc["supervised_tokens"] == half and doc["verify"] == "trace" and 1 <= doc["tau_mean"] <= config.k + 1
        assert doc["train_samples"] < summary["arms"][ARMS.index(arm)]["samples"]
        steps = [json.loads(line) for line in (sized.arm(arm) / "train" / "metrics.jsonl").read_text().splitlines()]
        errors = [m["train"]["error_records"] for m in steps if "train" in m]
        assert errors and not any(errors)  # its reader took every row of the view (a mismatch is skipped, counted)
