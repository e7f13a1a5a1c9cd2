"""Assembly and EAGLE-3 hidden-state extraction on CPU with tiny random models (vocabulary sized for Kimi ids)."""
import gc
import json
import os
import re
import zipfile

import pytest
import torch

from eagledata.errors import InputError
from eagledata.files import write_jsonl
from eagledata.records import Record
from eagledata.training import (
    AssemblyPolicy,
    ExtractOptions,
    HiddenStates,
    Sample,
    assemble,
    eagle3_layers,
    export_specforge,
    export_speculators,
    extract,
    find_decoder,
    read_samples,
)
from eagledata.training.assembly import apply_length_policy
from eagledata.training.job import owner
from eagledata.training.tiny import build_tiny_model
from eagledata.training.transformers_backend import plan_batches
from tests.helpers.records import make_conversation, make_record
from tests.helpers.torchrun import json_objects, torchrun

H, L = 64, 8
LAYERS = eagle3_layers(L)  # (2, 4, 5)


@pytest.fixture(scope="module")
def models():
    return {f: build_tiny_model(f, hidden_size=H, num_layers=L) for f in ("llama", "deepseek_v3", "kimi_k25")}


@pytest.fixture(scope="module")
def records_file(tok, tmp_path_factory):
    """12 records of mixed lengths (about 20 to 140 tokens)."""
    path = tmp_path_factory.mktemp("records") / "records.jsonl"
    path.write_text("".join(make_record(tok, i, words=(i * 37) % 120 + 1).to_json() + "\n" for i in range(12)))
    return path


@pytest.fixture(scope="module")
def samples(records_file):
    return assemble([records_file]).samples


def run(samples, out, model, name="set", **kw):
    opts = {k: kw.pop(k) for k in list(kw) if k in ExtractOptions.__dataclass_fields__}
    return extract(samples, out, name, model, options=ExtractOptions(**opts), progress=False, **kw)


def reference_states(model, sample):
    with torch.no_grad():
        hs = model(torch.tensor([sample.input_ids]), output_hidden_states=True).hidden_states
    return torch.stack([hs[i][0] for i in LAYERS], 1), hs[-1][0]


# -- capture equals output_hidden_states ------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "deepseek_v3", "kimi_k25"])
@pytest.mark.parametrize("batch", [1, 8])
def test_captured_states_equal_output_hidden_states(family, batch, models, samples, tmp_path):
    model = models[family]
    result = run(samples, tmp_path, model, storage="fp32", max_batch_size=batch, max_tokens_per_batch=4096)
    assert result.complete and result.extracted == len(samples)
    hs = HiddenStates(result.directory)
    assert hs.manifest["layers"] == list(LAYERS) and hs.manifest["final"] == "post_norm"
    assert hs.ids == [s.id for s in samples]
    for s in samples:
        got = hs[s.id]
        aux, final = reference_states(model, s)
        assert got.input_ids.tolist() == s.input_ids and got.loss_mask.tolist() == s.loss_mask
        assert got.aux_hidden_states.shape == (len(s), 3, H)
        torch.testing.assert_close(got.aux_hidden_states, aux, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.final_hidden_state, final, atol=1e-4, rtol=1e-4)


def test_pre_norm_final_and_layer_override(models, samples, tmp_path):
    model = models["llama"]
    decoder = find_decoder(model)
    result = run(samples[:4], tmp_path, model, storage="fp32", final="pre_norm", layers=[0, 1, 5],
                 max_batch_size=4)
    hs = HiddenStates(result.directory)
    assert hs.manifest["final"] == "pre_norm" and hs.manifest["layers"] == [0, 1, 5]
    for s in samples[:4]:
        with torch.no_grad():
            ref = model(torch.tensor([s.input_ids]), output_hidden_states=True).hidden_states
            got = hs[s.id]
            torch.testing.assert_close(got.aux_hidden_states, torch.stack([ref[i][0] for i in (0, 1, 5)], 1),
                                       atol=1e-4, rtol=1e-4)
            # HF's last hidden state is the pre-norm state after the final norm
            torch.testing.assert_close(decoder.module.norm(got.final_hidden_state), ref[-1][0], atol=1e-4, rtol=1e-4)


def test_kimi_decoder_is_the_language_model(models):
    d = find_decoder(models["kimi_k25"])
    assert d.path == "model.language_model" and d.num_layers == L and d.vocab_size == 163_840
    assert eagle3_layers(61) == (2, 30, 58)


