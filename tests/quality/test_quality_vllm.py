"""The on-policy arm regenerated through the pipeline (`make test-vllm`; marked `vllm`): a real vLLM 0.32.0 on CPU
serving the converted SmolLM2 folder, generate.ipynb (`backend: local`, temperature 0) asking each ShareGPT
conversation's first two user turns, each on the model's own earlier answer; the records token-exact and on the same
(conversation, turn)s as the off-policy arm's."""
from __future__ import annotations

import json
import os

import pytest

from eagledata.notebooks import generate_notebook
from eagledata.quality.config import QualityConfig
from eagledata.quality.experiment import Experiment, ExperimentSeams
from eagledata.text import load_tokenizer, prompt_ids
from tests.conftest import ROOT

pytestmark = pytest.mark.vllm


def test_the_on_policy_arm_regenerated_by_vllm_through_generate(smollm2_dir, smollm2_cache, tmp_path):
    vllm_python = os.environ.get("EAGLEDATA_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    config = QualityConfig(experiment="vllm", output_dir=str(tmp_path), cache_dir=str(smollm2_cache),
                           target=str(smollm2_dir), conversations=3, max_turns=2, answer_tokens=32, sample_tokens=1024,
                           regenerate="vllm", vllm_python=vllm_python, vllm_concurrency=8, threads=2)
    exp = Experiment(config, ExperimentSeams(generate=generate_notebook))
    asks = exp.arm_data.prompts()
    for arm in ("on_policy", "off_policy"):
        exp.arm_data.arm_records(arm, asks)
    on = [json.loads(line) for line in exp.files.records("on_policy").read_text().splitlines()]
    off = [json.loads(line) for line in exp.files.records("off_policy").read_text().splitlines()]
    tok = load_tokenizer(smollm2_dir)
    assert {r["conversation_id"] for r in on} == {a.id for a in asks}
    for r in on:
        assert r["meta"]["ids_source"] == "server" and r["meta"]["sampling"] == {"temperature": 0.0}
        assert r["prompt_ids"] == prompt_ids(tok, r["messages"])
        if r["finish_reason"] == "stop":
            assert r["output_ids"][-1] == tok.structure.end_of_turn
        else:
            assert len(r["output_ids"]) == 32
    by_turn = {(r["conversation_id"], r["turn"]): r for r in on}
    for (cid, turn), r in by_turn.items():
        if turn == 2:  # asked on the model's own first answer
            assert r["messages"][-2] == {"role": "assistant", "content": by_turn[(cid, 1)]["content"]}
    assert set(by_turn) <= {(r["conversation_id"], r["turn"]) for r in off}
