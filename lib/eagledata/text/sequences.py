"""Token-exact sequences: prompt ids from the chat template, output ids from the API's text answer.

The K2.5 template drops the last turn's reasoning when a finished conversation is rendered, so we
never tokenize the finished conversation: the prompt is rendered with the generation prompt (ending
`<think>`) and the answer is encoded as plain text with `</think>` and `<|im_end|>` put in by
structure. A literal `<think>` typed inside an answer therefore stays text, as the model produced it.

The structural ids are the tokenizer's (`tok.structure`, text/structure.py), so the same recipe serves every family:
a family without a reasoning section (SmolLM2's ChatML) gets content + end of turn, and its content is taken as
served (no `<think>` splitting: that is K2.5's shape, not text's).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ..errors import InputError
from ..records import CUT_FINISHES, Answer, ToolCall
from .structure import Structure, ToolSection
from .tokenizer import Tokenizer

# What a tokenizer's `apply_chat_template` passes for its special tokens when the tokenizer names none (K2.5's template
# uses none of them); a HF family passes its own (`template_tokens`), as its tokenizer does.
_SPECIAL_TOKEN_KWARGS = dict(bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", unk_token="[UNK]")


# -- chat template ------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _renderer():
    """transformers' renderer, imported once. Without torch (the core install) transformers announces at import
    that models are unavailable; we only need its renderer, so that notice is held back."""
    quiet = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
    before = os.environ.get(quiet)
    os.environ[quiet] = "1"
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    finally:
        if before is None:
            del os.environ[quiet]
        else:
            os.environ[quiet] = before
    return render_jinja_template


def load_renderer() -> None:
    """Import the chat template's renderer now (transformers: ~1 s, 1.5 s on a loaded machine), e.g. on a thread while
    a run waits on the network, rather than inside its first prompt."""
    _renderer()


def render_chat(tok: Tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                thinking: bool = True, preserve_thinking: bool = False, tools: Sequence[dict] | None = None) -> str:
    """The chat template rendered by transformers' own renderer, as the serving stacks (vLLM, SGLang) do:
    the same sandbox, filters, globals (`raise_exception`, `strftime_now`) and reasoning-field aliases."""
    render_jinja_template = _renderer()
    if tok.chat_template is None:
        raise InputError("tokenizer has no chat template (chat_template.jinja)", tok.directory)
    kwargs: dict[str, Any] = dict(_SPECIAL_TOKEN_KWARGS, **tok.template_tokens, preserve_thinking=preserve_thinking)
    if not thinking:
        kwargs["thinking"] = False
    rendered, _ = render_jinja_template([list(messages)], tools=tools, chat_template=tok.chat_template,
                                        add_generation_prompt=add_generation_prompt, **kwargs)
    return rendered[0]


def prompt_ids(tok: Tokenizer, messages: Sequence[dict], *, thinking: bool = True,
               tools: Sequence[dict] | None = None) -> list[int]:
    """Ids the server feeds the model: the rendered prompt encoded with special tokens recognized."""
    return tok.encode(render_chat(tok, messages, thinking=thinking, tools=tools), allow_special=True)


def conversation_ids(tok: Tokenizer, messages: Sequence[dict], reasoning: str, content: str,
                     tool_calls: Sequence[ToolCall] = (), tools: list | None = None) -> list[int]:
    """The finished conversation rendered with `preserve_thinking`: a check that prompt ids are its prefix."""
    answer: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        answer["tool_calls"] = [c.to_api() for c in tool_calls]
    return tok.encode(render_chat(tok, [*messages, answer], add_generation_prompt=False, preserve_thinking=True,
                                  tools=tools), allow_special=True)


# -- answers ------------------------------------------------------------------------------------
def answer_of(tok: Tokenizer, reasoning: str | None, content: str | None, finish_reason: str | None,
              tool_calls: Sequence[ToolCall] = ()) -> Answer:
    """An answer as the family reads it: reasoning a provider inlined as `<think>…</think>` split out for a family
    that reasons; for one that does not, the text exactly as served."""
    if tok.structure.reasons:
        return Answer.from_api(reasoning, content, finish_reason or "", tuple(tool_calls))
    return Answer(reasoning or "", content or "", finish_reason or "", tuple(tool_calls))


def output_ids(tok: Tokenizer, reasoning: str | None, content: str | None, finish_reason: str | None,
               *, thinking: bool = True, tool_calls: Sequence[ToolCall] = ()) -> list[int]:
    """The recipe: encode(reasoning) + [</think>] + encode(content) [+ the tool-call section] + [<|im_end|>], the
    structural ids the tokenizer's (`tok.structure`: a family without reasoning has no `</think>`, and reasoning text
    for it is an error).

    No `<|im_end|>` after a cut (`finish_reason` "length", or "cut": the run closed the stream), and no
    `</think>` when the cut fell inside the reasoning (nothing after it). With thinking off the prompt already
    closed `<think></think>`.
    Reasoning a provider inlined as `<think>…</think>` in content is split out first. Tool calls (their ids as
    the model wrote them, `functions.NAME:IDX`) follow the content as the template's `render_toolcalls` writes
    them; a cut answer keeps the section's start and its whole calls, no section end.
    """
    a = answer_of(tok, reasoning, content, finish_reason)
    return _assemble(tok.structure, tok.encode_ordinary(a.reasoning) if a.reasoning else [],
                     tok.encode_ordinary(a.content) if a.content else [],
                     finish_reason, thinking, a.reasoning, _section(tok, tool_calls, finish_reason))


def _section(tok: Tokenizer, calls: Sequence[ToolCall], finish_reason: str | None) -> list[int]:
    """`<|tool_calls_section_begin|>` + per call `<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS
    <|tool_call_end|>` + `<|tool_calls_section_end|>` (not after a cut); [] without calls."""
    if not calls:
        return []
    t = _tool_section(tok)
    ids = [t.begin]
    for c in calls:
        ids += [t.call_begin, *tok.encode_ordinary(c.id), t.argument_begin, *tok.encode_ordinary(c.arguments),
                t.call_end]
    if finish_reason not in CUT_FINISHES:
        ids.append(t.end)
    return ids


def _tool_section(tok: Tokenizer) -> ToolSection:
    if tok.structure.tool_calls is None:
        raise InputError(f"tool calls in an answer, but the tokenizer at {tok.directory} has no tool-call section",
                         field="tool_calls")
    return tok.structure.tool_calls


def _assemble(structure: Structure, r_ids: list[int], c_ids: list[int], finish_reason: str | None, thinking: bool,
              reasoning: str, section: Sequence[int] = ()) -> list[int]:
    """Join encoded parts in place (`r_ids` is ours to extend): this runs once per output token."""
    cut = finish_reason in CUT_FINISHES
    if structure.end_of_reasoning is None:
        if reasoning:
            raise InputError("reasoning present but the model has no reasoning section", field="reasoning")
        ids = c_ids
    elif not thinking:
        if reasoning:
            raise InputError("reasoning present but thinking is off", field="reasoning")
        ids = c_ids
    elif cut and not c_ids and not section:
        return r_ids
    else:
        ids = r_ids
        ids.append(structure.end_of_reasoning)
        ids.extend(c_ids)
    ids.extend(section)
    if not cut:
        ids.append(structure.end_of_turn)
    return ids


def output_ids_batch(tok: Tokenizer, answers: Sequence[Answer], *, thinking: bool = True,
                     threads: int = 2) -> list[list[int]]:
    """`output_ids` for many answers, BPE spread over `threads` cores."""
    split = [answer_of(tok, a.reasoning, a.content, a.finish_reason, a.tool_calls) for a in answers]
    texts = [t for a in split for t in (a.reasoning, a.content)]
    encoded = tok.encode_ordinary_batch(texts, threads=threads)
    return [_assemble(tok.structure, encoded[2 * i], encoded[2 * i + 1], a.finish_reason, thinking, a.reasoning,
                      _section(tok, a.tool_calls, a.finish_reason))
            for i, a in enumerate(split)]


def _parse_section(tok: Tokenizer, ids: list[int]) -> tuple[ToolCall, ...]:
    """The whole calls of a tool-call section's ids (after `<|tool_calls_section_begin|>`); a call cut before its
    `<|tool_call_end|>` is not one."""
    t = _tool_section(tok)
    calls = []
    while t.call_begin in ids:
        ids = ids[ids.index(t.call_begin) + 1:]
        if t.argument_begin not in ids or t.call_end not in ids:
            break
        a, e = ids.index(t.argument_begin), ids.index(t.call_end)
        cid = tok.decode(ids[:a])
        calls.append(ToolCall(cid, cid.removeprefix("functions.").rpartition(":")[0], tok.decode(ids[a + 1:e])))
        ids = ids[e + 1:]
    return tuple(calls)


def parse_output_ids(tok: Tokenizer, ids: Sequence[int], *, thinking: bool = True) -> Answer:
    """The inverse of `output_ids`: split at the first end of reasoning (`</think>`), the tool-call section off the
    content, drop a final end of turn (`<|im_end|>`; an answer with calls finishes as `tool_calls`)."""
    s = tok.structure
    ids = list(ids)
    finish = "length"
    if ids and ids[-1] == s.end_of_turn:
        ids, finish = ids[:-1], "stop"
    calls: tuple[ToolCall, ...] = ()
    if s.tool_calls is not None and s.tool_calls.begin in ids:
        k = ids.index(s.tool_calls.begin)
        ids, calls = ids[:k], _parse_section(tok, ids[k + 1:])
        finish = "tool_calls" if finish == "stop" and calls else finish
    if not thinking or s.end_of_reasoning is None:
        return Answer("", tok.decode(ids), finish, calls)
    if s.end_of_reasoning in ids:
        k = ids.index(s.end_of_reasoning)
        return Answer(tok.decode(ids[:k]), tok.decode(ids[k + 1:]), finish, calls)
    return Answer(tok.decode(ids), "", finish, calls)


def first_difference(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def agreement(ours: Sequence[int], true: Sequence[int]) -> float:
    """Share of positions covered by the common prefix and suffix (1.0 when identical)."""
    if list(ours) == list(true):
        return 1.0
    n = max(len(ours), len(true))
    pre = first_difference(ours, true)
    suf = first_difference(list(reversed(ours[pre:])), list(reversed(true[pre:])))
    return (pre + suf) / n