# -- storage size ----------------------------------------------------------------------------------
def _stored_bytes(directory):
    from safetensors import safe_open

    total = {}
    for shard in json.loads((directory / "manifest.json").read_text())["shards"]:
        with safe_open(str(directory / shard), framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                total[k] = total.get(k, 0) + t.numel() * t.element_size()
    return total


def test_bf16_is_8h_bytes_per_token_and_fp8_at_most_4h_plus_16(models, samples, tmp_path):
    tokens = sum(len(s) for s in samples)
    bf16 = run(samples, tmp_path, models["llama"], name="bf16", max_batch_size=8)
    size = _stored_bytes(bf16.directory)
    assert size["hidden_states"] == 8 * H * tokens
    assert size["input_ids"] == 4 * tokens and size["loss_mask"] == tokens  # no padding anywhere
    assert bf16.manifest["dtype"] == "bfloat16" and bf16.manifest["reconstruction_rel_rmse"] < 0.01

    fp8 = run(samples, tmp_path, models["llama"], name="fp8", storage="fp8", max_batch_size=8)
    size = _stored_bytes(fp8.directory)
    assert size["hidden_states"] + size["scales"] <= (4 * H + 16) * tokens
    err = fp8.manifest["reconstruction_rel_rmse"]
    assert 0 < err < 0.05
    ref, got = HiddenStates(bf16.directory, dtype=torch.float32), HiddenStates(fp8.directory)
    for s in samples[:3]:
        a, b = ref[s.id], got[s.id]
        assert b.aux_hidden_states.dtype == torch.float32
        rel = (a.aux_hidden_states - b.aux_hidden_states).norm() / a.aux_hidden_states.norm()
        assert rel < 0.06


# -- resume ----------------------------------------------------------------------------------------
class Killed(Exception):
    pass


def _kill_after(n):
    def on_batch(i):
        if i == n:
            raise Killed
    return on_batch


def _assert_same_set(a_dir, b_dir, samples):
    a, b = HiddenStates(a_dir), HiddenStates(b_dir)
    lines = (b_dir / "index.jsonl").read_text().splitlines()
    assert len(lines) == len(samples) == len({json.loads(x)["id"] for x in lines})
    assert b.ids == [s.id for s in samples]
    for s in samples:
        x, y = a[s.id], b[s.id]
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask)
        # other batch compositions change CPU matmul blocking: equal up to fp32 rounding (stored as fp32)
        torch.testing.assert_close(x.aux_hidden_states, y.aux_hidden_states, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(x.final_hidden_state, y.final_hidden_state, atol=2e-5, rtol=1e-5)


def test_kill_and_resume_with_another_batch_size(models, samples, tmp_path):
    model = models["deepseek_v3"]
    small_shards = dict(storage="fp32", shard_bytes=4 * H * 4 * 50)  # a shard every ~50 tokens
    whole = run(samples, tmp_path / "a", model, max_batch_size=4, **small_shards)
    with pytest.raises(Killed):
        run(samples, tmp_path / "b", model, max_batch_size=4, on_batch=_kill_after(2), **small_shards)
    out = tmp_path / "b" / "hidden_states" / "set"
    assert not (out / "manifest.json").exists() and not (out / "index.jsonl").exists()
    # a kill between claiming a shard and indexing it leaves an unreferenced shard behind
    (out / "shard-00077.safetensors").write_bytes(b"partial")
    resumed = run(samples, tmp_path / "b", model, max_batch_size=3, **small_shards)
    assert resumed.complete and 0 < resumed.skipped < len(samples)
    assert resumed.extracted + resumed.skipped == len(samples)
    assert not (out / "shard-00077.safetensors").exists()
    _assert_same_set(whole.directory, out, samples)
    again = run(samples, tmp_path / "b", model, max_batch_size=2, **small_shards)
    assert again.extracted == 0 and again.complete


def test_sigkill_mid_extraction_then_resume(models, tmp_path):
    """A real kill: the torchrun entry point in a subprocess, SIGKILLed once shards are landing."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    rng = random.Random(7)
    samples = []
    for i in range(200):
        n = rng.randint(20, 120)
        samples.append(Sample(f"s{i}", "synthetic", [rng.randrange(163_840) for _ in range(n)],
                              [0] * (n // 2) + [1] * (n - n // 2), False))
    spec = write_jsonl(tmp_path / "samples.jsonl", (s.to_speculators() for s in samples))
    model_dir = tmp_path / "llama"
    models["llama"].save_pretrained(str(model_dir))
    cmd = [sys.executable, "-m", "eagledata.hidden_states", "--samples", str(spec), "--output-dir", str(tmp_path),
           "--name", "set", "--model", str(model_dir), "--storage", "fp32", "--device", "cpu",
           "--max-batch-size", "1", "--shard-bytes", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = tmp_path / "hidden_states" / "set" / "index.parts"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(p.read_bytes().count(b"\n") for p in parts.glob("*.jsonl")) >= 5:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "finished before the kill: make the run longer"
    resumed = run(samples, tmp_path, models["llama"], storage="fp32", max_batch_size=7)
    assert resumed.complete and resumed.skipped >= 5 and resumed.extracted + resumed.skipped == len(samples)
    whole = run(samples, tmp_path / "whole", models["llama"], storage="fp32", max_batch_size=8)
    _assert_same_set(whole.directory, resumed.directory, samples)


def test_world_size_two_equals_world_size_one(models, samples, tmp_path):
    model = models["llama"]
    one = run(samples, tmp_path / "one", model, max_batch_size=4, storage="fp32")
    r0 = run(samples, tmp_path / "two", model, max_batch_size=4, storage="fp32", rank=0, world_size=2)
    assert not r0.complete and 0 < r0.extracted < len(samples)
    r1 = run(samples, tmp_path / "two", model, max_batch_size=4, storage="fp32", rank=1, world_size=2)
    assert r1.complete and r0.extracted + r1.extracted == len(samples)
    _assert_same_set(one.directory, r1.directory, samples)
    # half done at world size 2, finished at world size 1: only the other half is computed
    run(samples, tmp_path / "mixed", model, max_batch_size=4, storage="fp32", rank=1, world_size=2)
    rest = run(samples, tmp_path / "mixed", model, max_batch_size=4, storage="fp32")
    assert rest.extracted == r0.extracted and rest.complete
    _assert_same_set(one.directory, rest.directory, samples)


def test_torchrun_two_processes_on_cpu(models, samples, tmp_path):
    """The real data-parallel path: torchrun, gloo, a barrier, rank 0 writes index and manifest."""
    spec = write_jsonl(tmp_path / "samples.jsonl", (s.to_speculators() for s in samples))
    model_dir = tmp_path / "llama"
    models["llama"].save_pretrained(str(model_dir))
    done = torchrun(2, ["--samples", str(spec), "--output-dir", str(tmp_path), "--name", "ws2", "--model",
                        str(model_dir), "--storage", "fp32", "--device", "cpu", "--max-batch-size", "4"], timeout=120)
    reports = json_objects(done.stdout)
    assert sorted(r["rank"] for r in reports) == [0, 1], done.stdout
    assert sum(r["extracted"] for r in reports) == len(samples), done.stdout
    one = run(samples, tmp_path / "one", models["llama"], storage="fp32", max_batch_size=4)
    _assert_same_set(one.directory, tmp_path / "hidden_states" / "ws2", samples)


def test_resume_refuses_other_settings(models, samples, tmp_path):
    run(samples[:2], tmp_path, models["llama"])
    with pytest.raises(InputError, match="other settings"):
        run(samples[:2], tmp_path, models["llama"], storage="fp8")


def test_plan_batches_respects_the_token_budget():
    lengths = [5, 100, 30, 31, 7, 64, 1, 250]
    batches = plan_batches(lengths, max_tokens=128)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 128 for b in batches)
    assert [len(b) for b in plan_batches(lengths, 10_000, max_batch_size=3)] == [3, 3, 2]
    assert {owner(f"id{i}", 2) for i in range(20)} == {0, 1}


# -- bad input -------------------------------------------------------------------------------------
def test_ids_beyond_vocabulary_fail_before_compute(tok, tmp_path, models):
    good = make_record(tok, 1)
    bad = make_record(tok, 2)
    bad.output_ids = bad.output_ids + [200_000]
    path = tmp_path / "records.jsonl"
    path.write_text(good.to_json() + "\n" + bad.to_json() + "\n")
    with pytest.raises(InputError, match=r"records\.jsonl:2 field 'output_ids': record 'r2': token ids \[200000\]"):
        assemble([path])
    sample = Sample("x", "B1", [1, 2, 163_840], [0, 1, 1], False)
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        run([sample], tmp_path, models["llama"])
    assert not list((tmp_path / "hidden_states" / "set").glob("shard-*"))
    config_only = tmp_path / "kimi-config"  # no weights: the check must come before loading them
    models["kimi_k25"].config.save_pretrained(str(config_only))
    with pytest.raises(InputError, match=r"sample 'x' \(B1\): token ids \[163840\] outside"):
        run([sample], tmp_path, config_only)


def test_records_from_another_tokenizer_fail(tok, tmp_path):
    other = make_record(tok, 3)
    other.prompt_ids = [i + 1 for i in other.prompt_ids]  # what another BPE would give
    path = tmp_path / "records.jsonl"
    path.write_text(make_record(tok, 1).to_json() + "\n" + other.to_json() + "\n")
    with pytest.raises(InputError, match=r"records\.jsonl:2 field 'prompt_ids'.*another tokenizer"):
        assemble([path], tok=tok)
    marked = make_record(tok, 4)
    marked.meta["tokenizer_fingerprint"] = "0" * 64
    path.write_text(marked.to_json() + "\n")
    with pytest.raises(InputError, match="made with another tokenizer"):
        assemble([path], tok=tok)


def test_loader_verify_checks_ids_against_records(tok, models, records_file, samples, tmp_path):
    from eagledata.records import load_records

    result = run(samples, tmp_path, models["llama"], max_batch_size=8)
    hs = HiddenStates(result.directory)
    records = load_records(records_file)
    assert hs.verify(records) == len(records)
    records[0].output_ids = records[0].output_ids[:-1] + [5]
    with pytest.raises(InputError, match="r0.*differ"):
        hs.verify(records)


# -- assembly --------------------------------------------------------------------------------------
def test_assembly_dedupe_truncation_length_and_exports(tok, tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    cut = make_record(tok, 2, finish="length", words=10)
    a.write_text("".join(r.to_json() + "\n" for r in [make_record(tok, 0), make_record(tok, 1, words=40), cut]))
    dup_id = make_record(tok, 0, prompt="a different prompt", dataset="B2")
    dup_prompt = make_record(tok, 1, dataset="B2")
    dup_prompt.id = "other"
    b.write_text(dup_id.to_json() + "\n" + dup_prompt.to_json() + "\n"
                 + make_record(tok, 9, dataset="B2").to_json() + "\n")

    asm = assemble([a, b])
    assert [s.id for s in asm.samples] == ["r0", "r1", "r2", "r9"]
    assert asm.dropped == {"duplicate_id": 1, "duplicate_prompt": 1}
    s0 = asm.samples[0]
    assert s0.input_ids == asm.records[0].prompt_ids + asm.records[0].output_ids
    assert s0.loss_mask == [0] * len(asm.records[0].prompt_ids) + [1] * len(asm.records[0].output_ids)
    assert asm.stats()["truncated_kept"] == 1 and set(asm.by_dataset()) == {"B1", "B2"}

    assert "r2" not in [s.id for s in assemble([a, b], policy=AssemblyPolicy(keep_truncated=False)).samples]
    limit = len(asm.samples[1]) - 5
    dropped = assemble([a, b], policy=AssemblyPolicy(max_length=limit))
    assert "r1" not in [s.id for s in dropped.samples] and dropped.dropped["too_long"] >= 1
    cut_set = assemble([a, b], policy=AssemblyPolicy(max_length=limit, overlong="truncate"))
    r1 = next(s for s in cut_set.samples if s.id == "r1")
    assert len(r1) == limit and r1.shortened and r1.input_ids == asm.samples[1].input_ids[:limit]
    n_prompt = len(asm.records[1].prompt_ids)
    assert apply_length_policy(asm.samples[1], AssemblyPolicy(max_length=n_prompt, overlong="truncate")) == \
        (None, "prompt_too_long")

    sf = [json.loads(x) for x in export_specforge(asm, tmp_path / "sf.jsonl").read_text().splitlines()]
    assert sf[0]["id"] == "r0" and [t["role"] for t in sf[0]["conversations"]] == ["user", "assistant"]
    assert sf[0]["conversations"][-1]["reasoning_content"] == asm.records[0].reasoning
    assert sf[0]["conversations"][-1]["content"] == asm.records[0].content
    rows = read_samples(export_speculators(asm, tmp_path / "sp.jsonl"))
    assert [(r.id, r.input_ids, r.loss_mask) for r in rows] == [(s.id, s.input_ids, s.loss_mask) for s in asm.samples]


def test_dataset_names_resolve_under_output_dir(tok, tmp_path):
    d = tmp_path / "datasets" / "B7"
    d.mkdir(parents=True)
    (d / "records.jsonl").write_text(make_record(tok, 0).to_json() + "\n")
    assert len(assemble(["B7"], output_dir=tmp_path).samples) == 1
    with pytest.raises(InputError, match="no records file"):
        assemble(["B8"], output_dir=tmp_path)


def test_assembly_leaves_out_the_providers_generation_called_suspect(tok, tmp_path, models):
    """B1's summary.json calls Leaky suspect (generation's fidelity verdict): its records are left out of B1 and
    of B2 (the verdict is about the endpoint), before dedupe (its answer does not keep Good's answer to the same
    prompt out), and the manifest says which provider, how many records and why. The setting keeps them; without
    a summary, or with one that has no `fidelity` (an older run), nothing is left out."""
    from eagledata.training.convert import convert

    def write(dataset, records, summary=None):
        folder = tmp_path / "datasets" / dataset
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
        if summary is not None:
            (folder / "summary.json").write_text(json.dumps(summary))
        return folder

    def served(i, provider, dataset, **kw):
        r = make_record(tok, i, dataset=dataset, **kw)
        r.provider = provider
        return r

    evidence = "count mismatch on 31 of 40 answers (spread -1..+2), others 1 of 600"
    fidelity = {"fidelity": {"providers": {
        "Good": {"answers": 600, "repaired": 3, "refused": 0, "count_mismatch": 1, "verdict": "consistent",
                 "evidence": "as the others"},
        "Leaky": {"answers": 40, "repaired": 0, "refused": 0, "count_mismatch": 31, "verdict": "suspect",
                  "evidence": evidence}}}}
    b1 = write("B1", [served(0, "Good", "B1"), served(1, "Leaky", "B1"), served(2, "Good", "B1"),
                      served(3, "Leaky", "B1")], {"stop_reason": "completed", **fidelity})
    leaky_twin = served(4, "Leaky", "B2")
    good_twin = served(5, "Good", "B2", prompt=leaky_twin.messages[0]["content"])  # the same prompt, answered later
    write("B2", [leaky_twin, good_twin, served(6, "", "B2")])

    asm = assemble(["B1", "B2"], output_dir=tmp_path)
    assert [s.id for s in asm.samples] == ["r0", "r2", "r5", "r6"]
    assert asm.dropped == {"suspect_provider": 3} and asm.stats()["dropped_suspect_provider"] == 3
    summary_path = str(b1 / "summary.json")
    left_out = {"Leaky": {"records": 3, "by_dataset": {"B1": 2, "B2": 1}, "evidence": {summary_path: evidence}}}
    assert asm.provenance() == {"left_out_providers": left_out, "kept_suspect_providers": {},
                                "extraction_cost": asm.extraction_cost()}

    result = run(asm.samples, tmp_path, models["llama"], assembly=asm.provenance())
    on_disk = json.loads((result.directory / "manifest.json").read_text())
    assert on_disk["assembly"]["left_out_providers"] == left_out and on_disk["num_samples"] == 4
    converted = convert(result.directory, tmp_path / "converted", "specforge", workers=1, progress=False)
    assert converted.manifest["assembly"]["left_out_providers"] == left_out  # a rewrite keeps saying so
    # the command's path: the speculators export carries the provenance beside it, the command records it
    from eagledata.hidden_states import main

    export = export_speculators(asm, tmp_path / "assembled" / "speculators.jsonl")
    assert json.loads((tmp_path / "assembled" / "speculators.assembly.json").read_text()) == asm.provenance()
    models["llama"].save_pretrained(str(tmp_path / "llama"))
    assert main(["--samples", str(export), "--output-dir", str(tmp_path), "--name", "cmd", "--model",
                 str(tmp_path / "llama"), "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "hidden_states" / "cmd" / "manifest.json").read_text())["assembly"] == \
        asm.provenance()

    kept = assemble(["B1", "B2"], output_dir=tmp_path, policy=AssemblyPolicy(keep_suspect_providers=True))
    assert [s.id for s in kept.samples] == ["r0", "r1", "r2", "r3", "r4", "r6"]  # r5: r4's prompt came first
    assert kept.dropped == {"duplicate_prompt": 1}
    assert kept.provenance() == {"left_out_providers": {}, "kept_suspect_providers": left_out,
                                 "extraction_cost": kept.extraction_cost()}

    (b1 / "summary.json").write_text(json.dumps({"stop_reason": "completed"}))  # an older run: no fidelity
    older = assemble(["B1", "B2"], output_dir=tmp_path)
    assert [s.id for s in older.samples] == [s.id for s in kept.samples] and older.suspects == {}
    (b1 / "summary.json").unlink()
    assert [s.id for s in assemble(["B1", "B2"], output_dir=tmp_path).samples] == [s.id for s in kept.samples]

    fidelity["fidelity"]["providers"]["Leaky"]["verdict"] = "bad"
    (b1 / "summary.json").write_text(json.dumps(fidelity))
    with pytest.raises(InputError,
                       match=r"B1/summary\.json field 'fidelity\.providers\.Leaky\.verdict': verdict 'bad'"):
        assemble(["B1"], output_dir=tmp_path)
    (b1 / "summary.json").write_text(json.dumps({"fidelity": {"providers": ["Leaky"]}}))
    with pytest.raises(InputError, match=r"B1/summary\.json field 'fidelity\.providers': expected an object"):
        assemble(["B1"], output_dir=tmp_path)
    (b1 / "summary.json").write_text(json.dumps({"fidelity": {}}))  # nothing judged yet: nothing left out
    assert len(assemble(["B1"], output_dir=tmp_path).samples) == 4
    (b1 / "summary.json").write_text("{")
    with pytest.raises(InputError, match=r"B1/summary\.json:1: not JSON"):
        assemble(["B1"], output_dir=tmp_path)


# -- multi-turn conversations: one sample per turn ----------------------------------------------------------
CONVERSATION_IDS = ["c1", "c2", "c2#2", "c3", "c3#2", "c3#3"]


@pytest.fixture(scope="module")
def conversations(tok, tmp_path_factory):
    """Conversations of 1, 2 and 3 turns over two datasets: (records file, records in file order)."""
    records = [*make_conversation(tok, "c1", ["what is a drafter?"]),
               *make_conversation(tok, "c2", ["name a prime", "and a larger one?"], system="Be brief."),
               *make_conversation(tok, "c3", ["tell me a story", "go on", "and then?"], dataset="B2")]
    path = tmp_path_factory.mktemp("conversations") / "records.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path, records


def test_turn_records_carry_their_history_as_prompt(tok, conversations):
    """The fixture is what generation writes: turn j's prompt is turn j-1's prompt, then its answer without the
    reasoning (the chat template drops it), then the next ask. So no single sequence holds every turn's answer as
    generated: each turn must be a sample of its own."""
    _, records = conversations
    by_id = {r.id: r for r in records}
    for prev, cur in [("c2", "c2#2"), ("c3", "c3#2"), ("c3#2", "c3#3")]:
        a, b = by_id[prev], by_id[cur]
        assert b.prompt_ids[:len(a.prompt_ids)] == a.prompt_ids
        history = tok.decode(b.prompt_ids[len(a.prompt_ids):])
        assert a.content in history and a.reasoning.strip() not in history


@pytest.mark.parametrize("layout", ["eagledata", "speculators", "specforge"])
def test_each_turn_is_one_sample_in_every_layout(layout, tok, models, conversations, tmp_path):
    """A records file of 1-, 2- and 3-turn conversations gives one sample per turn record, in record order, in each
    layout: its id, `input_ids` = that turn's prompt (the history) + its answer, loss 0 over the history and 1 over
    the answer; the trainer's own view of the files agrees, and a later turn's states are those of its whole
    sequence."""
    from datasets import load_from_disk

    from tests.helpers import specforge_reader as sf

    path, records = conversations
    asm = assemble([path], tok=tok)  # re-renders the multi-turn prompts with the real template: they must agree
    assert [s.id for s in asm.samples] == CONVERSATION_IDS and asm.dropped == {}
    assert [(s.conversation_id, s.turn) for s in asm.samples] == [(r.conversation_id, r.turn) for r in records]
    result = run(asm.samples, tmp_path, models["llama"], layout=layout, max_batch_size=4,
                 assembly=asm.provenance())
    hs = HiddenStates(result.directory)
    assert hs.ids == CONVERSATION_IDS and hs.verify(records) == len(records)
    for r in records:
        got = hs[r.id]
        assert got.input_ids.tolist() == r.prompt_ids + r.output_ids
        assert got.loss_mask.tolist() == [0] * len(r.prompt_ids) + [1] * len(r.output_ids)
    m = hs.manifest
    tokens, loss = sum(len(r.input_ids) for r in records), sum(len(r.output_ids) for r in records)
    assert (m["num_samples"], m["num_tokens"], m["num_loss_tokens"]) == (6, tokens, loss)
    assert m["tokens_per_loss_token"] == pytest.approx(tokens / loss, rel=1e-12)
    assert m["assembly"]["extraction_cost"]["later_turns"] == 3

    last = records[-1]  # c3#3: states over its history and answer, as a batch-1 forward computes them
    aux, _ = reference_states(models["llama"], asm.samples[-1])
    torch.testing.assert_close(hs[last.id].aux_hidden_states.float(), aux, rtol=1e-2, atol=1e-2)

    directory = result.directory
    if layout == "speculators":  # the trainer's Arrow rows, row i = sample i, and its token frequencies
        data = load_from_disk(str(directory))
        assert [data[i]["id"] for i in range(len(data))] == CONVERSATION_IDS
        for i, r in enumerate(records):
            assert data[i]["input_ids"].tolist() == r.input_ids and data[i]["loss_mask"].tolist() == r.loss_mask
        from collections import Counter
        assert torch.load(directory / "token_freq.pt", weights_only=True) == \
            dict(Counter(t for r in records for t in r.output_ids))  # the supervised tokens: every answer's
    if layout == "specforge":  # SpecForge's own reading: one file per turn, the last position never supervised
        index = {e["shard"]: e["id"] for e in map(json.loads, (directory / "index.jsonl").read_text().splitlines())}
        files = sf.list_feature_files(str(directory))
        assert sorted(index[os.path.relpath(f, directory)] for f in files) == sorted(CONVERSATION_IDS)
        by_id = {r.id: r for r in records}
        for f in files:
            r = by_id[index[os.path.relpath(f, directory)]]
            item = sf.normalize(sf.load_feature_file(f), max_len=4096)
            assert item["input_ids"][0].tolist() == r.input_ids
            assert item["loss_mask"][0].tolist() == r.loss_mask[:-1] + [0]


def agent_turns(tok) -> list[Record]:
    """An agent conversation regenerated as generation does it: two tool-call turns (served with `call_…` ids,
    rebuilt to the model's) with the dataset's results spliced after them, then the plain answer."""
    from eagledata.generation.conversations.recording import build_record
    from eagledata.generation.conversations.turns import Conversation
    from eagledata.openrouter import Completion
    from eagledata.prompts import normalize_prompt
    from eagledata.records import Answer, ToolCall, Usage
    from eagledata.text.sequences import prompt_ids
    from tests.helpers.prompts import dataset

    conv = Conversation.of(normalize_prompt(dataset()), "all")
    turn, out = conv.turn(), []
    for calls in [(ToolCall("call_1", "get_weather", '{"q": "Paris"}'), ToolCall("call_2", "get_weather", "{}")),
                  (ToolCall("call_3", "search", '{"q": "news"}'),), ()]:
        answer = Answer("Thinking it over.", "Checking." if calls else "Sunny; no news.",
                        "tool_calls" if calls else "stop", calls)
        c = Completion(answer=answer, provider="P", model="m", generation_id=turn.id, usage=Usage())
        out.append(build_record(tok, turn=turn, dataset="A", prompt_ids=prompt_ids(tok, turn.messages,
                                                                                    tools=list(conv.tools)),
                                completion=c, attempts=1))
        turn = turn.next(out[-1].answer)
    return out


@pytest.mark.parametrize("layout", ["eagledata", "speculators", "specforge"])
def test_tool_call_turns_are_samples_with_loss_on_the_targets_turns_only(layout, tok, models, tmp_path):
    """Each generated turn of an agent conversation is a sample: the history (the dataset's turns, the tool
    results, earlier calls) has loss 0, the target's turn (its tool-call section included) loss 1, in every
    layout and as SpecForge's reader reads it."""
    from tests.helpers import specforge_reader as sf

    records = agent_turns(tok)
    assert [r.id for r in records] == ["agent-1", "agent-1#2", "agent-1#3"]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in records))
    asm = assemble([path], tok=tok)  # re-renders each prompt with its tools: they must agree
    assert [s.id for s in asm.samples] == [r.id for r in records] and asm.dropped == {}
    result = run(asm.samples, tmp_path, models["llama"], layout=layout, max_batch_size=4, assembly=asm.provenance())
    hs = HiddenStates(result.directory)
    returns = tok.encode("## Return of")
    for r in records:
        got = hs[r.id]
        ids, mask = got.input_ids.tolist(), got.loss_mask.tolist()
        assert ids == r.prompt_ids + r.output_ids and mask == [0] * len(r.prompt_ids) + [1] * len(r.output_ids)
        supervised = [t for t, m in zip(ids, mask) if m]
        assert (163595 in supervised) == bool(r.tool_calls)  # the section is the target's: loss 1
        if r.turn > 1:  # the results spliced after our calls are history: loss 0
            at = next(i for i in range(len(ids)) if ids[i:i + len(returns)] == returns)
            assert not any(mask[:len(r.prompt_ids)]) and at < len(r.prompt_ids)
    if layout == "specforge":
        index = {e["shard"]: e["id"] for e in map(json.loads, (result.directory / "index.jsonl").read_text()
                                                       .splitlines())}
        by_id = {r.id: r for r in records}
        for f in sf.list_feature_files(str(result.directory)):
            r = by_id[index[os.path.relpath(f, result.directory)]]
            item = sf.normalize(sf.load_feature_file(f), max_len=4096)
            assert item["input_ids"][0].tolist() == r.input_ids
            assert item["loss_mask"][0].tolist() == r.loss_mask[:-1] + [0]


