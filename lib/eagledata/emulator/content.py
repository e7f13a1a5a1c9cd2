"""Deterministic answers made as real Kimi token ids first, so every served text has a ground truth.

Text is built from a fixed vocabulary (English, CJK, emoji, numbers, markdown), encoded once with
`encode_ordinary`, and the ids are what the "model" produced. A `max_tokens` cut happens on ids,
as a real server cuts, so it can split a multi-byte character (decoded as U+FFFD).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from itertools import accumulate

from ..records import ToolCall
from ..text import END_THINK, IM_END, Tokenizer, output_ids, parse_output_ids
from ..text.tokenizer import SECTION_BEGIN
from .catalog import QUIRKS, Quirks
from .config import ContentDist
from .toolcalls import CALL_QUIRKS, CallPlan

_WORDS = (
    "the of and to in is that for it as with be on this by we are so let me think about check first "
    "then which value number sum answer step case so if not but can should would need compute assume "
    "problem function equation result because therefore wait actually hmm right now each term both "
    "write code list array index loop return string error test input output model token data "
    "probability integer prime divisor factor triangle angle circle radius area volume matrix vector "
    "derivative integral limit series proof claim lemma hence consider suppose given known simple "
    "Okay Alternatively However Therefore First Second Finally Let Since Note Thus"
).split()
_PIECES: tuple[tuple[str, float], ...] = (
    *((" " + w, 8.0) for w in _WORDS),
    (",", 6.0), (".", 6.0), (".\n\n", 2.0), ("\n", 1.5), (":", 1.0), (" (", 0.5), (")", 0.5),
    (" 0", 0.6), (" 1", 0.6), (" 2", 0.6), (" 12", 0.4), (" 3.14", 0.2), (" 2026", 0.2), (" 1e-6", 0.1),
    (" $x^2 + y^2 = r^2$", 0.2), (" `f(x)`", 0.2), (" **", 0.2), ("\n- ", 0.6), ("\n```python\n", 0.05),
    ("因此", 0.4), ("我们需要", 0.3), ("计算", 0.3), ("答案是", 0.2), ("。", 0.3), ("，", 0.3),
    ("数学", 0.2), ("こんにちは", 0.1), ("한국어", 0.1), (" Привет", 0.1), (" café", 0.1), (" naïve", 0.1),
    (" 🙂", 0.2), (" 🚀", 0.1), (" ✅", 0.15), (" 🤔", 0.15), (" 👍🏽", 0.05), (" →", 0.2), (" ≈", 0.1), (" ∑", 0.05),
)
_TEXTS = [p for p, _ in _PIECES]
_CUM = list(accumulate(w for _, w in _PIECES))
TOKENS_PER_PIECE = 1.01  # measured on this vocabulary with the Kimi tokenizer; lengths are approximate
LITERAL_SPECIALS = ("<|im_end|>", "<think>", "</think>", "<|im_start|>")


def prompt_hash(messages: Sequence[dict]) -> str:
    """Stable hash of the conversation: the key for attempts and for determinism."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


def content_rng(seed: int, phash: str, attempt: int, request_seed: int | None) -> random.Random:
    key = f"{seed}:{request_seed}:{phash}:{attempt}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def _text(rng: random.Random, n_tokens: int, opener: str) -> str:
    k = max(1, round(n_tokens / TOKENS_PER_PIECE))
    return opener + "".join(rng.choices(_TEXTS, cum_weights=_CUM, k=k)).strip(" ")


def _literal_special(rng: random.Random, content: str) -> str:
    """A special token's text ("<|im_end|>", "<think>", …) somewhere in the content, as plain text."""
    at = rng.randrange(len(content) + 1)
    return content[:at] + rng.choice(LITERAL_SPECIALS) + content[at:]


def _literal_close(rng: random.Random, content: str) -> str:
    """The model writing about its own tags: a literal `</think>` in its answer, as text (never the control token)."""
    at = rng.randrange(len(content) + 1)
    return content[:at] + " the `</think>` tag" + content[at:]


# Quirks that change the text the model produced (before it is encoded); the others change only how the text
# is served (`bodies.SERVED`).
TEXT_QUIRKS: dict[str, Callable[[random.Random, str], str]] = {"literal_specials": _literal_special}
# What the model says before its calls, when it says anything (most often nothing).
CALL_PREAMBLES = ("Let me check that.", "I'll look that up.", "Let me call the tool.", "我来查一下。",
                  "Checking now 🔍", "I need more data first.")


