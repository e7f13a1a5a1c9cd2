"""Conversations as chains of requests (pure): what the pool schedules is a `Turn`, one request of one conversation.

A prompt's conversation is cut into *asks*: the messages up to each of the dataset's assistant answers (system and
user turns, or the tool results that answer the dataset's calls), and the messages after the last one. With `turns:
all` every ask is answered by the model in order, on its own history: turn j's request is asks 1..j with the
model's recorded answers to turns 1..j−1 between them, and none of the dataset's answers (both trainers' data
tools regenerate every turn so; see docs/FORMATS.md#conversations). With `turns: last` the dataset's earlier
answers stay as history and only the last ask is answered (one request per prompt, as before conversations).

Tool conversations are regenerated semi-on-policy (speculators PR #750; docs/FORMATS.md#tool-calls): the model
writes the calls; when they match the dataset's next calls by name and count, the dataset's tool results follow
them with the model's ids, and the next ask is answered. A mismatch ends the conversation after the tool-call turn
(still a sample): tool results are never invented.

An earlier plain answer is sent as `{role: assistant, content}`: K2.5's chat template renders every assistant
message up to the last plain answer as `<think></think>` + content (+ its calls), dropping its reasoning, so sending
that reasoning would only make the request longer (and a server that kept it would render other ids than our
`prompt_ids`). A tool-call answer after the last plain answer (the tool loop in flight) is sent with its
`reasoning`, which the template keeps.

A conversation ends at its last ask, at an unfinished answer (`finish_reason` other than `stop` or `tool_calls`: the
model never ended that turn), at a tool-call mismatch, or at a turn that fails for good (the engine stops the chain
there). A pause sample (`pauses`: the prefix a Ctrl-C or a SIGKILL cut) neither answers its turn nor ends anything: it
is kept under its own id (`pause_id`) and the turn is asked again by the next run, which goes on from that answer.

A task that names an environment is a rollout (rollouts.py): its asks are its user turns, and after a tool-call answer
the next request carries the results of executing the calls. Such a turn is made `due` (its calls' results not yet
in its messages: the executor seam runs them off the event loop) and `with_results` completes it before it is sent.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ...prompts import Prompt
from ...records import Answer, ToolCall, calls_before, native_call_id
from .rollouts import (
    DEFAULT_STEPS,
    FINISHED,
    Position,
    Rollout,
    ToolResult,
    calls_in,
    ended,
    position,
    replayed_calls,
    result_parts,
    tool_messages,
)

TurnsMode = Literal["all", "last"]
TURN_ID_SEP = "#"  # turn j ≥ 2 of conversation c has record id "c#j"; turn 1 keeps the prompt's id
PAUSE_SEP = "~"  # the n-th pause sample of turn id t has record id "t~n" (`pause_id`)
# `meta.cut` of a cut sample that pauses its turn rather than ending it: a Ctrl-C (or SIGTERM) closed its stream, or a
# SIGKILL left it and the next run kept what it had delivered. The turn is asked again; the target's cut
# (`target_reached`) is final.
KILLED = "killed"  # `meta.cut` of a killed run's stream, kept by the next (realtime/salvage.py)
PAUSE_CUTS = frozenset({"interrupted", KILLED})
TOOL_MISMATCH = "tool_mismatch"  # `meta.ended`: the model's calls were not the dataset's, so no results follow
# How a tool-call turn missed the dataset's next calls (`mismatch_kind`), as the report says it.
MISMATCHES = {"plain": "answered plainly where the dataset called a tool",
              "called": "called a tool where the dataset answered plainly",
              "other": "called other tools (or other counts of them) than the dataset"}


def turn_id(conversation_id: str, turn: int, *, first: bool) -> str:
    """A record's id: the prompt's id for a conversation's first request, else `<conversation>#<turn>`."""
    return conversation_id if first else f"{conversation_id}{TURN_ID_SEP}{turn}"


def pause_id(turn_id_: str, n: int) -> str:
    """The record id of the n-th (1-based) pause sample of a turn: its own id, so that the turn's answer, asked again,
    keeps the turn's id."""
    return f"{turn_id_}{PAUSE_SEP}{n}"