def test_exports_write_each_turn_with_its_history(tok, conversations, tmp_path):
    """SpecForge's row for turn j is its conversation so far (the model's own earlier answers as assistant turns)
    and turn j's answer, over exactly turn j's ids with loss on that answer only; speculators' rows carry the
    conversation and turn, and read back as the same samples."""
    path, records = conversations
    asm = assemble([path], tok=tok)
    rows = {row["id"]: row for row in map(json.loads, export_specforge(asm, tmp_path / "sf.jsonl", tok)
                                          .read_text().splitlines())}
    assert list(rows) == CONVERSATION_IDS
    by_id = {r.id: r for r in records}
    row = rows["c3#3"]
    assert (row["conversation_id"], row["turn"]) == ("c3", 3)
    assert [t["role"] for t in row["conversations"]] == ["user", "assistant"] * 3
    assert [t["content"] for t in row["conversations"][1::2]] == [by_id[i].content for i in ("c3", "c3#2", "c3#3")]
    assert [t["content"] for t in row["conversations"][0::2]] == ["tell me a story", "go on", "and then?"]
    assert "reasoning_content" not in row["conversations"][1] and "reasoning_content" not in row["conversations"][3]
    assert row["conversations"][-1]["reasoning_content"] == by_id["c3#3"].reasoning
    assert [t["role"] for t in rows["c2#2"]["conversations"]] == ["system", "user", "assistant", "user", "assistant"]
    for r in records:
        assert rows[r.id]["input_ids"] == r.prompt_ids + r.output_ids and rows[r.id]["loss_mask"] == r.loss_mask
        assert rows[r.id]["text"] == tok.decode(r.input_ids)

    export = export_speculators(asm, tmp_path / "speculators.jsonl")
    lines = [json.loads(x) for x in export.read_text().splitlines()]
    assert [(x["id"], x["conversation_id"], x["turn"]) for x in lines] == \
        [(r.id, r.conversation_id, r.turn) for r in records]
    back = read_samples(export)
    assert [(s.id, s.input_ids, s.loss_mask, s.conversation_id, s.turn) for s in back] == \
        [(r.id, r.input_ids, r.loss_mask, r.conversation_id, r.turn) for r in records]
    assert (tmp_path / "speculators" / "token_freq.pt").is_file()  # speculators' --data-path finds it there