@dataclass
class Generation:
    """One answer: the ids the model produced and the text as served (before any quirk)."""

    output_ids: list[int]
    reasoning: str
    content: str
    finish_reason: str  # "stop" | "length" | "tool_calls"
    reasoning_tokens: int  # ids before </think> (the whole output when cut inside the reasoning)
    quirk: str | None  # one of catalog.QUIRKS, or None
    retokenizes: bool  # output_ids(tok, reasoning, content, finish_reason, tool_calls=...) == output ids
    cut_mid_char: bool  # the cut split a multi-byte character (served as U+FFFD)
    # The whole calls among the ids, with the model's ids (`functions.NAME:IDX`) and arguments; a cut inside the
    # tool-call section keeps the calls before it (what vLLM's kimi_k2 parser serves).
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def closed(self) -> bool:
        """The reasoning was closed (`</think>` among the ids): not cut inside it."""
        return len(self.output_ids) > self.reasoning_tokens

    @property
    def before_special(self) -> bool:
        """The content is followed by a special token: `<|im_end|>` or the tool-call section's start."""
        return self.finish_reason != "length" or bool(self.tool_calls) or SECTION_BEGIN in self.output_ids

    def to_dict(self) -> dict:
        """Shallow (asdict deep-copies the id list, a third of a request's CPU); calls in the OpenAI shape."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["tool_calls"] = [c.to_api() for c in self.tool_calls]
        return d


def generate(tok: Tokenizer, rng: random.Random, dist: ContentDist, quirks: Quirks,
             max_tokens: int | None, *, thinking: bool = True, reasoning_scale: float = 1.0,
             reasoning_cap: int | None = None, calls: CallPlan | None = None) -> Generation:
    """Draw lengths, build text, encode, cut at `max_tokens` and decode: ground truth first.

    `reasoning_scale` (from reasoning.effort) scales the drawn reasoning length; `reasoning_cap`
    (reasoning.max_tokens) bounds it, as a thinking budget does. With `calls` the answer is reasoning, a short
    preamble or none, and the tool-call section (arguments drawn here, after the text); a plain answer draws
    exactly as before.
    """
    u = rng.random()
    quirk = None
    for name in QUIRKS:
        rate = getattr(quirks, name)
        if u < rate:
            quirk = name
            break
        u -= rate
    n_r = min(dist.max_total, max(1, round(reasoning_scale * rng.lognormvariate(
        math.log(max(dist.reasoning_median, 1)), dist.reasoning_sigma))))
    if reasoning_cap is not None:
        n_r = max(1, min(n_r, reasoning_cap))
    n_c = min(dist.max_total, max(1, round(rng.lognormvariate(math.log(max(dist.content_median, 1)),
                                                              dist.content_sigma))))
    reasoning = _text(rng, n_r, "Okay, ")
    content = _text(rng, n_c, "**Answer:** ")
    if calls is not None:
        content = rng.choice(CALL_PREAMBLES) if rng.random() < 0.35 else ""
    elif quirk in CALL_QUIRKS:
        quirk = None  # a quirk of how calls are served: nothing to serve differently in a plain answer
    if dist.literal_close and content and rng.random() < dist.literal_close:  # no draw at 0: seeded runs as before
        content = _literal_close(rng, content)
    if quirk in TEXT_QUIRKS:
        content = TEXT_QUIRKS[quirk](rng, content)
    r_ids = tok.encode_ordinary(reasoning) if thinking else []
    ids = [*r_ids, END_THINK] if thinking else []
    ids += tok.encode_ordinary(content)
    if calls is not None:  # the section and <|im_end|>, as the template's render_toolcalls writes them
        ids += output_ids(tok, None, None, "tool_calls", thinking=False, tool_calls=calls.draw(rng))
    else:
        ids.append(IM_END)
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
    answer = parse_output_ids(tok, ids, thinking=thinking)
    cut = answer.finish_reason == "length"
    mid_char = cut and "\ufffd" in (answer.content or answer.reasoning)[-2:]
    return Generation(ids, answer.reasoning, answer.content, answer.finish_reason,
                      min(len(r_ids), len(ids)), quirk,
                      output_ids(tok, answer.reasoning, answer.content, answer.finish_reason,
                                 thinking=thinking, tool_calls=answer.tool_calls) == ids, mid_char,
                      answer.tool_calls)
