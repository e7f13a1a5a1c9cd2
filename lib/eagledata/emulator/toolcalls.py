"""What the emulated model calls: a pure plan from the request, and the calls' arguments as the model writes them.

The plan (`task_rounds`) depends on the task text and the declared tool names only, never on the emulator seed:
it is the model's behaviour for a task, so a dataset can be built whose tool rounds match it (or deliberately do
not) and a regeneration loop can be checked against it. Arguments are sampled (the request's rng), as any text is.

A model asked to regenerate an agent's conversation mostly calls what that agent called: the task and the tools say
what is needed. So where the emulator knows the dataset (`DatasetCalls`, the config's `tool_datasets`), each round
follows the dataset's answer at `tool_follow_rate` (the same names, as many times each; or a plain answer where the
dataset answered plainly), else the model's own plan. Which rounds follow is drawn from the seed and the conversation
so far: the same seed, the same rounds.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..records import ToolCall, native_call_id

# P(R = 0, 1, 2, 3) tool rounds for a task, and P(1, 2, 3) calls in one round when parallel calls are allowed.
ROUNDS_CUM = (0.30, 0.65, 0.85, 1.0)
PARALLEL_CUM = (0.70, 0.90, 1.0)
# Argument strings: short words, some non-ASCII, so `ensure_ascii=False` (the model's way) matters.
ARG_WORDS = ("Paris", "Berlin", "Zürich", "東京", "weather", "report", "latest", "python", "numpy", "café",
             "budget", "2026-03-01", "celsius", "summary", "São Paulo", "hello world")


def _unit(*key: object) -> float:
    """A uniform draw in [0, 1) fixed by the key (sha256): the same on every machine and Python version."""
    h = hashlib.sha256("\x1f".join(map(str, key)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _pick(cum: Sequence[float], u: float) -> int:
    return next((i for i, c in enumerate(cum) if u < c), len(cum) - 1)


def task_rounds(task: str, tool_names: Sequence[str], parallel: bool) -> list[tuple[str, ...]]:
    """The tool rounds the model runs for `task` before its plain answer: one tuple of tool names per round.

    Deterministic from the task text and the tool names (in order) only. Each round is one call, or with
    `parallel` 1–3 calls; a round's first call is the same either way, so switching `parallel` off keeps
    the number of rounds and the tool each round calls first."""
    names = list(tool_names)
    if not names:
        return []
    key = (task, *names)
    rounds = []
    for r in range(_pick(ROUNDS_CUM, _unit("rounds", *key))):
        n = 1 + _pick(PARALLEL_CUM, _unit("calls", r, *key)) if parallel else 1
        rounds.append(tuple(names[int(_unit("name", r, j, *key) * len(names))] for j in range(n)))
    return rounds


def _text(content: Any) -> str:
    """A message's content as text (a string, or OpenAI's content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tool_name(tool: dict) -> str:
    return tool["function"]["name"]


def planned_calls(messages: Sequence[dict], tools: Sequence[dict] | None, parallel: bool = True,
                  tool_choice: Any = None, follow: Sequence[str] | None = None) -> tuple[str, ...]:
    """The names the model calls in answer to this request, `()` for a plain answer.

    The task is the last user message; the rounds done are the assistant messages with `tool_calls` after it;
    the next round is called while rounds are left. `tool_choice`: "none" → plain; `{type: function,
    function: {name}}` → the plan is made over that tool alone and it is called even when the plan is done;
    "required" → a call even when the plan is done (one tool, by hash). "auto"/None → the plan as it is.
    `follow`: the dataset's answer this round follows instead of the plan (its names; `()` a plain answer), taken
    under "auto"/None when every name is declared (without `parallel`, its first call only)."""
    if not tools or tool_choice == "none":
        return ()
    names = [_tool_name(t) for t in tools]
    if follow is not None and tool_choice in (None, "auto") and set(follow) <= set(names):
        return tuple(follow) if parallel else tuple(follow)[:1]
    if isinstance(tool_choice, dict):
        names = [tool_choice["function"]["name"]]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    task = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    done = sum(1 for m in messages[last_user + 1:] if m.get("role") == "assistant" and m.get("tool_calls"))
    rounds = task_rounds(task, names, parallel)
    if done < len(rounds):
        return rounds[done]
    if tool_choice == "required" or isinstance(tool_choice, dict):
        return (names[int(_unit("required", done, task, *names) * len(names))],)
    return ()