def test_specforge_rows_of_an_agent_conversation_keep_its_calls_and_results(tok, tmp_path):
    """The row of a turn inside a tool loop: the tools, the earlier calls (with the loop's reasoning, which the
    template keeps), the dataset's results with our call ids, then this turn's calls; ids and mask exact."""
    records = agent_turns(tok)
    path = tmp_path / "records.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in records))
    asm = assemble([path], tok=tok)
    rows = {row["id"]: row for row in map(json.loads, export_specforge(asm, tmp_path / "sf.jsonl", tok)
                                          .read_text().splitlines())}
    row = rows["agent-1#2"]
    assert row["tools"] == records[1].tools and row["turn"] == 2
    assert [t["role"] for t in row["conversations"]] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    first = row["conversations"][2]
    assert first["tool_calls"] == records[0].tool_calls and first["reasoning_content"] == records[0].reasoning
    assert {t["tool_call_id"] for t in row["conversations"][3:5]} == {c["id"] for c in records[0].tool_calls}
    assert row["conversations"][-1]["tool_calls"] == records[1].tool_calls
    last = rows["agent-1#3"]["conversations"]  # the loop still in flight: both earlier calls keep their reasoning
    kept = [t.get("reasoning_content") for t in last[:-1] if t["role"] == "assistant"]
    assert kept == [r.reasoning for r in records[:2]]
    for r in records:
        assert rows[r.id]["input_ids"] == r.input_ids and rows[r.id]["loss_mask"] == r.loss_mask