def pauses(meta: dict | None) -> bool:
    """A record (its `meta`) is a pause sample: a prefix the run kept when a signal stopped it, whose turn is to do."""
    return (meta or {}).get("cut") in PAUSE_CUTS


def conversation_ends(turn: int, last: int | None, finish_reason: str | None, ended: str | None = None) -> bool:
    """Recording `turn` with `finish_reason` finishes its conversation: it has no later turn (`last`: its last
    turn's number, None for a conversation of one request), the answer did not finish (a cut turn ends it), or it
    ended otherwise (`ended`, the record's `meta.ended`: a tool-call mismatch)."""
    return last is None or turn >= last or finish_reason not in FINISHED or bool(ended)


def _calls(message: dict) -> tuple[ToolCall, ...]:
    return tuple(ToolCall.from_api(c) for c in message.get("tool_calls") or ())


def model_call_ids(served: Sequence[ToolCall], messages: Sequence[dict]) -> tuple[tuple[ToolCall, ...], bool]:
    """The calls with the ids the model wrote, and whether any was rebuilt. A served `functions.NAME:IDX` is the
    model's own (vLLM's kimi_k2 parser keeps it); any other id (`call_…`) was the provider's: the model still wrote
    `functions.NAME:IDX`, IDX the conversation's running count of calls (`calls_before` + its position)."""
    base = calls_before(messages)
    out = tuple(c if c.native else ToolCall(native_call_id(c.name, base + i), c.name, c.arguments)
                for i, c in enumerate(served))
    return out, out != tuple(served)


def matches(ours: Sequence[ToolCall], dataset: Sequence[ToolCall]) -> bool:
    """The model's calls match the dataset's next calls: the same names, as many times each (a plain answer
    matches a plain one)."""
    return Counter(c.name for c in ours) == Counter(c.name for c in dataset)


def mismatch_kind(ours: Sequence[str], dataset: Sequence[str]) -> str:
    """Which of `MISMATCHES` a turn whose call names `ours` did not match the dataset's `dataset` is."""
    if not ours:
        return "plain"
    return "called" if not dataset else "other"