def calls_so_far(messages: Sequence[dict]) -> int:
    """The conversation's tool calls so far (the assistant messages' `tool_calls`): where the model's IDX goes on.
    The emulated model's own count, kept apart from the client's (`records.calls_before`) on purpose: the tests
    compare the ids the client rebuilds with the ones the model wrote, so they must not share the code."""
    return sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")


# How an agent's calls slip (`CallStyle.slips`): a name no tool declares, arguments that are not JSON, a required
# argument left out, an argument of the wrong type. Each is an error result in an executed environment.
SLIPS = ("unknown_name", "bad_json", "missing_required", "wrong_type")
CONTEXT_WORD = re.compile(r"[\w./:@-]{2,64}")


@dataclass(frozen=True)
class CallStyle:
    """How the model writes its calls beyond the plan: `context_share` of its string and integer arguments are
    taken from the conversation since the task (the user's words, the earlier tool results: a file name an `ls`
    listed, an id a search returned), as an agent does; `slips` the rate per call of each of `SLIPS`. All 0 (the
    default): no draw is made, so seeded runs answer as before."""

    context_share: float = 0.0
    slips: tuple[tuple[str, float], ...] = ()

    def slip(self, rng: random.Random) -> str | None:
        """Which slip this call makes (one at most), drawn only when some rate is set."""
        if not any(rate for _, rate in self.slips):
            return None
        u = rng.random()
        for kind, rate in self.slips:
            if u < rate:
                return kind
            u -= rate
        return None


def context_words(messages: Sequence[dict]) -> tuple[str, ...]:
    """The words an agent reuses as arguments: from the task (the last user message) and every tool result after
    it, in order, once each."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    seen: dict[str, None] = {}
    for m in messages[max(last_user, 0):]:
        if m.get("role") in ("user", "tool"):
            for w in CONTEXT_WORD.findall(_text(m.get("content"))):
                seen.setdefault(w.strip(".:-"), None)
    return tuple(w for w in seen if w)


def _value(rng: random.Random, schema: Any, context: Sequence[str] = (), share: float = 0.0) -> Any:
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        numbers = [int(w) for w in context if w.isdigit() and len(w) < 10] if share else []
        if numbers and rng.random() < share:
            return rng.choice(numbers)
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_value(rng, schema.get("items"), context, share) for _ in range(rng.randint(1, 3))]
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return {k: _value(rng, v, context, share) for k, v in schema["properties"].items()}
    if share and context and rng.random() < share:
        return rng.choice(context)
    return rng.choice(ARG_WORDS)


def _wrong_type(value: Any) -> Any:
    """The value an agent writes in the wrong type: a number as text, text as a number, a list for a scalar."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return len(value)
    return [value]


def arguments(rng: random.Random, tool: dict, context: Sequence[str] = (), style: CallStyle = CallStyle(),
              slip: str | None = None) -> str:
    """A call's arguments as the model writes them: a JSON object over the tool's `parameters.properties`,
    `json.dumps(..., ensure_ascii=False)` (", " and ": " separators, non-ASCII kept); string and integer values
    taken from `context` at `style.context_share`; `slip` written into them ("missing_required", "wrong_type",
    "bad_json": the object cut before its closing brace)."""
    params = tool["function"].get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    obj = {k: _value(rng, v, context, style.context_share) for k, v in props.items()} if isinstance(props, dict) \
        else {}
    if slip == "missing_required":
        required = [k for k in (params.get("required") or []) if k in obj] if isinstance(params, dict) else []
        if required:
            del obj[rng.choice(required)]
    elif slip == "wrong_type" and obj:
        key = rng.choice(sorted(obj))
        obj[key] = _wrong_type(obj[key])
    text = json.dumps(obj, ensure_ascii=False)
    return text[:-1].rstrip() if slip == "bad_json" and len(text) > 2 else text


@dataclass(frozen=True)
class CallPlan:
    """What one request's answer calls: the names (`planned_calls`), the conversation's calls so far (the first
    new IDX) and the declared tools (for the arguments)."""

    names: tuple[str, ...]
    first_index: int
    tools: tuple[dict, ...]
    context: tuple[str, ...] = ()  # `context_words` of the request: what arguments may reuse
    style: CallStyle = CallStyle()

    def draw(self, rng: random.Random) -> tuple[ToolCall, ...]:
        """The calls with their true ids (`functions.NAME:IDX`) and arguments drawn from `rng`, each with its
        slip (`style`): an unknown name is a declared one with a suffix an agent invents (`NAME_v2`)."""
        by_name = {_tool_name(t): t for t in self.tools}
        calls = []
        for k, name in enumerate(self.names):
            slip = self.style.slip(rng)
            args = arguments(rng, by_name[name], self.context, self.style, slip)
            called = f"{name}_v2" if slip == "unknown_name" else name
            calls.append(ToolCall(native_call_id(called, self.first_index + k), called, args))
        return tuple(calls)