def test_extraction_cost_counts_history_against_supervised_tokens(tok, conversations):
    """Tokens extracted (each turn's whole sequence, history included) against tokens supervised (its answer), and
    the ratio, overall and per dataset; a later turn re-reads its history, so the 3-turn dataset costs more per
    supervised token than the same dataset's first turns alone."""
    path, records = conversations
    asm = assemble([path], tok=tok)

    def expect(rs):
        tokens, loss = sum(len(r.prompt_ids) + len(r.output_ids) for r in rs), sum(len(r.output_ids) for r in rs)
        return tokens, loss, tokens / loss

    cost = asm.extraction_cost()
    tokens, loss, ratio = expect(records)
    assert (cost["tokens"], cost["loss_tokens"], cost["samples"], cost["conversations"], cost["later_turns"]) == \
        (tokens, loss, 6, 3, 3)
    assert cost["tokens_per_loss_token"] == pytest.approx(ratio, rel=1e-12)
    for dataset, (n, conv, later) in {"B1": (3, 2, 1), "B2": (3, 1, 2)}.items():
        rs = [r for r in records if r.dataset == dataset]
        row = cost["by_dataset"][dataset]
        t, lt, q = expect(rs)
        assert (row["tokens"], row["loss_tokens"], row["samples"], row["conversations"], row["later_turns"]) == \
            (t, lt, n, conv, later)
        assert row["tokens_per_loss_token"] == pytest.approx(q, rel=1e-12)
    assert asm.by_dataset() == cost["by_dataset"]
    stats = asm.stats()
    assert (stats["tokens"], stats["loss_tokens"], stats["conversations"], stats["later_turns"]) == (tokens, loss, 3, 3)
    assert stats["tokens_per_loss_token"] == pytest.approx(ratio, rel=1e-12)
    first_turns = expect([r for r in records if r.dataset == "B2" and r.turn == 1])[2]
    assert cost["by_dataset"]["B2"]["tokens_per_loss_token"] > first_turns
    assert asm.provenance()["extraction_cost"] == cost


def test_reread_history_is_counted_where_a_turn_repeats_its_previous_sample(tok, conversations):
    """Kimi's template drops an earlier answer's reasoning from the history: a later turn shares its previous
    turn's prompt (and no more than the start of its answer) and never holds that sample whole, so each turn must be
    extracted; a template that keeps the answers verbatim makes the previous sample a whole prefix (counted exactly:
    a causal verifier's states for it are a slice of the later turn's)."""
    from eagledata.training.assembly import Sample, extraction_cost

    path, records = conversations
    asm = assemble([path], tok=tok)
    by_id = {s.id: s for s in asm.samples}
    reread = {"B1": 0, "B2": 0}
    for prev, cur in [("c2", "c2#2"), ("c3", "c3#2"), ("c3#2", "c3#3")]:
        a = next(r for r in records if r.id == prev)
        shared = max(i for i in range(len(by_id[prev]) + 1) if by_id[cur].input_ids[:i] == by_id[prev].input_ids[:i])
        assert len(a.prompt_ids) <= shared < len(by_id[prev])  # the prompt again, the reasoning not
        reread[a.dataset] += shared
    cost = asm.extraction_cost()
    assert cost["whole_prefix_turns"] == 0 and cost["reread_tokens"] == sum(reread.values())
    assert {d: cost["by_dataset"][d]["reread_tokens"] for d in reread} == reread
    assert (asm.stats()["reread_tokens"], asm.stats()["whole_prefix_turns"]) == (sum(reread.values()), 0)

    def sample(sid, ids, turn, conversation="c", dataset="B1"):
        return Sample(sid, dataset, ids, [0] * len(ids), False, conversation_id=conversation, turn=turn)

    made = [sample("a", [1, 2, 3, 4], 1), sample("a#2", [1, 2, 3, 4, 5, 6], 2),  # whole: 4
            sample("a#3", [1, 2, 3, 4, 5, 9, 9], 3),  # shares 5 of a#2's 6
            sample("b#2", [1, 2, 3], 2, "b"),  # its first turn not in the set (dropped): nothing re-read
            sample("x", [1, 2, 3, 4], 2, ""),  # no conversation known: nothing
            sample("a", [1, 2], 1, dataset="B2"), sample("a#2", [1, 2, 7], 2, dataset="B2")]  # another dataset's
    cost = extraction_cost(made)
    assert (cost["reread_tokens"], cost["whole_prefix_turns"], cost["later_turns"]) == (4 + 5 + 2, 2, 5)
    assert [(r["reread_tokens"], r["whole_prefix_turns"]) for r in cost["by_dataset"].values()] == [(9, 1), (2, 1)]