def result_ids(ours: Sequence[ToolCall], dataset: Sequence[ToolCall]) -> dict[str, str]:
    """Dataset call id -> the model's id for the call of the same name and rank (calls may come in any order)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for c in ours:
        by_name[c.name].append(c.id)
    taken: Counter = Counter()
    out = {}
    for c in dataset:
        out[c.id] = by_name[c.name][taken[c.name]]
        taken[c.name] += 1
    return out


def split_asks(messages: Sequence[dict]) -> tuple[list[list[dict]], list[tuple[ToolCall, ...]]] | None:
    """The asks of a conversation and, between them, the calls of the dataset's answers (`()` for a plain one); None
    when it cannot be regenerated turn by turn (its last ask asks nothing, or a tool conversation with two assistant
    messages in a row)."""
    walked = _walk_asks(messages)
    if walked is None:
        return None
    asks, between, _, block = walked
    if not any(b["role"] in ("user", "tool") for b in block):
        return None
    asks.append(block)
    return asks, between


def split_answered(messages: Sequence[dict]) -> tuple[list[list[dict]], list[str | None]] | None:
    """`split_asks` of the conversation as a prompt file reads it (its trailing assistant messages dropped), with the
    dataset's answer to each ask from the same walk: the first assistant message after it (later ones in a row are
    dropped, as generation drops them); for the last ask the first trailing assistant message, None when the
    conversation ends on that ask. None when `split_asks` gives None."""
    end = len(messages)
    while end and messages[end - 1]["role"] == "assistant":
        end -= 1
    walked = _walk_asks(messages[:end])
    if walked is None:
        return None
    asks, _, answers, block = walked
    if not any(b["role"] in ("user", "tool") for b in block):
        return None
    asks.append(block)
    answers.append(str(messages[end].get("content") or "") if end < len(messages) else None)
    return asks, answers


def _walk_asks(messages: Sequence[dict]) -> tuple[list[list[dict]], list[tuple[ToolCall, ...]], list[str | None],
                                                  list[dict]] | None:
    """One walk of a conversation: the closed asks, the calls and the text of the dataset's answer closing each, and
    the block after the last one (the last ask, when it asks something); None for a tool conversation with two
    assistant messages in a row."""
    asks: list[list[dict]] = []
    between: list[tuple[ToolCall, ...]] = []
    answers: list[str | None] = []
    block: list[dict] = []
    tools = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    for m in messages:
        asking = any(b["role"] in ("user", "tool") for b in block)
        if m["role"] == "assistant" and (asks or asking):
            if asking:  # the dataset's answer to this ask: dropped (its calls kept, to match the model's against)
                asks.append(block)
                between.append(_calls(m))
                answers.append(str(m.get("content") or ""))
                block = []
            elif tools:
                return None
            continue  # any other assistant message after the first user turn is the dataset's too
        block.append(m)  # leading assistant messages (before any user turn) stay as context
    return asks, between, answers, block


def _assistant(answer: Answer, in_loop: bool) -> dict:
    """An earlier answer as sent: its content, and for a tool-call answer its calls (the model's ids) and, while the
    tool loop is in flight (no plain answer after it), its reasoning: the template keeps it there and drops it
    before, where a `preserve_thinking` render (the prefix check) would otherwise see it. The reasoning goes as
    `reasoning` (what vLLM, SGLang and transformers' renderer read as `reasoning_content`) and as
    `reasoning_details`, the way OpenRouter documents passing reasoning back for a tool loop."""
    if not answer.tool_calls:
        return {"role": "assistant", "content": answer.content}
    kept = {"reasoning": answer.reasoning, "reasoning_details": [{"type": "reasoning.text", "text": answer.reasoning}]}
    return {"role": "assistant", "content": answer.content, **(kept if in_loop and answer.reasoning else {}),
            "tool_calls": [c.to_api() for c in answer.tool_calls]}


@dataclass(frozen=True)
class Conversation:
    """One prompt as a chain of requests. `first` is the turn number of its first request: 1, or with `turns:
    last` the number of asks (the record's `turn` is the ask it answers). `dataset_calls[k]`: the calls of the
    dataset's answer to ask k (what the model's answer must match for ask k+1's tool results to follow). A rollout
    (`rollout` set: its task names an environment) has its user turns as asks and no dataset answers."""

    id: str
    asks: tuple[tuple[dict, ...], ...]
    first: int = 1
    dataset_calls: tuple[tuple[ToolCall, ...], ...] = ()
    tools: tuple[dict, ...] | None = None
    rollout: Rollout | None = None

    @classmethod
    def of(cls, prompt: Prompt, turns: TurnsMode = "all", steps: int = DEFAULT_STEPS) -> Conversation:
        """`steps`: a rollout's cap on requests per user turn (a task is a rollout whatever `turns` says: it has no
        dataset answers to keep)."""
        tools = tuple(prompt.tools) if prompt.tools else None
        if prompt.task is not None and prompt.user_turns:
            return cls(prompt.id, tuple(map(tuple, prompt.user_turns)), tools=tools,
                       rollout=Rollout(prompt.task, steps))
        split = split_asks(prompt.messages)
        if turns == "last" or split is None or len(split[0]) == 1:
            return cls(prompt.id, (tuple(prompt.messages),), first=len(split[0]) if split else 1, tools=tools)
        asks, between = split
        return cls(prompt.id, tuple(tuple(a) for a in asks), dataset_calls=tuple(between), tools=tools)

    @property
    def last(self) -> int:
        """The turn number of its last request (a rollout's: of its last request if every user turn is answered at
        once, the fewest it can make)."""
        return self.first + len(self.asks) - 1

    @property
    def chained(self) -> bool:
        """More than one request (a rollout may always make more): its records carry `meta.turns` (a rollout's
        `meta.rollout`) so that a resume knows when it ended."""
        return len(self.asks) > 1 or self.rollout is not None

    @property
    def parallel_tool_calls(self) -> bool:
        """What the request says of parallel calls: as the dataset does (an answer of several calls in its
        messages), so the model calls as the agent that made the data let it; a rollout's model calls as it will
        (its calls run in order)."""
        return self.rollout is not None or any(len(c) > 1 for c in self.dataset_calls) or any(
            len(m.get("tool_calls") or ()) > 1 for ask in self.asks for m in ask)

    def stand_in(self, k: int) -> Answer:
        """An empty answer to ask k shaped as the dataset's (its calls): budget's prompt lengths."""
        calls = self.dataset_calls[k] if k < len(self.dataset_calls) else ()
        return Answer("", "", "tool_calls" if calls else "stop", calls)

    def _ask(self, k: int, answers: Sequence[Answer]) -> list[dict]:
        """Ask k as sent: tool results carry the ids of the model's calls they answer."""
        ask = list(self.asks[k])
        if k == 0 or not self.dataset_calls[k - 1]:
            return ask
        ids = result_ids(answers[k - 1].tool_calls, self.dataset_calls[k - 1])
        return [{**m, "tool_call_id": ids[m["tool_call_id"]]} if m["role"] == "tool" and m.get("tool_call_id") in ids
                else m for m in ask]

    def turn(self, answers: Sequence[Answer] = (), results: Sequence[Sequence[str]] = ()) -> Turn:
        """The request after the recorded `answers` (turns first..first+k−1, in order; each matched the dataset). A
        rollout's `results`: those of its executed steps, in order (the last step's may be missing: the turn is then
        `due`, its results to be executed)."""
        if self.rollout is not None:
            return self._rollout_turn(answers, results)
        k = len(answers)
        if k >= len(self.asks):
            raise ValueError(f"conversation {self.id!r} has {len(self.asks)} turns, {k} already answered")
        last_plain = max((j for j, a in enumerate(answers) if not a.tool_calls), default=-1)
        messages: list[dict] = []
        for j, answer in enumerate(answers):
            messages += [*self._ask(j, answers), _assistant(answer, in_loop=j > last_plain)]
        messages += self._ask(k, answers)
        return Turn(self, self.first + k, messages, tuple(answers))

    def _rollout_turn(self, answers: Sequence[Answer], results: Sequence[Sequence[str]]) -> Turn:
        """A rollout's request after `answers`: each user turn, each answer (a tool loop's in flight with its
        reasoning, as `turn` sends them), each executed step's results with its calls' ids; the last step's calls
        `due` when `results` lacks them."""
        at = position(answers)
        steps = [j for j, a in enumerate(answers) if calls_in(a)]
        due = len(results) == len(steps) - 1 and bool(at.due)
        if len(results) != len(steps) and not due or at.user_turn >= len(self.asks):
            raise ValueError(f"conversation {self.id!r}: {len(answers)} answers, {len(steps)} of them calls, "
                             f"{len(results)} results, {len(self.asks)} user turns: no request follows")
        last_plain = max((j for j, a in enumerate(answers) if not a.tool_calls), default=-1)
        messages, user_turn, executed = list(self.asks[0]), 0, iter(results)
        for j, a in enumerate(answers):
            messages.append(_assistant(a, in_loop=j > last_plain))
            if not calls_in(a):
                user_turn += 1
                messages += self.asks[user_turn]
            elif not (due and j == len(answers) - 1):
                messages += tool_messages(a.tool_calls, next(executed))
        return Turn(self, self.first + len(answers), messages, tuple(answers), tuple(map(tuple, results)),
                    at.due if due else ())


@dataclass(frozen=True)
class Turn:
    """What the pool schedules: one request of a conversation (a one-turn prompt is a conversation of one)."""

    conversation: Conversation
    number: int            # the record's `turn`
    messages: list[dict]   # exactly what is sent (with `conversation.tools`), once no call is `due`
    answers: tuple[Answer, ...] = ()  # the recorded answers of this conversation's earlier turns
    results: tuple[tuple[str, ...], ...] = ()  # a rollout's: the results of its executed steps, in order
    due: tuple[ToolCall, ...] = ()  # a rollout's: the last answer's calls, whose results `messages` still lack
    errors: tuple[str | None, ...] | None = None  # a rollout's: the kinds of the results it was completed with

    @property
    def id(self) -> str:
        return turn_id(self.conversation.id, self.number, first=self.number == self.conversation.first)

    @property
    def position(self) -> Position:
        """A rollout's: where this request stands in its task (user turn, step)."""
        return position(self.answers)

    @property
    def replay(self) -> tuple[tuple[tuple[ToolCall, str], ...], tuple[ToolCall, ...]]:
        """A due turn's execution: the calls to replay into a fresh environment first (every executed step's, in
        order, each with the result the model was shown), then the calls whose results it needs."""
        shown = [r for step in self.results for r in step]
        return tuple(zip(replayed_calls(self.answers), shown, strict=True)), self.due

    def with_results(self, results: Sequence[ToolResult]) -> Turn:
        """This due turn completed with its calls' results (one per call, in order: a text, or a text with its
        failure's kind, which its record keeps), ready to send."""
        if not self.due:
            raise ValueError(f"turn {self.id!r} has no calls waiting for results")
        done, errors = result_parts(results)
        return replace(self, messages=[*self.messages, *tool_messages(self.due, done)],
                       results=(*self.results, done), due=(), errors=errors)

    @property
    def later(self) -> int:
        """Requests of this conversation still to come after this one, if every answer finishes (a rollout's: at
        least one per user turn left)."""
        if self.conversation.rollout is not None:
            return len(self.conversation.asks) - 1 - self.position.user_turn
        return self.conversation.last - self.number

    @property
    def promised(self) -> bool:
        """A later turn of its conversation, counted among `later` when the conversation started (pacing's promised
        turns): every one but a rollout's tool steps, which nobody can count upfront (they come unannounced)."""
        return self.conversation.rollout is None or self.position.step == 1

    @property
    def dataset_calls(self) -> tuple[ToolCall, ...] | None:
        """The calls of the dataset's answer to this turn's ask (`()`: a plain answer), None where the dataset has no
        answer (the conversation's last ask): what the model's answer must match for the loop to go on."""
        k = self.number - self.conversation.first
        return self.conversation.dataset_calls[k] if k < len(self.conversation.dataset_calls) else None

    def mismatch(self, answer: Answer) -> bool:
        """The answer finished but its calls are not the dataset's next ones (by name and count): no tool results
        can follow, so the conversation ends here."""
        k = self.number - self.conversation.first
        return (answer.finish_reason in FINISHED and k < len(self.conversation.dataset_calls)
                and not matches(answer.tool_calls, self.conversation.dataset_calls[k]))

    def ends(self, answer: Answer) -> bool:
        """Recording this answer finishes the conversation (a rollout's: its last user turn answered, its step cap
        reached, or an answer cut)."""
        if (rollout := self.conversation.rollout) is not None:
            return answer.finish_reason not in FINISHED or \
                ended(self.position, answer, len(self.conversation.asks), rollout.steps) is not None
        return conversation_ends(self.number, self.conversation.last, answer.finish_reason,
                                 TOOL_MISMATCH if self.mismatch(answer) else None)

    def next(self, answer: Answer) -> Turn | None:
        """The conversation's next request once this answer is recorded (calls with the model's ids), or None."""
        if self.ends(answer):
            return None
        return self.conversation.turn([*self.answers, answer], self.results)


def later_turn_ids(prompt: Prompt, turns: TurnsMode, steps: int = DEFAULT_STEPS) -> list[str]:
    """The record ids a prompt's turns after the first will have (the prompt scan refuses a clash with another
    prompt's id); a rollout's, as many as its user turns and step cap allow."""
    c = Conversation.of(prompt, turns, steps)
    last = c.first - 1 + len(c.asks) * steps if c.rollout is not None else c.last
    return [turn_id(c.id, n, first=False) for n in range(c.first + 1, last + 1)]
