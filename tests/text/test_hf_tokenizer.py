"""The second family's tokenizer (text/hf_tokenizer.py): a HF checkpoint folder behind the `Tokenizer` interface,
ids equal to transformers' own tokenizer of the same folder, structural ids from the folder's files only, and
`load_tokenizer` choosing the family from the folder's layout (Kimi's stays Kimi's)."""
from __future__ import annotations

import json
import shutil

import pytest

from eagledata.errors import InputError
from eagledata.text import HFTokenizer, KimiTokenizer, Structure, load_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
TEXTS = ["Hello world", "  two leading spaces", "2023-12-04 at 23:15", "naïve café\r\n\tend", "🎉👍🏽🇯🇵",
         "日本語の文章。", "<|im_end|> typed as text <|im_start|>", "x" * 3000, "", "tail  "]


@pytest.fixture(scope="module")
def smol(smollm2_dir) -> HFTokenizer:
    tok = load_tokenizer(smollm2_dir)
    assert isinstance(tok, HFTokenizer)
    return tok


def copy_tokenizer(src, dst, **config_changes):
    dst.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, dst)
    if config_changes:
        path = dst / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config.update(config_changes)
        path.write_text(json.dumps(config))
    return dst


def test_the_folder_layout_names_the_family(smollm2_dir, tokenizer_dir):
    assert isinstance(load_tokenizer(smollm2_dir), HFTokenizer)
    assert isinstance(load_tokenizer(tokenizer_dir), KimiTokenizer)
    assert isinstance(load_tokenizer(), KimiTokenizer)  # the default stays K2.5


def test_structure_comes_from_the_checkpoint_files(smol):
    """SmolLM2: end of turn `<|im_end|>` (its eos_token and its generation config's eos_token_id), no reasoning, no
    tool-call section; K2.5 keeps its own."""
    assert smol.structure == Structure(end_of_turn=2)
    assert smol.token_strings([2]) == ["<|im_end|>"] and not smol.structure.reasons
    kimi = load_tokenizer()
    assert (kimi.structure.end_of_turn, kimi.structure.end_of_reasoning) == (163586, 163607)
    assert smol.vocab_size == 49152 and {0, 1, 2} <= smol.special_ids and 100 not in smol.special_ids
    assert "You are a helpful AI assistant named SmolLM" in (smol.chat_template or "")


def test_ids_equal_transformers_own_tokenizer_of_the_folder(smol, smollm2_dir):
    """As vLLM and transformers encode (special strings recognized); with them disallowed a literal stays text."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2_dir))
    for text in TEXTS:
        assert smol.encode(text, allow_special=True) == hf.encode(text, add_special_tokens=False), text
    literal = smol.encode_ordinary("<|im_end|>")
    assert 2 not in literal and smol.decode(literal) == "<|im_end|>"
    assert smol.encode("<|im_end|>", allow_special=True) == [2]
    assert smol.encode_ordinary_batch(TEXTS) == [smol.encode_ordinary(t) for t in TEXTS]


def test_decode_is_byte_exact_and_never_normalizes(smol):
    for text in TEXTS + ["e\u0301 vs \u00e9"]:
        assert smol.decode(smol.encode_ordinary(text)) == text
    ids = smol.encode_ordinary("🎉")
    assert len(ids) > 1  # a character split over byte tokens: cut, it shows U+FFFD
    assert smol.decode_bytes(ids[:-1]) == "🎉".encode()[:len(smol.decode_bytes(ids[:-1]))]
    assert "\ufffd" in smol.decode(ids[:-1])
    with pytest.raises(InputError, match="outside the vocabulary"):
        smol.decode([49152])


def test_a_generation_config_that_stops_elsewhere_is_refused(smollm2_dir, tmp_path):
    folder = copy_tokenizer(smollm2_dir, tmp_path / "t")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    with pytest.raises(InputError, match=r"generation_config\.json field 'eos_token_id'.*<\|im_end\|>"):
        load_tokenizer(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    assert load_tokenizer(folder).structure.end_of_turn == 2


@pytest.mark.parametrize("eos, message", [(None, "no eos_token"), ("</s>", "eos_token '</s>' is not a special token"),
                                          ({"content": "<|endoftext|>"}, None)])
def test_the_end_of_turn_is_the_configs_eos_token(smollm2_dir, tmp_path, eos, message):
    folder = copy_tokenizer(smollm2_dir, tmp_path / "t", eos_token=eos)
    (folder / "generation_config.json").unlink()
    if message is None:
        assert load_tokenizer(folder).structure.end_of_turn == 0
    else:
        with pytest.raises(InputError, match=f"tokenizer_config.json field 'eos_token': {message}"):
            load_tokenizer(folder)


def test_missing_or_broken_files_are_named(smollm2_dir, tmp_path):
    folder = copy_tokenizer(smollm2_dir, tmp_path / "t")
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(InputError, match="missing tokenizer_config.json"):
        load_tokenizer(folder)
    folder = copy_tokenizer(smollm2_dir, tmp_path / "u")
    (folder / "tokenizer.json").write_text("{")
    with pytest.raises(InputError, match=r"tokenizer\.json: not a tokenizers file"):
        load_tokenizer(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="missing tiktoken.model"):
        load_tokenizer(tmp_path / "empty")  # neither layout: Kimi's loader names its file