def test_dedupe_never_merges_turns_of_one_conversation(tok, tmp_path):
    """Turns of one conversation are never dropped as duplicates of each other, even when they ask the same thing;
    identical prompts in other conversations still dedupe: `b` opens as `a` did (its first turn goes, its second,
    on its own history, stays) and `c` repeats `a` word for word, answers included (every turn goes)."""
    from eagledata.training.assembly import is_duplicate_prompt, prompt_key

    asks = ["tell me a story", "go on", "go on"]
    a = make_conversation(tok, "a", asks)
    b = make_conversation(tok, "b", asks[:2], dataset="B2")
    c = make_conversation(tok, "c", asks, dataset="B2", answers=[r.content for r in a])
    path = tmp_path / "records.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in [*a, *b, *c]))

    asm = assemble([path], tok=tok)
    assert [s.id for s in asm.samples] == ["a", "a#2", "a#3", "b#2"]
    assert asm.dropped == {"duplicate_prompt": 4}
    assert [s.id for s in assemble([path], policy=AssemblyPolicy(dedupe_prompts=False)).samples] == \
        ["a", "a#2", "a#3", "b", "b#2", "c", "c#2", "c#3"]
    # the rule itself: a prompt first kept by another turn of the same conversation never makes a turn a duplicate; by
    # another conversation, or by the same turn (asked again after a pause sample), it does
    assert not is_duplicate_prompt(a[1], {prompt_key(a[1]): ("B1", "a", 1)})
    assert is_duplicate_prompt(a[1], {prompt_key(a[1]): ("B1", "a", 2)})
    assert is_duplicate_prompt(a[1], {prompt_key(a[1]): ("B2", "c", 2)})
    assert not is_duplicate_prompt(a[2], {prompt_key(a[1]): ("B2", "c", 2)})


