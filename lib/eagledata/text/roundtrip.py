"""Tokenizer round-trip validation: does every record's ids say exactly what its text says?

Checks per record, each failure a named mismatch class so a report can count and show them:
text round-trip (ids → text equals the answer), prompt ids equal the template render, prompt ids
are a prefix of the full conversation rendered with `preserve_thinking`, special tokens only where
the structure puts them, and, where the true ids are known, agreement with them (a cut sample, `finish_reason: cut`,
with the prefix of its length: the run closed the stream there, so the model had produced no more of it).
"""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import iter_jsonl
from ..records import CUT, CUT_FINISHES, THINK_CLOSE, Record, ToolCall, calls_before, native_call_id
from .sequences import (
    agreement,
    answer_of,
    conversation_ids,
    first_difference,
    output_ids,
    parse_output_ids,
    prompt_ids,
)
from .tokenizer import Tokenizer

# Classes that fail the verdict; the others explain a disagreement with true ids or flag a hazard.
FATAL = {"text round-trip", "prompt ids differ from template", "prompt not a prefix of full render",
         "special token outside structure", "output ids differ from recipe", "unrepaired bare close",
         "text differs from true ids", "tool-call id not the model's form"}
# What the fatal classes that are not plain reconstruction defects mean.
DEFECTS = {
    "unrepaired bare close": "no reasoning, `</think>` in content: a provider without a reasoning parser served the "
                             "reasoning as content; the ids put the model's reasoning after a `</think>` it never "
                             "produced there (generate repairs this shape: `answers.repair_reasoning`)",
    "text differs from true ids": "the served text is not what the model generated (the true ids decode to other "
                                  "bytes): no recipe can rebuild its ids",
    "tool-call id not the model's form": "a call's id is not a `functions.NAME:IDX` as the model writes it: a "
                                         "provider's `call_…` id was kept instead of the model's",
}
EXPLAINED = {
    "non-canonical tokenization": "same bytes, other split: the model chose a non-BPE path; text-based ids cannot know",
    "partial character at cut": "max_tokens fell inside a multi-byte character; the API text carries U+FFFD",
    "answer merges with the prompt's end": "the generation prompt ends in text (ChatML's `assistant\\n`) and the "
                                           "answer starts with text BPE joins to it (a newline): the finished "
                                           "conversation tokenized whole splits the same bytes otherwise at the "
                                           "boundary; the recorded ids are the ones the model saw and produced",
    "literal special string in text": "a special-token string typed as text; rendering the finished conversation "
                                      "would turn it into a control token, the recipe keeps it text",
    "literal special string in prompt": "user text holds a special-token string; the server tokenizes it as a "
                                        "control token (recorded ids follow the server)",
    "tool-call index off the count": "the model numbered a call otherwise than the conversation's running count of "
                                     "calls: exact when served so (vLLM's kimi_k2 parser keeps the model's id), but "
                                     "the id rebuilt for a provider serving `call_…` ids would differ",
}


@dataclass
class Case:
    """A record-like item to validate; `true_output_ids` when the model's own ids are known."""

    id: str
    messages: list[dict]
    reasoning: str
    content: str
    finish_reason: str
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    true_output_ids: list[int] | None = None
    note: str = ""
    tools: list[dict] | None = None  # what the request declared (the prompt renders them)
    tool_calls: tuple[ToolCall, ...] = ()  # the answer's calls, ids as the model wrote them

    @classmethod
    def from_record(cls, r: Record, truth: dict[str, list[int]] | None = None) -> Case:
        """A record as a case. Ids a local server returned (`meta.ids_source` "server") are the model's own: with no
        other truth they are the true ids the recipe is held against (a non-canonical split is then explained, text
        that says other bytes fails), not stored ids the recipe must equal."""
        true = None
        if truth:
            true = truth.get(r.id, truth.get(r.generation_id)) if r.generation_id else truth.get(r.id)
        stored = r.output_ids or None
        if true is None and stored is not None and r.meta.get("ids_source") == "server":
            true, stored = stored, None
        return cls(r.id, r.messages, r.reasoning, r.content, r.finish_reason,
                   r.prompt_ids or None, stored, true, tools=r.tools, tool_calls=r.answer.tool_calls)


