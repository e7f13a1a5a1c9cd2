"""Token-exact sequences: prompt ids from the chat template, output ids from the API's text answer.

The K2.5 template drops the last turn's reasoning when a finished conversation is rendered, so we
never tokenize the finished conversation: the prompt is rendered with the generation prompt (ending
`<think>`) and the answer is encoded as plain text with `</think>` and `<|im_end|>` put in by
structure. A literal `<think>` typed inside an answer therefore stays text, as the model produced it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InputError
from .tokenizer import END_THINK, IM_END, KimiTokenizer

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_INLINE_OPEN = re.compile(r"\s*<think>")


# -- chat template ------------------------------------------------------------------------------
def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    """Compile as transformers does: sandboxed, trim/lstrip blocks, loop controls, its tojson."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _alias_reasoning(message: dict) -> dict:
    """transformers fills `reasoning_content` from `reasoning`/`thinking`; so do we."""
    for key in ("reasoning_content", "thinking", "reasoning"):
        if message.get(key) is not None:
            return {"thinking": message[key], **message, "reasoning_content": message[key]}
    return message


def render_chat(tok: KimiTokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                thinking: bool = True, preserve_thinking: bool = False, tools: list | None = None) -> str:
    """The chat template rendered to text, with the keyword arguments transformers passes."""
    if tok.chat_template is None:
        raise InputError("tokenizer has no chat template (chat_template.jinja)", tok.directory)
    kwargs: dict[str, Any] = dict(messages=[_alias_reasoning(m) for m in messages], tools=tools, documents=None,
                                  add_generation_prompt=add_generation_prompt,
                                  preserve_thinking=preserve_thinking, bos_token="[BOS]", eos_token="[EOS]",
                                  pad_token="[PAD]", unk_token="[UNK]")
    if not thinking:
        kwargs["thinking"] = False
    return _compile(tok.chat_template).render(**kwargs)


def prompt_ids(tok: KimiTokenizer, messages: Sequence[dict], *, thinking: bool = True,
               tools: list | None = None) -> list[int]:
    """Ids the server feeds the model: the rendered prompt encoded with special tokens recognized."""
    return tok.encode(render_chat(tok, messages, thinking=thinking, tools=tools), allow_special=True)


def conversation_ids(tok: KimiTokenizer, messages: Sequence[dict], reasoning: str, content: str) -> list[int]:
    """The finished conversation rendered with `preserve_thinking`: a check that prompt ids are its prefix."""
    full = [*messages, {"role": "assistant", "content": content, "reasoning_content": reasoning}]
    return tok.encode(render_chat(tok, full, add_generation_prompt=False, preserve_thinking=True),
                      allow_special=True)


# -- answers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """The model's answer as text: what OpenRouter returns and what output ids decode to."""

    reasoning: str
    content: str
    finish_reason: str  # "stop" | "length" | anything else the server said

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def split_inline_reasoning(reasoning: str | None, content: str | None) -> tuple[str, str]:
    """Move `<think>…</think>` at the start of content into reasoning (some providers inline it).

    Only when no separate reasoning arrived: then a literal `<think>` later in content is text.
    An unclosed leading `<think>` means the answer was cut inside the reasoning.
    """
    reasoning, content = reasoning or "", content or ""
    if reasoning or not (m := _INLINE_OPEN.match(content)):
        return reasoning, content
    inner, sep, rest = content[m.end():].partition(THINK_CLOSE)
    return (inner, rest) if sep else (inner, "")


def output_ids(tok: KimiTokenizer, reasoning: str | None, content: str | None, finish_reason: str | None,
               *, thinking: bool = True) -> list[int]:
    """The recipe: encode(reasoning) + [</think>] + encode(content) + [<|im_end|>].

    No `<|im_end|>` after a cut (`finish_reason == "length"`), and no `</think>` when the cut fell
    inside the reasoning (nothing after it). With thinking off the prompt already closed `<think></think>`.
    """
    reasoning, content = split_inline_reasoning(reasoning, content)
    return _assemble(tok.encode_ordinary(reasoning) if reasoning else [],
                     tok.encode_ordinary(content) if content else [],
                     finish_reason, thinking, reasoning)


def _assemble(r_ids: list[int], c_ids: list[int], finish_reason: str | None, thinking: bool,
              reasoning: str) -> list[int]:
    """Join encoded parts in place (`r_ids` is ours to extend): this runs once per output token."""
    cut = finish_reason == "length"
    if not thinking:
        if reasoning:
            raise InputError("reasoning present but thinking is off", field="reasoning")
        ids = c_ids
    elif cut and not c_ids:
        return r_ids
    else:
        ids = r_ids
        ids.append(END_THINK)
        ids.extend(c_ids)
    if not cut:
        ids.append(IM_END)
    return ids


def output_ids_batch(tok: KimiTokenizer, answers: Sequence[Answer], *, thinking: bool = True,
                     threads: int = 2) -> list[list[int]]:
    """`output_ids` for many answers, BPE spread over `threads` cores."""
    split = [split_inline_reasoning(a.reasoning, a.content) for a in answers]
    texts = [t for pair in split for t in pair]
    encoded = tok.encode_ordinary_batch(texts, threads=threads)
    return [_assemble(encoded[2 * i], encoded[2 * i + 1], a.finish_reason, thinking, split[i][0])
            for i, a in enumerate(answers)]


def parse_output_ids(tok: KimiTokenizer, ids: Sequence[int], *, thinking: bool = True) -> Answer:
    """The inverse of `output_ids`: split at the first `</think>`, drop a final `<|im_end|>`."""
    ids = list(ids)
    finish = "length"
    if ids and ids[-1] == IM_END:
        ids, finish = ids[:-1], "stop"
    if not thinking:
        return Answer("", tok.decode(ids), finish)
    if END_THINK in ids:
        k = ids.index(END_THINK)
        return Answer(tok.decode(ids[:k]), tok.decode(ids[k + 1:]), finish)
    return Answer(tok.decode(ids), "", finish)


def loss_mask(n_prompt: int, n_output: int) -> list[int]:
    """0 over the prompt, 1 over what the model produced (its `</think>` and `<|im_end|>` included)."""
    return [0] * n_prompt + [1] * n_output
