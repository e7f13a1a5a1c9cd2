"""A Hugging Face checkpoint's tokenizer (`tokenizer.json`) behind the text stage's `Tokenizer` interface: the second
model family (SmolLM2-135M-Instruct, converted by `eagledata.quality.smollm2`), and any folder laid out as a HF
checkpoint.

Everything comes from the folder's own files, never from code: the BPE and its special tokens from tokenizer.json,
the chat template from chat_template.jinja (or tokenizer_config.json's `chat_template`), the end of turn from
tokenizer_config.json's `eos_token`, checked against generation_config.json's `eos_token_id` when the folder has one
(a server stops on that id: the two must agree or records would end on a token the recipe does not place). A HF
family has no reasoning section and no tool-call section here: its `Structure` is the end of turn alone.

We use the `tokenizers` library directly (what transformers' fast tokenizers and vLLM run), two copies of the same
file: one that recognizes special-token strings (a server rendering a prompt) and one that never does
(`encode_special_tokens`: answer text, where a literal `<|im_end|>` stays text).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import InputError
from .decoding import TextOfIds
from .structure import Structure

REQUIRED_FILES = ("tokenizer.json", "tokenizer_config.json")
# What transformers' `apply_chat_template` hands the template besides the messages (a template may write them).
TEMPLATE_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted (`bytes_to_unicode`): each printable stand-in character → its byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e.msg}", path, e.lineno) from None
    if not isinstance(data, dict):
        raise InputError("not a JSON object", path)
    return data


def _token_text(value: Any) -> str | None:
    """A tokenizer_config special-token entry: a string, or an AddedToken dict with `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


@dataclass(eq=False)
class HFTokenizer(TextOfIds):
    """Encode/decode a HF checkpoint's ids. Text is encoded with special tokens disallowed unless asked."""

    directory: Path
    chat_template: str | None
    fingerprint: str
    structure: Structure
    specials: dict[str, int]  # special-token string → id (the control tokens)
    template_tokens: dict[str, str]  # bos_token, eos_token, … as tokenizer_config.json names them (the template's)
    _plain: Any = field(repr=False)  # tokenizers.Tokenizer that never matches special strings
    _server: Any = field(repr=False)  # the same file matching them, as a server encodes a rendered prompt
    _pieces: list[bytes | None] = field(repr=False)  # id → its bytes (None: not byte-level, decode through the decoder)
    id_to_special: dict[int, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.id_to_special = {i: s for s, i in self.specials.items()}

    @classmethod
    def load(cls, directory: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        directory = Path(directory)
        for name in REQUIRED_FILES:
            if not (directory / name).is_file():
                raise InputError(f"tokenizer directory is missing {name}", directory / name)
        path = directory / "tokenizer.json"
        try:
            server = RustTokenizer.from_file(str(path))
            plain = RustTokenizer.from_file(str(path))
        except Exception as e:  # the Rust loader raises plain Exceptions with its parser's message
            raise InputError(f"not a tokenizers file: {e}", path) from None
        plain.encode_special_tokens = True
        config = _read_json(directory / "tokenizer_config.json")
        specials = {t.content: i for i, t in server.get_added_tokens_decoder().items() if t.special}
        template = None
        if (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        elif isinstance(config.get("chat_template"), str):
            template = config["chat_template"]
        structure = Structure(end_of_turn=_end_of_turn(directory, config, specials))
        digest = hashlib.sha256(path.read_bytes())
        digest.update(json.dumps(specials, sort_keys=True).encode())
        named = {k: t for k in TEMPLATE_TOKENS if (t := _token_text(config.get(k))) is not None}
        return cls(directory, template, digest.hexdigest(), structure, specials, named, plain, server, _pieces(server))

    @property
    def vocab_size(self) -> int:
        return int(self._server.get_vocab_size(with_added_tokens=True))

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self.specials.values())


    # -- encoding -----------------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """Plain text to ids: a literal `<|im_end|>` stays text."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Encode; with `allow_special` every special-token string becomes its id (server behaviour). No BOS or
        other post-processing: a rendered chat template already holds what the model sees."""
        if not allow_special:
            return self.encode_ordinary(text)
        return list(self._server.encode(text, add_special_tokens=False).ids)

    def encode_ordinary_batch(self, texts: Sequence[str], threads: int = 2) -> list[list[int]]:
        """Many texts at once (the Rust side spreads them over its own threads)."""
        return [list(e.ids) for e in self._plain.encode_batch(list(texts), add_special_tokens=False)]

    # -- decoding -----------------------------------------------------------------------------
    def _check(self, ids: list[int]) -> None:
        bad = [i for i in ids if not 0 <= i < len(self._pieces)]
        if bad:
            raise InputError(f"token ids {bad[:5]} outside the vocabulary of {self.directory} "
                             f"(0..{len(self._pieces) - 1})")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes the ids stand for (specials as their strings): exact for byte-level BPE, so a character cut
        between tokens stays cut."""
        ids = list(ids)
        self._check(ids)
        pieces = [self._pieces[i] for i in ids]
        if all(p is not None for p in pieces):
            return b"".join(p for p in pieces if p is not None)
        return str(self._server.decode(ids, skip_special_tokens=False)).encode("utf-8")

    @cached_property
    def special_strings_re(self) -> re.Pattern[str]:
        """Matches any special-token string: used to flag literal specials inside text."""
        return re.compile("|".join(re.escape(s) for s in sorted(self.specials, key=len, reverse=True)))


def _end_of_turn(directory: Path, config: dict[str, Any], specials: dict[str, int]) -> int:
    """tokenizer_config.json's `eos_token` as an id; generation_config.json's `eos_token_id` (one id or a list),
    where present, must hold it."""
    where = directory / "tokenizer_config.json"
    eos = _token_text(config.get("eos_token"))
    if eos is None:
        raise InputError("no eos_token: the end of turn cannot be known", where, field="eos_token")
    if eos not in specials:
        raise InputError(f"eos_token {eos!r} is not a special token of tokenizer.json", where, field="eos_token")
    end = specials[eos]
    generation = directory / "generation_config.json"
    if generation.is_file():
        stop = _read_json(generation).get("eos_token_id")
        stops = stop if isinstance(stop, list) else [stop]
        if stop is not None and end not in stops:
            raise InputError(f"eos_token_id {stop} does not hold the tokenizer's end of turn {eos!r} ({end}): the "
                             "server would stop on another token", generation, field="eos_token_id")
    return end


def _pieces(tok: Any) -> list[bytes | None]:
    """Each id's bytes: byte-level BPE tokens mapped back through GPT-2's alphabet, added tokens as their UTF-8
    strings; None for a piece of another kind of vocabulary (decoded through the file's decoder instead)."""
    byte_level = _is_byte_level(json.loads(tok.to_str()))
    table = _byte_decoder()
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
    out: list[bytes | None] = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        if i in added:
            out.append(added[i].encode("utf-8"))
            continue
        piece = tok.id_to_token(i)
        if piece is None or not byte_level or any(c not in table for c in piece):
            out.append(None)
        else:
            out.append(bytes(table[c] for c in piece))
    return out


def _is_byte_level(spec: dict[str, Any]) -> bool:
    decoder = spec.get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", []) or []]
    return "ByteLevel" in kinds
