"""Conversations as chains of requests (pure): what the pool schedules is a `Turn`, one request of one conversation.

A prompt's conversation is cut into *asks*: the system, user (and leading) messages up to each of the dataset's
assistant answers, and the messages after the last one. With `turns: all` every ask is answered by the target in
order, on its own history: turn j's request is asks 1..j with the target's recorded answers to turns 1..j−1
between them, and none of the dataset's answers (both trainers' data tools regenerate every turn so; see
docs/FORMATS.md#conversations). With `turns: last` the dataset's earlier answers stay as history and only the last
ask is answered (one request per prompt, as before conversations).

An earlier answer is sent as `{role: assistant, content}`: K2.5's chat template renders every assistant message
before the last user turn as `<think></think>` + content, dropping its reasoning, so sending the reasoning would
only make the request longer (and a server that kept it would render other ids than our `prompt_ids`, which the
fidelity judge would see as a prompt difference).

A conversation ends at its last ask, at a cut or otherwise unfinished answer (`finish_reason` other than `stop`: the
model never ended that turn), or at a turn that fails for good (the engine stops the chain there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from .prompts import Prompt

TurnsMode = Literal["all", "last"]
TURN_ID_SEP = "#"  # turn j ≥ 2 of conversation c has record id "c#j"; turn 1 keeps the prompt's id


def turn_id(conversation_id: str, turn: int, *, first: bool) -> str:
    """A record's id: the prompt's id for a conversation's first request, else `<conversation>#<turn>`."""
    return conversation_id if first else f"{conversation_id}{TURN_ID_SEP}{turn}"


def conversation_ends(turn: int, last: int | None, finish_reason: str | None) -> bool:
    """Recording `turn` with `finish_reason` finishes its conversation: it has no later turn (`last`: its last
    turn's number, None for a conversation of one request), or the answer did not finish (a cut turn ends it)."""
    return last is None or turn >= last or finish_reason != "stop"


def split_asks(messages: Sequence[dict]) -> list[list[dict]] | None:
    """The asks of a conversation (its messages with the dataset's assistant answers taken out), or None when it
    cannot be regenerated turn by turn: tool calls and tool results (their content answers the dataset's own
    calls), or a last ask without a user message."""
    if any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        return None
    asks: list[list[dict]] = []
    block: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and (asks or any(b["role"] == "user" for b in block)):
            if any(b["role"] == "user" for b in block):  # the dataset's answer to this ask: dropped
                asks.append(block)
                block = []
            continue  # any other assistant message after the first user turn is the dataset's too
        block.append(m)  # leading assistant messages (before any user turn) stay as context
    if not any(b["role"] == "user" for b in block):
        return None
    asks.append(block)
    return asks


@dataclass(frozen=True)
class Conversation:
    """One prompt as a chain of requests. `first` is the turn number of its first request: 1, or with `turns:
    last` the number of asks (the record's `turn` is the user turn it answers)."""

    id: str
    asks: tuple[tuple[dict, ...], ...]
    first: int = 1

    @classmethod
    def of(cls, prompt: Prompt, turns: TurnsMode = "all") -> "Conversation":
        asks = split_asks(prompt.messages)
        if turns == "last" or asks is None or len(asks) == 1:
            return cls(prompt.id, (tuple(prompt.messages),), first=len(asks) if asks else 1)
        return cls(prompt.id, tuple(tuple(a) for a in asks))

    @property
    def last(self) -> int:
        """The turn number of its last request."""
        return self.first + len(self.asks) - 1

    @property
    def chained(self) -> bool:
        """More than one request: its records carry `meta.turns` so that a resume knows when it ended."""
        return len(self.asks) > 1

    def turn(self, answers: Sequence[str] = ()) -> "Turn":
        """The request after the recorded `answers` (the contents of turns first..first+k−1, in order)."""
        k = len(answers)
        if k >= len(self.asks):
            raise ValueError(f"conversation {self.id!r} has {len(self.asks)} turns, {k} already answered")
        messages: list[dict] = []
        for ask, content in zip(self.asks, answers):
            messages += [*ask, {"role": "assistant", "content": content}]
        messages += self.asks[k]
        return Turn(self, self.first + k, messages, tuple(answers))


@dataclass(frozen=True)
class Turn:
    """What the pool schedules: one request of a conversation (a one-turn prompt is a conversation of one)."""

    conversation: Conversation
    number: int            # the record's `turn`
    messages: list[dict]   # exactly what is sent
    answers: tuple[str, ...] = ()  # the recorded contents of this conversation's earlier turns

    @property
    def id(self) -> str:
        return turn_id(self.conversation.id, self.number, first=self.number == self.conversation.first)

    @property
    def later(self) -> int:
        """Requests of this conversation still to come after this one, if every answer finishes."""
        return self.conversation.last - self.number

    def next(self, content: str, finish_reason: str) -> "Turn | None":
        """The conversation's next request once this one's answer is recorded, or None: this was the last ask, or
        the answer did not finish (a cut turn ends its conversation)."""
        if self.ends(finish_reason):
            return None
        return self.conversation.turn([*self.answers, content])

    def ends(self, finish_reason: str) -> bool:
        """Recording this turn with `finish_reason` finishes its conversation."""
        return conversation_ends(self.number, self.conversation.last, finish_reason)


def later_turn_ids(prompt: Prompt, turns: TurnsMode) -> list[str]:
    """The record ids a prompt's turns after the first will have (the prompt scan refuses a clash with another
    prompt's id)."""
    c = Conversation.of(prompt, turns)
    return [turn_id(c.id, n, first=False) for n in range(c.first + 1, c.last + 1)]