@dataclass
class Result:
    id: str
    classes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    reasoning_chars: int = 0
    content_chars: int = 0
    agreement: float | None = None

    def flag(self, cls: str, detail: str) -> None:
        self.classes.append(cls)
        self.details.append(detail)


def _show(s: str, limit: int = 60) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "…")


def check_case(tok: Tokenizer, case: Case) -> Result:
    res = Result(case.id)
    s = tok.structure
    answer = answer_of(tok, case.reasoning, case.content, case.finish_reason, case.tool_calls)
    reasoning, content, calls = answer.reasoning, answer.content, answer.tool_calls
    res.reasoning_chars, res.content_chars = len(reasoning), len(content)

    expected_prompt = prompt_ids(tok, case.messages, tools=case.tools)
    p_ids = case.prompt_ids if case.prompt_ids is not None else expected_prompt
    if p_ids != expected_prompt:
        k = first_difference(p_ids, expected_prompt)
        res.flag("prompt ids differ from template", f"first difference at token {k} of {len(expected_prompt)}")
    o_ids = case.output_ids if case.output_ids is not None else output_ids(tok, reasoning, content, case.finish_reason,
                                                                            tool_calls=calls)
    if case.output_ids is not None:
        recipe = output_ids(tok, reasoning, content, case.finish_reason, tool_calls=calls)
        if recipe != o_ids and case.true_output_ids is None:
            res.flag("output ids differ from recipe", f"first difference at token {first_difference(o_ids, recipe)}")
    res.prompt_tokens, res.output_tokens = len(p_ids), len(o_ids)

    back = parse_output_ids(tok, o_ids)
    if (back.reasoning, back.content) != (reasoning, content):
        which = "reasoning" if back.reasoning != reasoning else "content"
        want, got = (reasoning, back.reasoning) if which == "reasoning" else (content, back.content)
        k = first_difference(want, got)
        res.flag("text round-trip", f"{which} differs at char {k}: {_show(want[k:k+20])} vs {_show(got[k:k+20])}")
    elif back.tool_calls != calls:
        res.flag("text round-trip", f"the ids' tool calls {[c.id for c in back.tool_calls]} are not the answer's "
                                    f"{[c.id for c in calls]} (or their arguments differ)")
    base = calls_before(case.messages)
    foreign = [c.id for c in calls if not c.native]
    off = [c.id for i, c in enumerate(calls) if c.id != native_call_id(c.name, base + i)]
    if foreign:
        res.flag("tool-call id not the model's form", f"{foreign[:3]}, not functions.NAME:IDX")
    elif off:
        res.flag("tool-call index off the count", f"{off[:3]}; the conversation's calls so far: {base}")

    special_ids = tok.special_ids
    specials = [i for i, t in enumerate(o_ids) if t in special_ids]
    allowed = set()
    if s.end_of_reasoning is not None and s.end_of_reasoning in o_ids:
        allowed.add(o_ids.index(s.end_of_reasoning))
    if calls and s.tool_calls is not None and s.tool_calls.begin in o_ids:  # the section's own tokens, from its start
        start, section = o_ids.index(s.tool_calls.begin), s.tool_calls.ids
        allowed.update(i for i in range(start, len(o_ids)) if o_ids[i] in section)
    if o_ids and o_ids[-1] == s.end_of_turn:
        allowed.add(len(o_ids) - 1)
    stray = [i for i in specials if i not in allowed]
    if stray:
        res.flag("special token outside structure",
                 f"at {stray[:5]}: {tok.token_strings([o_ids[i] for i in stray[:5]])}")

    if s.reasons and not reasoning and THINK_CLOSE in content:
        res.flag("unrepaired bare close", f"no reasoning, `</think>` at char {content.index(THINK_CLOSE)} of content")
    literal = tok.special_strings_re.search(reasoning + "\0" + content)
    if literal:
        res.flag("literal special string in text", f"{literal.group()!r} kept as text")
    elif case.finish_reason not in CUT_FINISHES:
        full = conversation_ids(tok, case.messages, reasoning, content, calls, case.tools)
        # after the output ids a template may close the turn with whitespace (ChatML's newline after `<|im_end|>`)
        tail = full[len(p_ids) + len(o_ids):]
        if full[:len(p_ids)] != p_ids and _merged_at_boundary(tok, full, p_ids, o_ids):
            res.flag("answer merges with the prompt's end",
                     f"first difference at token {first_difference(full, p_ids)} of a {len(p_ids)}-token prompt")
        elif full[:len(p_ids)] != p_ids:
            res.flag("prompt not a prefix of full render", f"first difference at token {first_difference(full, p_ids)}")
        elif full[len(p_ids):len(p_ids) + len(o_ids)] != o_ids or tok.decode(tail).strip():
            res.flag("output ids differ from recipe", "full render's tail is not the output ids")
    if any(tok.special_strings_re.search(m["content"]) for m in case.messages if isinstance(m.get("content"), str)):
        res.flag("literal special string in prompt", "user text holds a special-token string")

    if case.true_output_ids is not None:
        true = list(case.true_output_ids)
        if case.finish_reason == CUT:  # the run closed the stream: the sample is the prefix the model had produced
            true = true[:len(o_ids)]
        res.agreement = agreement(o_ids, true)
        if res.agreement < 1.0:
            true_bytes = tok.decode_bytes(true)
            if true_bytes == tok.decode_bytes(o_ids):
                cls = "non-canonical tokenization"
            else:
                try:
                    true_bytes.decode("utf-8")
                    cls = "text differs from true ids"
                except UnicodeDecodeError:
                    cls = "partial character at cut"
            k = first_difference(o_ids, true)
            res.flag(cls, f"agreement {res.agreement:.4f}; first difference at token {k}: "
                          f"{tok.token_strings(o_ids[k:k+3])} vs {tok.token_strings(true[k:k+3])}")
    return res


