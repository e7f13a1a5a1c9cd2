"""Kimi (tiktoken BPE) tokenizer loaded from its files, with the reference pre-split of long runs.

We keep our own loader instead of `trust_remote_code` so that ids are reproducible offline, the
load fails with a message naming the bad file, and encoding runs at raw tiktoken speed.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import tiktoken

from ..errors import InputError
from .decoding import TextOfIds
from .structure import Structure, ToolSection

# The Kimi pre-tokenizer (tiktoken `pat_str`), eight alternatives joined with `|`.
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

NUM_RANKS = 163_584
NUM_SPECIAL = 256
VOCAB_SIZE = NUM_RANKS + NUM_SPECIAL

# The reference tokenizer splits before BPE (tiktoken issue 195): chunks of 400k characters, then
# runs of more than 25k whitespace or non-whitespace characters. Ids differ without it.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
# `re`'s \s is str.isspace(), the reference's test. A lookbehind anchors each try at a run start, so
# the scan is linear even on a 100k-character run.
def _long_run_re(max_run: int) -> re.Pattern[str]:
    n = max_run + 1
    return re.compile(rf"(?<!\S)\S{{{n}}}|(?<!\s)\s{{{n}}}")


_LONG_RUN = _long_run_re(MAX_RUN_CHARS)
_RUNS = re.compile(r"\s+|\S+")

REQUIRED_FILES = ("tiktoken.model", "tokenizer_config.json")
# A hub download takes what either family's loader reads (Kimi: tiktoken.model; a HF family: tokenizer.json).
HUB_FILES = ["tiktoken.model", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
             "generation_config.json"]

# The special ids the output-id recipe places by structure (docs/FORMATS.md#output-ids-and-loss-mask): the turn's
# end, the reasoning's end, and the tool-call section (docs/FORMATS.md#tool-calls).
IM_END, END_THINK = 163586, 163607
SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = 163595, 163596, 163597, 163598, 163599
KIMI_STRUCTURE = Structure(end_of_turn=IM_END, end_of_reasoning=END_THINK,
                           tool_calls=ToolSection(SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END))


def split_long_runs(text: str, max_run: int = MAX_RUN_CHARS, max_chunk: int = MAX_ENCODE_CHARS) -> list[str]:
    """The reference pre-split: 400k-char chunks, then cut runs longer than 25k characters.

    A run of n same-class characters is cut every 25k characters counted from the run's start
    (the cut piece keeps whatever preceded it in the chunk), exactly as the reference loop does.
    """
    if len(text) <= min(max_run, max_chunk):
        return [text]
    long_run = _LONG_RUN if max_run == MAX_RUN_CHARS else _long_run_re(max_run)
    pieces: list[str] = []
    for start in range(0, len(text), max_chunk):
        chunk = text[start:start + max_chunk]
        if not long_run.search(chunk):
            pieces.append(chunk)
            continue
        cut_from = 0
        for run in _RUNS.finditer(chunk):
            for cut in range(run.start() + max_run, run.end(), max_run):
                pieces.append(chunk[cut_from:cut])
                cut_from = cut
        pieces.append(chunk[cut_from:])
    return pieces


def _read_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise InputError(f"cannot read BPE ranks: {e.strerror}", path) from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            raise InputError("corrupt BPE ranks file: expected '<base64 token> <rank>'", path, lineno) from None
        if rank != len(ranks) or token in ranks:
            raise InputError(f"corrupt BPE ranks file: rank {rank} out of order or token repeated "
                             f"(expected rank {len(ranks)})", path, lineno)
        ranks[token] = rank
    if len(ranks) != NUM_RANKS:
        raise InputError(f"corrupt BPE ranks file: {len(ranks)} ranks, Kimi has {NUM_RANKS}", path)
    return ranks


def _read_special_tokens(path: Path) -> dict[str, int]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        decoder = config["added_tokens_decoder"]
        named = {int(i): entry["content"] for i, entry in decoder.items()}
    except OSError as e:
        raise InputError(f"cannot read tokenizer config: {e.strerror}", path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e.msg}", path, e.lineno) from None
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError("no usable 'added_tokens_decoder' table", path, field="added_tokens_decoder") from None
    bad = [i for i in named if not NUM_RANKS <= i < VOCAB_SIZE]
    if bad:
        raise InputError(f"special ids {bad[:5]} outside {NUM_RANKS}..{VOCAB_SIZE - 1}", path,
                         field="added_tokens_decoder")
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(NUM_RANKS, VOCAB_SIZE)}


def resolve_tokenizer_dir(name_or_path: str | Path) -> Path:
    """A local directory as is; a hub id (`org/name`) downloaded through huggingface_hub."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if path.exists() or name.count("/") != 1 or name.startswith((".", "/")):
        raise InputError("tokenizer is neither a directory nor a hub id like 'moonshotai/Kimi-K2.5'",
                         name)
    from huggingface_hub import snapshot_download  # network path only

    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as e:  # hub errors are many classes; the message is what matters
        raise InputError(f"could not fetch tokenizer files from the hub: {e}", name) from None


