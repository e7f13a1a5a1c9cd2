"""The trainers' own code reads what hidden_states.ipynb exports (`make test-interop`).

speculators 0.9.0 pins transformers<=5.19, so it lives in its own environment (`.venv-interop`, made by
`make test-interop`); the notebook runs here, the trainer's reader runs there on the files, and the states it
yields are compared here with a batch-1 transformers reference. SpecForge (sglang + CUDA torch) cannot be
installed: its reader is reproduced in tests/specforge_reader.py and covered in test_hidden_states.py.
"""
import json
import subprocess
from pathlib import Path

import pytest
import torch

from eagledata.notebooks import run_notebook
from eagledata.records import load_records
from eagledata.training import find_decoder
from eagledata.training.tiny import build_tiny_model
from test_hidden_states import make_record

pytestmark = pytest.mark.interop
ROOT = Path(__file__).resolve().parents[1]
H, L = 64, 8
LAYERS = [2, 4, 5]


def test_speculators_arrowdataset_reads_every_exported_sample(interop_python, tok, tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text("".join(make_record(tok, i, words=(i * 37) % 120 + 1).to_json() + "\n" for i in range(12)))
    model_dir = tmp_path / "tiny-kimi"
    model = build_tiny_model("kimi_k25", model_dir, hidden_size=H, num_layers=L)
    run_notebook("hidden_states", tmp_path / "hidden_states.out.ipynb",
                 dict(datasets=[str(records)], output_dir=str(tmp_path / "out"), name="spec", model=str(model_dir),
                      tokenizer=str(tok.directory), layout="speculators", max_tokens_per_batch=512, device="cpu"),
                 cwd=tmp_path, project_root=tmp_path)
    data_path = tmp_path / "out" / "hidden_states" / "spec"

    dump = tmp_path / "read.pt"
    done = subprocess.run([interop_python, str(ROOT / "tests" / "interop" / "read_speculators.py"), str(data_path),
                           str(dump)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"rows": 12, "speculators": "0.9.0"}
    got = torch.load(dump, weights_only=False)

    expected = load_records(records)
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
    assert got["batch_shapes"]["hidden_states"] == [1, 8192, 3 * H] and tokens - 12 <= 8192