def _merged_at_boundary(tok: Tokenizer, full: list[int], p_ids: list[int], o_ids: list[int]) -> bool:
    """The whole render says the same bytes as prompt + output (+ the template's closing whitespace), and differs
    from the prompt only in its last text token: a BPE merge across the boundary, not a wrong prompt or answer."""
    k = first_difference(full, p_ids)
    if k < len(p_ids) - 1 or p_ids[-1] in tok.special_ids:
        return False
    whole, parts = tok.decode_bytes(full), tok.decode_bytes(p_ids + o_ids)
    return whole.startswith(parts) and not whole[len(parts):].strip()


@dataclass
class Report:
    results: list[Result]

    @property
    def fatal(self) -> list[Result]:
        return [r for r in self.results if FATAL.intersection(r.classes)]

    @property
    def passed(self) -> bool:
        return bool(self.results) and not self.fatal

    def per_record(self):
        import pandas as pd

        return pd.DataFrame([{"id": r.id, "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                              "reasoning_chars": r.reasoning_chars, "content_chars": r.content_chars,
                              "agreement": r.agreement, "classes": ", ".join(r.classes)} for r in self.results])

    def mismatches(self):
        """One row per mismatch class: count, whether it fails the verdict, meaning, examples."""
        import pandas as pd

        rows: dict[str, dict] = {}
        for r in self.results:
            for cls, detail in zip(r.classes, r.details):
                row = rows.setdefault(cls, {"class": cls, "records": 0, "fatal": cls in FATAL,
                                            "meaning": EXPLAINED.get(cls) or DEFECTS.get(
                                                cls, "a defect in the id reconstruction"),
                                            "examples": []})
                row["records"] += 1
                if len(row["examples"]) < 3:
                    row["examples"].append(f"{r.id}: {detail}")
        df = pd.DataFrame(list(rows.values()), columns=["class", "records", "fatal", "meaning", "examples"])
        return df.sort_values(["fatal", "records"], ascending=False, ignore_index=True)

    def token_agreement(self) -> float | None:
        """Token-weighted agreement over records whose true ids are known."""
        known = [(r.agreement, r.output_tokens) for r in self.results if r.agreement is not None]
        if not known:
            return None
        return sum(a * n for a, n in known) / max(1, sum(n for _, n in known))

    def figures(self) -> dict:
        """The report's key figures as plain data (what tokenizer.ipynb publishes)."""
        classes: dict[str, int] = {}
        for r in self.results:
            for cls in r.classes:
                classes[cls] = classes.get(cls, 0) + 1
        return {"records": len(self.results), "passed": self.passed, "fatal_records": len(self.fatal),
                "classes": classes, "token_agreement": self.token_agreement(), "verdict": self.verdict()}

    def verdict(self) -> str:
        n, bad = len(self.results), len(self.fatal)
        agree = self.token_agreement()
        tail = f"; token agreement with true ids {agree:.4%}" if agree is not None else ""
        if not n:
            return "FAIL: nothing to validate"
        if bad:
            return f"FAIL: {bad} of {n} records have reconstruction defects{tail}"
        return f"PASS: {n} records round-trip exactly (text, prompt prefix, structural specials){tail}"