class Tokenizer(Protocol):
    """What every stage asks of the model's tokenizer: ids for text with special tokens disallowed (or allowed,
    as a server tokenizes), text for ids, its chat template, its structural ids (`structure`: end of turn, end of
    reasoning, tool-call section), which ids are control tokens, and a fingerprint records are checked against.
    `KimiTokenizer` is one, `HFTokenizer` (a checkpoint's tokenizer.json) another (text/README.md)."""

    directory: Path
    chat_template: str | None
    fingerprint: str
    structure: Structure

    @property
    def vocab_size(self) -> int: ...
    @property
    def special_ids(self) -> frozenset[int]: ...
    @property
    def template_tokens(self) -> dict[str, str]: ...
    @property
    def special_strings_re(self) -> re.Pattern[str]: ...
    def encode_ordinary(self, text: str) -> list[int]: ...
    def encode(self, text: str, allow_special: bool = False) -> list[int]: ...
    def encode_ordinary_batch(self, texts: Sequence[str], threads: int = 2) -> list[list[int]]: ...
    def decode_bytes(self, ids: Iterable[int]) -> bytes: ...
    def decode(self, ids: Iterable[int], errors: str = "replace") -> str: ...
    def token_strings(self, ids: Iterable[int]) -> list[str]: ...


@dataclass(eq=False)
class KimiTokenizer(TextOfIds):
    """Encode/decode Kimi ids. Text is always encoded with specials disallowed unless asked."""

    directory: Path
    encoding: tiktoken.Encoding
    special_tokens: dict[str, int]
    chat_template: str | None
    fingerprint: str
    id_to_special: dict[int, str] = field(init=False)
    structure: Structure = KIMI_STRUCTURE

    def __post_init__(self) -> None:
        self.id_to_special = {i: s for s, i in self.special_tokens.items()}

    @classmethod
    def load(cls, name_or_path: str | Path) -> KimiTokenizer:
        directory = resolve_tokenizer_dir(name_or_path)
        for name in REQUIRED_FILES:
            if not (directory / name).is_file():
                raise InputError(f"tokenizer directory is missing {name}", directory / name)
        ranks_path = directory / "tiktoken.model"
        ranks = _read_ranks(ranks_path)
        special = _read_special_tokens(directory / "tokenizer_config.json")
        template = None
        if (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        else:
            template = json.loads((directory / "tokenizer_config.json").read_text()).get("chat_template")
        digest = hashlib.sha256(ranks_path.read_bytes())
        digest.update(json.dumps(special, sort_keys=True).encode())
        encoding = tiktoken.Encoding(name=f"kimi:{directory}", pat_str=PAT_STR,
                                     mergeable_ranks=ranks, special_tokens=special)
        return cls(directory, encoding, special, template, digest.hexdigest())

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    @property
    def special_ids(self) -> frozenset[int]:
        """The 256 ids above the BPE ranks: control tokens, never produced by encoding text."""
        return frozenset(range(NUM_RANKS, VOCAB_SIZE))

    @property
    def template_tokens(self) -> dict[str, str]:
        """The special-token strings a chat template may name (`bos_token`, …): K2.5's uses none."""
        return {}

    # -- encoding -----------------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """Plain text to ids: a literal `<think>` or `<|im_end|>` stays text."""
        pieces = split_long_runs(text)
        if len(pieces) == 1:
            return self.encoding.encode_ordinary(text)
        out: list[int] = []
        for piece in pieces:
            out.extend(self.encoding.encode_ordinary(piece))
        return out

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Encode; with `allow_special` every special-token string becomes its id (server behaviour)."""
        if not allow_special:
            return self.encode_ordinary(text)
        out: list[int] = []
        for piece in split_long_runs(text):
            out.extend(self.encoding.encode(piece, allowed_special="all"))
        return out

    def encode_ordinary_batch(self, texts: Sequence[str], threads: int = 2) -> list[list[int]]:
        """Many texts on several cores: tiktoken releases the GIL while it runs BPE."""
        if threads <= 1 or len(texts) < 2:
            return [self.encode_ordinary(t) for t in texts]
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(self.encode_ordinary, texts, chunksize=max(1, len(texts) // (threads * 8))))

    # -- decoding -----------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = list(ids)
        bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
        if bad:
            raise InputError(f"token ids {bad[:5]} outside the Kimi vocabulary (0..{VOCAB_SIZE - 1})")
        return self.encoding.decode_bytes(ids)


    @cached_property
    def special_strings_re(self) -> re.Pattern[str]:
        """Matches any special-token string: used to flag literal specials inside text."""
        return re.compile("|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True)))


DEFAULT_HUB_ID = "moonshotai/Kimi-K2.5"  # where other revisions come from (needs a network)
# The Kimi K2.5 files shipped inside the package (README and LICENSE there): the default, so a machine with no
# network and no hub cache has the real tokenizer.
BUNDLED_DIR = Path(__file__).resolve().parent / "assets" / "kimi-k2.5"
TOKENIZER_ENV = "EAGLEDATA_TOKENIZER_DIR"


def default_tokenizer_source() -> str | Path:
    """`$EAGLEDATA_TOKENIZER_DIR` when set, else the bundled Kimi K2.5 files."""
    import os

    return os.environ.get(TOKENIZER_ENV) or BUNDLED_DIR


def load_tokenizer(name_or_path: str | Path | None = None) -> Tokenizer:
    """The tokenizer named (a directory, or a hub id such as `moonshotai/Kimi-K2.5` for another revision),
    else `$EAGLEDATA_TOKENIZER_DIR`, else the bundled Kimi K2.5 files (no network needed).

    The folder's files name the family: `tiktoken.model` is Kimi's layout (`KimiTokenizer`); a Hugging Face
    checkpoint's `tokenizer.json` is any other family's (`HFTokenizer`, its structural ids from its own files)."""
    directory = resolve_tokenizer_dir(name_or_path or default_tokenizer_source())
    if (directory / "tiktoken.model").is_file() or not (directory / "tokenizer.json").is_file():
        return KimiTokenizer.load(directory)  # a folder with neither file fails there, naming tiktoken.model
    from .hf_tokenizer import HFTokenizer

    return HFTokenizer.load(directory)