# -- notebook --------------------------------------------------------------------------------------
def test_notebook_exports_what_specforge_reads(records_file, tokenizer_dir, tmp_path):
    """hidden_states.ipynb with `-p layout specforge`, read as SpecForge's OfflineEagle3Dataset reads it: ids
    are the records', states equal a batch-1 transformers reference within bf16 rounding."""
    from eagledata.notebooks import cell_outputs_text, read_results, run_notebook
    from eagledata.records import load_records
    from tests.helpers import specforge_reader as sf

    model_dir = tmp_path / "tiny-kimi"
    model = build_tiny_model("kimi_k25", model_dir, hidden_size=H, num_layers=L)
    # two providers served the records, so the audit has someone to compare each with
    labelled = tmp_path / "records.jsonl"
    labelled.write_text("".join(json.dumps({**json.loads(line), "provider": "AB"[i % 2]}) + "\n"
                                for i, line in enumerate(records_file.read_text().splitlines())))
    records_file = labelled
    # run_notebook directly: the execute_notebook fixture's own `name` argument shadows the notebook's
    parameters = dict(datasets=[str(records_file)], output_dir=str(tmp_path / "out"), name="demo",
                      model=str(model_dir), tokenizer=str(tokenizer_dir), layout="specforge",
                      max_tokens_per_batch=512, device="cpu", min_provider_samples=2, export_layout="specforge")
    out = run_notebook("hidden_states", tmp_path / "hidden_states.out.ipynb", parameters, cwd=tmp_path,
                       project_root=tmp_path)
    results = read_results(out)
    assert results["verified_samples"] == 12 and results["assembly"]["samples"] == 12
    every = load_records(records_file)  # extraction cost: tokens read against tokens trained on, as published
    tokens, loss = sum(len(r.input_ids) for r in every), sum(len(r.output_ids) for r in every)
    assert (results["assembly"]["tokens"], results["assembly"]["loss_tokens"]) == (tokens, loss)
    assert results["assembly"]["tokens_per_loss_token"] == pytest.approx(tokens / loss, rel=1e-12)
    assert results["assembly"]["by_dataset"]["B1"]["tokens_per_loss_token"] == pytest.approx(tokens / loss, rel=1e-12)
    assert results["extraction"]["complete"] and results["extraction"]["extracted"] == 12
    assert results["exports"]["speculators"].endswith("speculators.jsonl")
    audit = results["audit"]  # the fidelity audit over the set's scores.jsonl: a verdict per provider
    assert audit["significance"] == 0.01 and set(audit["providers"]) == {"A", "B"}
    for p in audit["providers"].values():
        assert p["samples"] == 6 and p["tested"] and p["verdict"] in ("consistent", "suspect")
        assert p["ci_low"] <= p["mean_nll"] <= p["ci_high"]
    assert isinstance(audit["outliers"], list)
    assert results["scoring_cost_k25"]["ratio"] < 0.05
    # acting on it: the audited export leaves out exactly the suspects' samples and the outliers
    export = results["audited_export"]
    gone = {s for s in audit["outliers"]} | {f"r{i}" for i in range(12) if "AB"[i % 2] in audit["suspects"]}
    assert export["excluded"]["samples"] == len(gone) and set(export["excluded"]["excluded_ids"]) == gone
    assert HiddenStates(export["directory"]).ids == [f"r{i}" for i in range(12) if f"r{i}" not in gone]
    text = cell_outputs_text(out)
    assert "WARNING" not in text and f"extraction reads {tokens:,} tokens to supervise {loss:,}" in text
    # the memory plans, before loading: the tiny model fits; K2.5 INT4 on 8×96 GB does not through transformers
    assert "per device / usable" in text and "fits" in text and "transformers tp=8" in text
    assert "dequantized to 16-bit at load" in text and "INT4 packed" in text
    directory = tmp_path / "out" / "hidden_states" / "demo"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert results["manifest"] == manifest and manifest["num_samples"] == 12
    assert manifest["layers"] == list(LAYERS) and manifest["layout"] == "specforge"

    records = {r.id: r for r in load_records(records_file)}
    files = sf.list_feature_files(str(directory))
    index = {e["shard"]: e["id"] for e in map(json.loads, (directory / "index.jsonl").read_text().splitlines())}
    assert len(files) == 12
    for path in files:
        record = records[index[os.path.relpath(path, directory)]]
        item = sf.normalize(sf.load_feature_file(path), max_len=4096)
        assert item["input_ids"][0].tolist() == record.prompt_ids + record.output_ids
        with torch.no_grad():
            ref = model(torch.tensor([record.input_ids]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(item["hidden_state"][0].float(), torch.cat([ref[i][0] for i in LAYERS], -1),
                                   rtol=2 ** -7, atol=1e-3)  # bf16 rounding
        torch.testing.assert_close(item["target"][0].float(), ref[-1][0], rtol=2 ** -7, atol=1e-3)


# -- trainer layouts --------------------------------------------------------------------------------
TRAINER_LAYOUTS = ["speculators", "specforge"]


@pytest.mark.parametrize("layout", TRAINER_LAYOUTS)
def test_trainer_layout_holds_exactly_the_native_states(layout, models, samples, tmp_path):
    """Same batches, same model: the trainer's files hold bit for bit what the native shards hold, and the
    last state is on the side of the norm the trainer expects (speculators applies the verifier's norm)."""
    model = models["llama"]
    got = run(samples, tmp_path, model, name=layout, layout=layout, max_batch_size=8)
    final = {"speculators": "pre_norm", "specforge": "post_norm"}[layout]
    native = run(samples, tmp_path, model, name="native", final=final, max_batch_size=8)
    a, b = HiddenStates(native.directory), HiddenStates(got.directory)
    assert b.manifest["layout"] == layout and b.manifest["final"] == final and b.ids == [s.id for s in samples]
    assert b.manifest["num_files"] == len(samples) and b.manifest["num_tokens"] == sum(len(s) for s in samples)
    for s in samples:
        x, y = a[s.id], b[s.id]
        assert y.input_ids.tolist() == s.input_ids and y.loss_mask.tolist() == s.loss_mask
        assert torch.equal(x.aux_hidden_states, y.aux_hidden_states)
        assert torch.equal(x.final_hidden_state, y.final_hidden_state)
    decoder = find_decoder(model)
    s = samples[0]
    aux, post = reference_states(model, s)
    last = b[s.id].final_hidden_state.float()
    torch.testing.assert_close(b[s.id].aux_hidden_states.float(), aux, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(decoder.module.norm(last) if final == "pre_norm" else last, post, rtol=2e-2, atol=2e-2)


def test_speculators_files_are_what_arrowdataset_reads(models, samples, tmp_path):
    """The directory is a torch-format Arrow dataset (row i = sample i) with hidden_states/hs_{i} beside it."""
    from datasets import load_from_disk
    from safetensors.torch import load_file

    result = run(samples, tmp_path, models["llama"], layout="speculators", max_batch_size=5)
    data = load_from_disk(str(result.directory))
    assert data.format["type"] == "torch" and len(data) == len(samples)
    assert set(data.column_names) >= {"input_ids", "loss_mask", "seq_len"}
    for i, s in enumerate(samples):
        row = data[i]
        assert row["input_ids"].dtype == torch.int64 and row["input_ids"].tolist() == s.input_ids
        assert row["loss_mask"].tolist() == s.loss_mask and int(row["seq_len"]) == len(s)
        hs = load_file(str(result.directory / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(hs["token_ids"], row["input_ids"])  # the trainer's own check
        assert hs["hidden_states"].shape == (len(s), 4, H) and hs["hidden_states"].dtype == torch.bfloat16
    trainer = result.manifest["trainer"]
    assert trainer["target_layer_ids"] == list(LAYERS) and trainer["hidden_states_backend"] == "file"


def test_specforge_files_read_as_offline_eagle3_dataset_does(models, samples, tmp_path):
    from tests.helpers import specforge_reader as sf

    result = run(samples, tmp_path, models["llama"], layout="specforge", max_batch_size=5)
    native = HiddenStates(run(samples, tmp_path, models["llama"], name="native", max_batch_size=5).directory)
    files = sf.list_feature_files(str(result.directory))
    assert len(files) == len(samples)  # nothing else under the root looks like a sample
    by_row = {int(os.path.basename(f)[len("data_"):-len(".ckpt")]): f for f in files}
    for i, s in enumerate(samples):
        raw = sf.load_feature_file(by_row[i])
        assert raw["input_ids"].shape == (len(s),) and raw["aux_hidden_state"].shape == (1, len(s), 3 * H)
        # each file holds its own sample only (a view would drag its whole write batch into every file)
        assert os.path.getsize(by_row[i]) < len(s) * (4 * H * 2 + 16) + 4096
        item = sf.normalize(raw, max_len=2048)
        assert item["input_ids"][0].tolist() == s.input_ids
        assert item["loss_mask"][0].tolist() == s.loss_mask[:-1] + [0]  # SpecForge never supervises the last
        ref = native[s.id]
        assert torch.equal(item["hidden_state"][0], ref.aux_hidden_states.flatten(1))
        assert torch.equal(item["target"][0], ref.final_hidden_state)
    assert result.manifest["trainer"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in LAYERS]


@pytest.mark.parametrize("layout", TRAINER_LAYOUTS)
def test_trainer_layout_kill_and_resume(layout, models, samples, tmp_path):
    model = models["deepseek_v3"]
    small = dict(layout=layout, storage="fp32", shard_bytes=4 * H * 4 * 40)  # files land every ~40 tokens
    whole = run(samples, tmp_path / "a", model, max_batch_size=4, **small)
    with pytest.raises(Killed):
        run(samples, tmp_path / "b", model, max_batch_size=4, on_batch=_kill_after(2), **small)
    out = tmp_path / "b" / "hidden_states" / "set"
    assert not (out / "manifest.json").exists()
    # what a kill mid-write leaves: a temp file, and a file of a sample whose index line never landed
    from eagledata.paths import HiddenStateFiles
    from eagledata.training.storage import read_parts

    stored = read_parts(HiddenStateFiles(out))
    row = next(i for i, s in enumerate(samples) if s.id not in stored)
    name = f"hidden_states/hs_{row}.safetensors" if layout == "speculators" else f"rows_0-2000/data_{row}.ckpt"
    (out / name).parent.mkdir(exist_ok=True)
    (out / name).write_bytes(b"partial")
    (out / name).with_name(".tmp-0123").write_bytes(b"partial")
    if layout == "specforge":  # SpecForge would train on any *.ckpt under the root
        (out / "rows_0-2000" / "data_999.ckpt").write_bytes(b"not ours")
    resumed = run(samples, tmp_path / "b", model, max_batch_size=3, **small)
    assert resumed.complete and 0 < resumed.skipped < len(samples)
    assert resumed.extracted + resumed.skipped == len(samples)
    assert not (out / name).with_name(".tmp-0123").exists() and not (out / "rows_0-2000" / "data_999.ckpt").exists()
    _assert_same_set(whole.directory, out, samples)


def test_trainer_layout_refuses_a_reordered_set_and_fp8(models, samples, tmp_path):
    run(samples[:5], tmp_path, models["llama"], layout="speculators")
    with pytest.raises(InputError, match="order changed"):
        run(samples[:5][::-1], tmp_path, models["llama"], layout="speculators")
    with pytest.raises(InputError, match="speculators layout stores bf16 or fp32, not fp8"):
        run(samples, tmp_path, "no-such-checkpoint", name="fp8", layout="speculators", storage="fp8")


def test_convert_native_to_each_layout_without_recompute(models, samples, tmp_path):
    import subprocess
    import sys

    from eagledata.training.convert import convert

    model = models["llama"]
    pre = run(samples, tmp_path, model, name="pre", final="pre_norm", max_batch_size=8)
    direct = run(samples, tmp_path, model, name="direct", layout="speculators", max_batch_size=8)
    converted = convert(pre.directory, tmp_path / "conv", "speculators", progress=False)
    assert converted.converted == len(samples) and converted.manifest["converted_from"] == str(pre.directory)
    a, b = HiddenStates(direct.directory), HiddenStates(tmp_path / "conv")
    assert b.ids == a.ids and b.manifest["layout"] == "speculators"
    for s in samples:
        assert torch.equal(a[s.id].aux_hidden_states, b[s.id].aux_hidden_states)
        assert torch.equal(a[s.id].final_hidden_state, b[s.id].final_hidden_state)
    assert convert(pre.directory, tmp_path / "conv", "speculators", progress=False).converted == 0  # resumes
    back = HiddenStates(convert(tmp_path / "conv", tmp_path / "back", "eagledata", progress=False).directory)
    assert back.ids == a.ids and all(torch.equal(back[s.id].aux_hidden_states, a[s.id].aux_hidden_states)
                                     for s in samples)  # per-sample files read one by one, stored as shards
    with pytest.raises(InputError, match="source states are pre_norm, but specforge expects post_norm"):
        convert(pre.directory, tmp_path / "sf", "specforge", progress=False)

    post = run(samples, tmp_path, model, name="post", max_batch_size=8)
    sf = convert(post.directory, tmp_path / "sf", "specforge", progress=False)
    assert torch.serialization.get_crc32_options()  # switched off for SpecForge's files only while they are written
    with zipfile.ZipFile(sf.directory / "rows_0-2000" / "data_0.ckpt") as z:  # saved in the writer's thread
        assert [i.CRC for i in z.infolist() if "/data/" in i.filename] == [0, 0, 0, 0]
    fp8 = run(samples, tmp_path, model, name="fp8", storage="fp8", max_batch_size=8)
    cmd = [sys.executable, "-m", "eagledata.hidden_states", "convert", "--layout", "specforge",
           str(fp8.directory), str(tmp_path / "sf8")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["converted"] == len(samples) and report["layout"] == "specforge"
    c = HiddenStates(tmp_path / "sf8")
    assert c.manifest["storage"] == "bf16" and 0 < c.manifest["reconstruction_rel_rmse"] < 0.05
    ref = HiddenStates(fp8.directory)
    for s in samples[:3]:
        torch.testing.assert_close(c[s.id].aux_hidden_states.float(), ref[s.id].aux_hidden_states,
                                   rtol=1e-2, atol=1e-2)


def test_filesystem_type_is_the_longest_mount_point_holding_the_path():
    from eagledata.files import filesystem_type

    mounts = ("/dev/vda / ext4 rw 0 0\nsrv:/x /mnt/my\\040data nfs4 rw 0 0\n"
              "s3fs /mnt/my\\040data/sub fuse.s3fs rw 0 0\n")
    assert [filesystem_type(p, mounts) for p in ("/mnt/my data/a", "/mnt/my data/sub/b", "/mnt/my datax", "/")] == \
        ["nfs4", "fuse.s3fs", "ext4", "ext4"]
    assert filesystem_type("/x", "") == ""


@pytest.mark.parametrize("together", [True, False])
def test_write_durably_syncs_a_batch_at_once_only_where_the_filesystem_allows(tmp_path, monkeypatch, together):
    from collections import Counter

    from eagledata.training.storage import common

    calls: Counter = Counter()

    def counted(name: str):
        real = getattr(common, name)

        def call(path):
            calls[name] += 1
            real(path)
        return call

    for name in ("fsync", "syncfs", "start_writeback"):
        monkeypatch.setattr(common, name, counted(name))
    monkeypatch.setattr(common, "batch_sync", lambda directory: together)
    files = [(tmp_path / f"d{i % 2}" / f"f{i}.bin", lambda p, i=i: p.write_bytes(bytes([i]) * 1000))
             for i in range(10)]
    for folder in ("d0", "d1"):
        (tmp_path / folder).mkdir()
    common.write_durably(files)
    assert all(p.read_bytes() == bytes([i]) * 1000 for i, (p, _) in enumerate(files))
    assert sorted(q.name for q in tmp_path.rglob("*") if q.is_file()) == sorted(p.name for p, _ in files)
    # each file written back at once and one syncfs, or an fsync each; both then fsync the two folders
    assert calls == (Counter(start_writeback=10, syncfs=1, fsync=2) if together else Counter(fsync=12))


def test_convert_in_worker_processes_resumes_after_a_failed_part(models, samples, tmp_path, monkeypatch):
    from eagledata.paths import HiddenStateFiles
    from eagledata.training import convert as conv
    from eagledata.training.assembly import samples_hash
    from eagledata.training.storage import read_parts

    pre = run(samples, tmp_path, models["llama"], name="pre", final="pre_norm", storage="fp32",
              max_batch_size=2, shard_bytes=4 * H * 4 * 60)  # a shard every ~60 tokens
    ref = HiddenStates(pre.directory)
    assert len(list(pre.directory.glob("shard-*.safetensors"))) >= 4
    monkeypatch.setattr(conv, "PART_BYTES", 4 * H * 4 * 60)  # about a part per shard: workers take several each
    blocked = tmp_path / "conv" / "hidden_states" / f"hs_{len(samples) // 2}.safetensors"
    blocked.mkdir(parents=True)  # one sample's file cannot be written: its part fails
    with pytest.raises(IsADirectoryError):
        conv.convert(pre.directory, tmp_path / "conv", "speculators", workers=2, progress=False)
    files = HiddenStateFiles(tmp_path / "conv")
    stored = read_parts(files)
    assert 0 < len(stored) < len(samples) and samples[len(samples) // 2].id not in stored
    assert not files.manifest.exists() and len(list(files.parts.glob("convert-*.jsonl"))) > 1  # a part each

    blocked.rmdir()
    again = conv.convert(pre.directory, tmp_path / "conv", "speculators", workers=2, progress=False)
    assert gc.get_freeze_count() == 0  # objects frozen for forked workers are handed back to the collector
    assert again.workers == 2 and again.skipped == len(stored) and again.converted == len(samples) - len(stored)
    out = HiddenStates(tmp_path / "conv")
    assert out.ids == ref.ids and out.manifest["num_samples"] == len(samples)
    assert out.manifest["samples_hash"] == ref.manifest["samples_hash"] == samples_hash(samples)  # from the parts
    for s in samples:
        assert torch.equal(out[s.id].aux_hidden_states, ref[s.id].aux_hidden_states)
        assert torch.equal(out[s.id].final_hidden_state, ref[s.id].final_hidden_state)
    with pytest.raises(InputError, match="workers"):
        conv.convert(pre.directory, tmp_path / "conv2", "speculators", workers=0, progress=False)


def test_exports_carry_exact_ids_text_and_an_arrow_form(tok, records_file, tmp_path):
    from datasets import load_from_disk

    asm = assemble([records_file])
    rows = [json.loads(x) for x in export_specforge(asm, tmp_path / "sf.jsonl", tok).read_text().splitlines()]
    for row, s in zip(rows, asm.samples):
        assert row["input_ids"] == s.input_ids and row["loss_mask"] == s.loss_mask
        assert row["text"] == tok.decode(s.input_ids)
    path = export_speculators(asm, tmp_path / "speculators.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["seq_len"] for r in lines] == [len(s) for s in asm.samples]
    arrow = load_from_disk(str(tmp_path / "speculators"))
    assert [arrow[i]["input_ids"].tolist() for i in range(len(arrow))] == [s.input_ids for s in asm.samples]


def test_arrow_form_is_what_datasets_from_dict_makes_in_any_number_of_chunks(samples, tmp_path):
    from datasets import Dataset, Features, Sequence, Value, load_from_disk

    from eagledata.training import exports

    features = Features({"id": Value("string"), "input_ids": Sequence(Value("int64")),
                         "loss_mask": Sequence(Value("int64")), "seq_len": Value("int64")})
    ref = Dataset.from_dict({"id": [s.id for s in samples], "input_ids": [s.input_ids for s in samples],
                             "loss_mask": [s.loss_mask for s in samples], "seq_len": [len(s) for s in samples]},
                            features=features)  # how the Arrow form was made before
    freqs = []
    for chunk in (1 << 30, 25):  # 25 tokens: a chunk per sample or two
        got = load_from_disk(str(exports.save_arrow(samples, tmp_path / f"a{chunk}", chunk_tokens=chunk)))
        freqs.append(torch.load(tmp_path / f"a{chunk}" / "token_freq.pt", weights_only=True))
        assert got.format["type"] == "torch" and len(got) == len(samples)
        assert got.features == ref.features
        got.reset_format()
        assert got.to_dict() == ref.to_dict()
    assert freqs[0] == freqs[1]  # counted per chunk, summed: the same whatever the chunking


def test_headless_extraction_logs_status_lines(models, samples, tmp_path, caplog):
    """No widget frontend: a status line through logging every status_interval_s (checked at batch ends)."""
    import logging
    import time

    total = sum(len(s) for s in samples)
    with caplog.at_level(logging.INFO, logger="eagledata"):
        result = extract(samples, tmp_path, "set", models["llama"], options=ExtractOptions(max_batch_size=1),
                         status_interval_s=0.2, on_batch=lambda n: time.sleep(0.1))
    lines = [r.getMessage() for r in caplog.records if r.name == "eagledata.hidden_states"]
    assert result.complete and 4 <= len(lines) <= len(samples) + 1  # ~1.2 s of batches at 0.2 s, + the final one
    assert all(line.startswith("hidden states set rank 0/1: ") and " tok/s | ETA " in line for line in lines)
    assert all(re.search(r" \| memory cpu [\d.,]+/[\d.,]+ GB \| scoring \d+% of the time$", line.split(" | ended")[0])
               for line in lines), lines[-1]  # the extraction scores by default, timed apart on this backend
    assert lines[-1].startswith(f"hidden states set rank 0/1: {total:,}/{total:,} tokens (100.0%), "
                                f"{len(samples)}/{len(samples)} samples") and "ended after" in lines[-1]


def test_conversion_reads_runs_of_neighbours_within_one_shard():
    from eagledata.training.convert import runs
    from eagledata.training.storage import IndexEntry

    entries = [IndexEntry(f"s{i}", f"shard-{i // 5:05d}.safetensors", (i % 5) * 10, 10) for i in range(12)]
    items = [(e, row) for row, e in enumerate(entries)]
    got = [[e.id for e, _ in run] for run in runs(items, max_tokens=30)]
    assert got == [["s0", "s1", "s2"], ["s3", "s4"], ["s5", "s6", "s7"], ["s8", "s9"], ["s10", "s11"]]
    assert [len(r) for r in runs(items, max_tokens=1)] == [1] * 12


def test_conversion_parts_shrink_toward_the_end_so_workers_finish_together():
    from eagledata.training import convert as conv
    from eagledata.training.storage import IndexEntry

    per_token = 4 * 256 * 2
    items = [(IndexEntry(f"s{i}", "shard-00000.safetensors", i * 300, 300), i) for i in range(8_000)]  # 4.9 GB
    parts = conv.split_parts(items, per_token, workers=3)
    assert [item for part in parts for item in part] == items  # every sample once, in order
    sizes = [sum(e.length for e, _ in part) * per_token for part in parts]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] >= conv.PART_BYTES > sizes[0] - 300 * per_token
    assert conv.MIN_PART_BYTES <= sizes[-2] < conv.MIN_PART_BYTES + 300 * per_token  # the last is what is left
    assert sum(s == sizes[0] for s in sizes) > 10 and len(parts) < 40