def validate(tok: Tokenizer, cases: Iterable[Case]) -> Report:
    return Report([check_case(tok, c) for c in cases])


def load_truth(path: str | Path) -> dict[str, list[int]]:
    """True output ids by record id or generation id: JSONL lines with `output_ids` and an id."""
    truth: dict[str, list[int]] = {}
    for lineno, obj in iter_jsonl(path):
        key = obj.get("generation_id") or obj.get("id") if isinstance(obj, dict) else None
        ids = obj.get("output_ids") if isinstance(obj, dict) else None
        if not key or not isinstance(ids, list):
            raise InputError("needs 'id' or 'generation_id' and 'output_ids'", path, lineno)
        truth[str(key)] = ids
    return truth


# -- the built-in sample set --------------------------------------------------------------------
def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# Cases about the reasoning section itself: nothing to check for a family without one.
REASONING_CASES = {"cut-inside-reasoning", "empty-reasoning"}


def sample_cases(tok: Tokenizer) -> list[Case]:
    """The hard cases a real run meets; some carry true ids built the way a model would emit them. For a family
    without a reasoning section the same cases lose their reasoning (an inline `<think>…</think>` stays text in the
    content), and without a tool-call section the tool cases are left out."""
    reasons = tok.structure.reasons
    cases = [
        Case("newlines-around-think", _user("Why is the sky blue?"), "\nRayleigh scattering.\n\n",
             "\n\nBecause shorter wavelengths scatter more.\n", "stop"),
        Case("literal-specials-in-content", _user("Show me the chat markup."), "They want the raw tags.",
             "Kimi wraps reasoning in <think>...</think> and ends turns with <|im_end|>.", "stop"),
        Case("cjk", _user("用中文解释量子纠缠。"), "用户想要中文解释。我先想一想……",
             "量子纠缠是两个粒子状态相互关联的现象。日本語も：量子もつれ。", "stop"),
        Case("emoji", _user("Reply with emoji 🎉"), "Family emoji uses ZWJ: 👨‍👩‍👧‍👦", "Sure! 🎉👍🏽🇯🇵 ✨", "stop"),
        Case("nfc-vs-nfd", _user("Spell café both ways."), "NFC é vs NFD e+◌́",
             "NFC: " + unicodedata.normalize("NFC", "café") + " / NFD: " + unicodedata.normalize("NFD", "café"),
             "stop"),
        Case("30000-spaces", _user("Print many spaces."), "A long run of spaces.", "start" + " " * 30000 + "end",
             "stop"),
        Case("empty-reasoning", _user("Say hi."), "", "Hi!", "stop"),
        Case("tool-markup-as-text", _user("How do tool calls look?"), "Describe the format literally.",
             'A call looks like <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
             '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', "stop"),
        Case("multi-turn-history", [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And times 3?"},
        ], "Previous answer 4, times 3 is 12.", "12.", "stop"),
        Case("cut-inside-reasoning", _user("Prove Fermat's last theorem."), "Let us begin with elliptic curves and",
             "", "length"),
        Case("cut-inside-content", _user("Count to ten."), "Simple.", "1, 2, 3, 4", "length"),
        Case("inline-think-in-content", _user("What is 3*7?"), "", "<think>3*7=21.</think>21", "stop"),
        Case("literal-special-in-prompt", _user("What does <|im_end|> mean?"), "It is a control token.",
             "It ends a turn.", "stop"),
    ]
    if not reasons:
        cases = [Case(c.id, c.messages, "", c.content, c.finish_reason, note=c.note) for c in cases
                 if c.id not in REASONING_CASES]
    if tok.structure.tool_calls is not None:
        cases += tool_cases()
    why = "Greeting." if reasons else ""
    # A model may emit a non-canonical split of the same bytes (here "Hello" as "Hel" + "lo").
    canon = output_ids(tok, why, "Hello world", "stop")
    hel, lo = tok.encode_ordinary("Hel"), tok.encode_ordinary("lo")
    hello = tok.encode_ordinary("Hello")
    k = canon.index(hello[0])
    true_split = canon[:k] + hel + lo + canon[k + len(hello):]
    cases.append(Case("non-canonical-split", _user("Greet me."), why, "Hello world", "stop",
                      true_output_ids=true_split, note="true ids split 'Hello' differently"))
    # max_tokens inside a multi-byte character: the true ids end mid-character, the text shows U+FFFD.
    full = output_ids(tok, "Pick a rare character." if reasons else "", "Here: 𓀀", "length")
    cut = full[:-1]
    answer = parse_output_ids(tok, cut)
    cases.append(Case("multibyte-cut-at-max-tokens", _user("Show a hieroglyph."), answer.reasoning, answer.content,
                      "length", true_output_ids=cut, note="the last character lost its final bytes"))
    return cases


