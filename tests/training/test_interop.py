"""The trainers' own code reads what hidden_states.ipynb exports (`make test-interop`).

speculators 0.9.0 pins transformers<=5.19, so it lives in its own environment (`.venv-interop`, made by
`make test-interop`); the notebook runs here, the trainer's reader runs there on the files, and the states it
yields are compared here with a batch-1 transformers reference. SpecForge (sglang + CUDA torch) cannot be
installed: its reader is reproduced in tests/helpers/specforge_reader.py and covered in test_hidden_states.py.
"""
import json
import subprocess
from collections import Counter

import pytest
import torch

from eagledata.notebooks import run_notebook
from eagledata.records import load_records
from eagledata.text.roundtrip import tool_cases
from eagledata.training import find_decoder
from eagledata.training.tiny import build_tiny_model
from tests.helpers import HELPERS
from tests.helpers.records import make_conversation, make_record, tool_record

pytestmark = pytest.mark.interop
H, L = 64, 8
LAYERS = [2, 4, 5]


def test_speculators_arrowdataset_reads_every_exported_sample(interop_python, tok, tmp_path):
    """One-turn prompts, conversations of 2 and 3 turns and an agent's tool-call turns: speculators' own
    `ArrowDataset` reads one sample per turn (its history, tool results included, with loss 0, its answer, tool-call
    section included, with loss 1), and its trainer builds the draft vocabulary (`--draft-vocab-size`) from the
    set's `token_freq.pt`, which holds what its own counter counts."""
    records = tmp_path / "records.jsonl"
    turns = [*make_conversation(tok, "c2", ["name a prime", "and a larger one?"], system="Be brief."),
             *make_conversation(tok, "c3", ["tell me a story", "go on", "and then?"], words=30),
             *(tool_record(tok, c) for c in tool_cases())]
    records.write_text("".join(make_record(tok, i, words=(i * 37) % 120 + 1).to_json() + "\n" for i in range(12))
                       + "".join(r.to_json() + "\n" for r in turns))
    model_dir = tmp_path / "tiny-kimi"
    model = build_tiny_model("kimi_k25", model_dir, hidden_size=H, num_layers=L)
    run_notebook("hidden_states", tmp_path / "hidden_states.out.ipynb",
                 dict(datasets=[str(records)], output_dir=str(tmp_path / "out"), name="spec", model=str(model_dir),
                      tokenizer=str(tok.directory), layout="speculators", max_tokens_per_batch=512, device="cpu"),
                 cwd=tmp_path, project_root=tmp_path)
    data_path = tmp_path / "out" / "hidden_states" / "spec"

    dump = tmp_path / "read.pt"
    done = subprocess.run([interop_python, str(HELPERS / "interop" / "read_speculators.py"), str(data_path),
                           str(dump), str(model_dir), "32000", "16"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"rows": 21, "speculators": "0.9.0"}
    got = torch.load(dump, weights_only=False)

    expected = load_records(records)
    assert [r.id for r in expected][-9:-4] == ["c2", "c2#2", "c3", "c3#2", "c3#3"]
    assert sum(bool(r.tool_calls) for r in expected) == 3  # the section (163595 …) is supervised with the answer
    assert all(163595 in r.output_ids for r in expected if r.tool_calls)
    assert got["ids"] == [r.id for r in expected] and got["approx_lengths"] == [len(r.input_ids) for r in expected]
    norm = find_decoder(model).module.norm
    for record, item in zip(expected, got["items"]):
        # ids identical to the records, loss over exactly the model's output tokens
        assert item["input_ids"].tolist() == record.prompt_ids + record.output_ids
        assert item["loss_mask"].tolist() == record.loss_mask
        with torch.no_grad():
            ref = model(torch.tensor([record.input_ids]), output_hidden_states=True).hidden_states
            aux = torch.cat([ref[i][0] for i in LAYERS], -1)
            # speculators applies the verifier's norm to the last state itself: stored pre-norm
            last = norm(item["verifier_last_hidden_states"].float())
        assert item["hidden_states"].dtype == torch.bfloat16 and item["hidden_states"].shape == aux.shape
        torch.testing.assert_close(item["hidden_states"].float(), aux, rtol=2 ** -7, atol=1e-3)  # bf16 rounding
        torch.testing.assert_close(last, ref[-1][0], rtol=2 ** -6, atol=2e-3)
    tokens = sum(len(r.input_ids) for r in expected)
    assert got["batch_shapes"]["hidden_states"] == [1, 8192, 3 * H] and tokens - len(expected) <= 8192

    # token_freq.pt: what speculators' own save_token_frequency_distribution counts, {int id: int count} over the
    # supervised tokens (every answer's output ids), loaded as its trainer loads it
    freq = got["token_freq"]["ours"]
    supervised = Counter(t for r in expected for t in r.output_ids)
    assert freq == got["token_freq"]["speculators"] == dict(supervised)
    assert all(type(k) is int and type(v) is int for k, v in freq.items())
    # its trainer's parse_vocab_mappings builds d2t/t2d from it: --draft-vocab-size 32000 (Kimi: 163,840 ids) ...
    full = got["vocab_mappings"][32000]
    d2t, t2d = full["d2t"], full["t2d"]
    assert full["draft_vocab_size"] == 32000 and d2t.shape == (32000,) and t2d.shape == (163_840,)
    assert t2d.dtype == torch.bool and int(t2d.sum()) == 32000
    draft_ids = (d2t + torch.arange(32000)).tolist()  # target id = draft index + d2t[draft index]
    assert set(supervised) <= set(draft_ids) and all(t2d[i] for i in supervised)  # every supervised id fits
    # ... and a draft vocabulary smaller than the supervised ids keeps the most frequent ones
    small = got["vocab_mappings"][16]
    top = [t for t, _ in sorted(supervised.items(), key=lambda kv: (-kv[1], kv[0]))[:8]]
    assert len(supervised) > 16 and small["d2t"].shape == (16,) and int(small["t2d"].sum()) == 16
    assert set(top) <= set((small["d2t"] + torch.arange(16)).tolist()) and all(small["t2d"][t] for t in top)