def plan(messages: Sequence[dict], tools: Sequence[dict] | None, parallel: bool = True,
         tool_choice: Any = None, follow: Sequence[str] | None = None,
         style: CallStyle = CallStyle()) -> CallPlan | None:
    """The request's `CallPlan`, None for a plain answer (`follow`: as `planned_calls`; `style`: `CallStyle`)."""
    names = planned_calls(messages, tools, parallel, tool_choice, follow)
    if not names:
        return None
    context = context_words(messages) if style.context_share else ()
    return CallPlan(names, calls_so_far(messages), tuple(tools or ()), context, style)


def _asked_key(messages: Sequence[dict]) -> str:
    """What identifies a conversation so far in both the dataset and a request: its system, user and tool messages'
    roles and texts, in order. The assistant turns differ (the model's own answers, other call ids), these do not."""
    asked = [(m.get("role"), _text(m.get("content"))) for m in messages if m.get("role") != "assistant"]
    return hashlib.sha256(json.dumps(asked, ensure_ascii=False).encode()).hexdigest()[:32]


class DatasetCalls:
    """The calls of the datasets' own answers, by the conversation before each: what the model follows.

    For every assistant answer of a prompt file (after its first user turn, answering a user or tool turn), the key
    of the messages before it (`_asked_key`) → the names it called (`()` for a plain answer). A request whose
    messages have such a key is a regeneration of that point of that conversation."""

    def __init__(self, rounds: dict[str, tuple[str, ...]] | None = None):
        self.rounds = rounds or {}

    @classmethod
    def load(cls, paths: Sequence[str]) -> DatasetCalls:
        """Read prompt files in any accepted shape (the generation stage's reader: ShareGPT tool turns become the
        same OpenAI turns the client sends); only conversations with tool calls are kept."""
        if not paths:
            return cls()
        from ..prompts import load_prompts  # the reader only when there are files: a lighter start

        rounds: dict[str, tuple[str, ...]] = {}
        for path in paths:
            for prompt in load_prompts(path):
                messages = prompt.messages
                if not any(m.get("tool_calls") for m in messages):
                    continue
                seen_user = False
                for i, m in enumerate(messages):
                    seen_user = seen_user or m.get("role") == "user"
                    if (m.get("role") == "assistant" and seen_user and i
                            and messages[i - 1].get("role") in ("user", "tool")):
                        names = tuple(c["function"]["name"] for c in m.get("tool_calls") or ())
                        rounds.setdefault(_asked_key(messages[:i]), names)
        return cls(rounds)

    def __len__(self) -> int:
        return len(self.rounds)

    def follows(self, messages: Sequence[dict], rate: float, seed: int) -> tuple[bool, tuple[str, ...]] | None:
        """None when no dataset has this point of a conversation (another conversation, or its last ask: the dataset
        has no answer there); else whether this round follows the dataset's answer, and that answer's names. The
        draw at `rate` is fixed by the seed and the conversation so far: a retry of the same request follows or not
        alike."""
        key = _asked_key(messages)
        names = self.rounds.get(key)
        return None if names is None else (_unit("follow", seed, key) < rate, names)


_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def call_id(rng: random.Random) -> str:
    """An OpenAI-style id (`call_` + 24 alphanumerics), what some providers serve instead of the model's id."""
    return "call_" + "".join(rng.choices(_ALNUM, k=24))


def reserialized(arguments_text: str) -> str:
    """Arguments as a provider that parses and re-dumps them serves them (compact, ASCII-escaped); arguments that
    do not parse (an agent's slip) pass through as written."""
    try:
        return json.dumps(json.loads(arguments_text), separators=(",", ":"))
    except json.JSONDecodeError:
        return arguments_text


# Quirks in how a provider serves the calls' arguments (the third kind beside `bodies.SERVED` and
# `content.TEXT_QUIRKS`); drawn only for answers that call.
CALL_QUIRKS: dict[str, Callable[[str], str]] = {"arguments_reserialized": reserialized}