WEATHER_TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} tool", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}} for name in ("get_weather", "search_web")]


def tool_cases() -> list[Case]:
    """Tool-call answers as K2.5 writes them, checked against its template: a first call, parallel calls after
    content, a call inside the loop (the loop's earlier reasoning kept), and the plain answer that ends the loop."""
    def call(idx: int, name: str, args: str) -> ToolCall:
        return ToolCall(native_call_id(name, idx), name, args)

    ask = [{"role": "system", "content": "You are a weather agent."}, *_user("Weather in Paris, then news?")]
    first = call(0, "get_weather", '{"city": "Paris"}')
    loop = [*ask, {"role": "assistant", "content": "", "reasoning": "Call the weather tool first.",
                   "tool_calls": [first.to_api()]},
            {"role": "tool", "tool_call_id": first.id, "content": '{"temp_c": 21, "sky": "clear"}'}]
    news = call(1, "search_web", '{"city": "Paris", "q": "news 🗞️"}')
    done = [*loop, {"role": "assistant", "content": "", "reasoning": "Now the news.", "tool_calls": [news.to_api()]},
            {"role": "tool", "tool_call_id": news.id, "content": "Nothing major."}]
    kw: dict[str, Any] = dict(tools=WEATHER_TOOLS)
    return [
        Case("tool-call-first", ask, "The user wants weather; call the tool.", "", "tool_calls", tool_calls=(first,),
             **kw),
        Case("tool-calls-parallel-after-content", _user("Paris and Lyon weather?"), "Two cities: two calls.",
             "Checking both.", "tool_calls",
             tool_calls=(call(0, "get_weather", '{"city": "Paris"}'), call(1, "get_weather", '{"city":"Lyon"}')), **kw),
        Case("tool-call-inside-the-loop", loop, "Weather done; search the news.", "", "tool_calls", tool_calls=(news,),
             **kw),
        Case("answer-after-the-tool-loop", done, "Both results are in.", "Paris: 21 °C and clear; no major news.",
             "stop", **kw),
    ]


def plot_token_lengths(report: Report):
    """Histograms of prompt and output lengths (tokens) over the validated records."""
    import matplotlib.pyplot as plt

    df = report.per_record()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, col in zip(axes, ["prompt_tokens", "output_tokens"]):
        ax.hist(df[col], bins=min(40, max(5, len(df) // 2)),
                color="tab:blue" if col == "prompt_tokens" else "tab:orange")
        ax.set_xlabel(col.replace("_", " "))
        ax.set_ylabel("records")
    fig.tight_layout()
    return fig
