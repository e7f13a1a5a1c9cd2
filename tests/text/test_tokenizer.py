import random
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagledata.errors import InputError
from eagledata.text.tokenizer import KimiTokenizer, split_long_runs

GOLDEN_TEXT = "<|im_assistant|>assistant<|im_middle|><think>Let me think.</think>Answer.<|im_end|>"
GOLDEN_IDS = [163588, 69702, 163601, 163606, 9413, 1019, 2704, 13, 163607, 33853, 13, 163586]


def reference_split(s: str, max_len: int) -> list[str]:
    """The reference tokenizer's character loop, kept here as the oracle for our fast version."""
    pieces, cur_len, cur_space, start = [], 0, (s[0].isspace() if s else False), 0
    for i, ch in enumerate(s):
        now = ch.isspace()
        if cur_space ^ now:
            cur_len, cur_space = 1, now
        else:
            cur_len += 1
            if cur_len > max_len:
                pieces.append(s[start:i])
                start, cur_len = i, 1
    pieces.append(s[start:])
    return pieces


def reference_chunks(s: str, max_len: int, chunk: int) -> list[str]:
    return [p for i in range(0, len(s), chunk) for p in reference_split(s[i:i + chunk], max_len)] or [""]


def test_golden_with_specials(tok):
    assert tok.encode(GOLDEN_TEXT, allow_special=True) == GOLDEN_IDS
    assert tok.decode(GOLDEN_IDS) == GOLDEN_TEXT


def test_special_strings_stay_text_by_default(tok):
    assert tok.encode("<|im_end|>") == [27, 91, 348, 11129, 91, 29]
    assert 163606 not in tok.encode("<think>") and 163607 not in tok.encode_ordinary("</think>")


def test_special_table(tok):
    assert tok.vocab_size == 163_840
    assert tok.special_tokens["<|im_end|>"] == 163586 and tok.special_tokens["<think>"] == 163606
    assert tok.special_tokens["[PAD]"] == 163839 and tok.special_tokens["<|reserved_token_163600|>"] == 163600
    assert len(tok.special_tokens) == 256


def test_thirty_thousand_spaces_use_reference_pre_split(tok):
    text = " " * 30000
    raw = tok.encoding.encode_ordinary(text)
    ids = tok.encode(text)
    expected = tok.encoding.encode_ordinary(" " * 25000) + tok.encoding.encode_ordinary(" " * 5000)
    assert ids == expected and ids != raw
    assert tok.decode(ids) == text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", " ", "\n", "é", "\u3000", "x"]), st.integers(1, 40)), max_size=12),
       st.integers(2, 15), st.integers(5, 60))
def test_fast_split_matches_reference_loop(runs, max_len, chunk):
    text = "".join(ch * n for ch, n in runs)
    assert split_long_runs(text, max_run=max_len, max_chunk=chunk) == reference_chunks(text, max_len, chunk)


def test_long_mixed_text_matches_reference(tok):
    rnd = random.Random(0)
    text = "".join(rnd.choice([" " * 26000, "x" * 51000, "word ", "\n"]) for _ in range(30))
    expected = [i for p in reference_chunks(text, 25000, 400000) for i in tok.encoding.encode_ordinary(p)]
    assert tok.encode(text) == expected


def test_missing_file_names_it(tokenizer_dir, tmp_path):
    shutil.copy(tokenizer_dir / "tokenizer_config.json", tmp_path)
    with pytest.raises(InputError, match=r"tiktoken\.model.*missing tiktoken\.model"):
        KimiTokenizer.load(tmp_path)


def test_corrupt_ranks_name_file_and_line(tokenizer_dir, tmp_path):
    lines = (tokenizer_dir / "tiktoken.model").read_bytes().splitlines()
    lines[41] = b"!!notbase64 41"
    (tmp_path / "tiktoken.model").write_bytes(b"\n".join(lines) + b"\n")
    shutil.copy(tokenizer_dir / "tokenizer_config.json", tmp_path)
    with pytest.raises(InputError, match=r"tiktoken\.model:42: corrupt"):
        KimiTokenizer.load(tmp_path)


def test_truncated_ranks_file(tokenizer_dir, tmp_path):
    lines = (tokenizer_dir / "tiktoken.model").read_bytes().splitlines()[:1000]
    (tmp_path / "tiktoken.model").write_bytes(b"\n".join(lines))
    shutil.copy(tokenizer_dir / "tokenizer_config.json", tmp_path)
    with pytest.raises(InputError, match=r"tiktoken\.model: corrupt BPE ranks file: 1000 ranks"):
        KimiTokenizer.load(tmp_path)


def test_bad_config_names_file(tokenizer_dir, tmp_path):
    shutil.copy(tokenizer_dir / "tiktoken.model", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"added_tokens_decoder": {')
    with pytest.raises(InputError, match=r"tokenizer_config\.json:1: not valid JSON"):
        KimiTokenizer.load(tmp_path)


def test_not_a_dir_nor_hub_id(tmp_path):
    with pytest.raises(InputError, match="neither a directory nor a hub id"):
        KimiTokenizer.load(tmp_path / "nope" / "deeper")


def test_decode_rejects_ids_outside_vocab(tok):
    with pytest.raises(InputError, match="outside the Kimi vocabulary"):
        tok.decode([1, 163840])


def test_batch_equals_single(tok):
    texts = ["hello world", "量子", " " * 30000, "", "🎉 emoji"] * 5
    assert tok.encode_ordinary_batch(texts, threads=2) == [tok.encode_ordinary(t) for t in texts]


BUNDLED_SHA256 = {
    "tiktoken.model": "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103",
    "tokenizer_config.json": "12fcab43d2b6068f46769f5ff373960bf7c17a94d7abbc50e2491306b2f6cf58",
    "chat_template.jinja": "b4b2cd69d0c6611deede457b6792d8ca81125461ad6d13f0153c695db885209b",
}


def test_bundled_files_are_the_pinned_kimi_k25_files_with_their_license():
    import hashlib

    from eagledata.text.tokenizer import BUNDLED_DIR

    for name, digest in BUNDLED_SHA256.items():
        assert hashlib.sha256((BUNDLED_DIR / name).read_bytes()).hexdigest() == digest, name
    license_text = (BUNDLED_DIR / "LICENSE").read_text()
    assert license_text.startswith("Modified MIT License") and 'display "Kimi K2.5"' in license_text


def test_default_is_the_bundled_copy_without_env_or_network(monkeypatch):
    """No directory, no $EAGLEDATA_TOKENIZER_DIR, the hub unreachable: the bundled files load."""
    from eagledata.text.tokenizer import BUNDLED_DIR, load_tokenizer

    monkeypatch.delenv("EAGLEDATA_TOKENIZER_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = load_tokenizer()
    assert tok.directory == BUNDLED_DIR
    assert tok.encode(GOLDEN_TEXT, allow_special=True) == GOLDEN_IDS


def test_env_var_and_explicit_directory_win_over_the_bundled_copy(tokenizer_dir, tmp_path, monkeypatch):
    from eagledata.text.tokenizer import load_tokenizer

    for name in BUNDLED_SHA256:
        shutil.copy(tokenizer_dir / name, tmp_path)
    monkeypatch.setenv("EAGLEDATA_TOKENIZER_DIR", str(tmp_path))
    assert load_tokenizer().directory == tmp_path
    other = tmp_path / "other"
    other.mkdir()
    for name in BUNDLED_SHA256:
        shutil.copy(tokenizer_dir / name, other)
    assert load_tokenizer(other).directory == other
