"""Rollouts (pure): a task that names an environment is answered on-policy with its tools executed.

Every user turn is asked on the trajectory so far; when the model calls tools, the calls (parallel ones in order) are
executed in the task's environment and their results follow as `tool` messages with the calls' exact ids
(`functions.NAME:IDX`, `turns.model_call_ids`); the model is asked again until it answers without a call, then the
next user turn. Each request is one `Turn` through the pool, so the budget stop, the cap and the credit rules hold
for every step as for any request, and each answer is one record, token-exact.

Numbering: a trajectory's number of requests is not known upfront, so a record's `turn` counts the trajectory's
requests from 1 (the first keeps the task's id, request n is `<id>#n`), as a tool loop's turns are numbered on
after the user turn today. Request n is fixed by the n−1 answers before it, so its id is the same in every run that
resumes the trajectory. `meta.rollout` says where in the task a record stands: `{user_turn, step}` (1-based; `step`
counts the requests of that user turn), and `ended` on the record that ends the trajectory: `answered` (its last
user turn answered without a call) or `capped` (its `steps` cap reached while the model still called). A cut answer
ends it too (its `finish_reason` says so), as a turn failed for good does (failures.jsonl names it).

The cap ends the whole trajectory, as BFCL's multi-turn runner does (it force-quits the task past its step limit):
going on to the next user turn would either leave the capped answer's calls unanswered (a history K2.5 never writes)
or show results for calls the model meant to keep making, and the data would fill with the loop.

The environment is reached through one injected seam, `Execute`: generation never imports an implementation. It is
stateless: the environment is rebuilt from the task's initial state by replaying every call the trajectory made before,
then the new calls run and their results are returned (an implementation may run them on an environment kept live whose
executed calls and results are exactly those: the same state without the rebuild). So a resume after a SIGKILL is exact
by construction: no call is ever run against a state that already holds it, and the results of earlier steps are read
from the records (what the model was shown), never computed again.

A result may come with its failure's kind (`Shown`: the executor knows why a call failed, so the report counts the
kinds without reading the wording); the record that carries the results keeps the kinds in `meta.rollout.errors`.
Every record keeps its task's environment (`environment_label`), so a records file says per environment how the
trajectories went without its task file.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Protocol

from ...records import Answer, ToolCall

DEFAULT_STEPS = 20  # requests per user turn at most (BFCL's MAXIMUM_STEP_LIMIT)
ANSWERED, CAPPED = "answered", "capped"  # `meta.rollout.ended`: how the trajectory ended at this record
FINISHED = ("stop", "tool_calls")  # finish reasons of an answer the model ended itself (turns.py re-exports it)


BFCL = "bfcl"  # the environment of BFCL's multi-turn backends (agentic.backends.BFCL): labelled by its classes


class Shown(Protocol):
    """A result with its failure's kind (`agentic.calls.CallResult`): the text the model is shown, and None or the
    kind (`unknown_function`, `malformed_arguments`, `invalid_arguments`, `raised`, `timeout`, `out_of_memory`,
    `crashed`)."""

    @property
    def text(self) -> str: ...

    @property
    def error(self) -> str | None: ...


ToolResult = str | Shown  # what `Execute` returns per call: its text alone (kind not said), or with its kind


class Execute(Protocol):
    """The environment seam: `calls` executed in a fresh environment made from `task` (`Prompt.task`: the agentic
    task's `{id, environment, initial_config, involved_classes, tools}`) after `before` was replayed in order (each
    earlier call with the result the model was shown: a rebuild may check it, and leave out a call whose recorded
    result says its process was killed under it); one result text per call of `calls`, in order. A call the
    environment rejects (unknown function, arguments that do not parse or fit, a method that raises or runs past its
    time limit) is an error text, not an exception: it is the model's behaviour and the trajectory goes on; an executor
    that knows the failure's kind returns a `Shown` (text and kind) for each call, one that does not the texts. An
    exception is a failure of the environment itself: the run stops cleanly (every record stays exact; the next run
    executes the step again). Called off the event loop (it may be a round trip to a worker process), from several
    threads at once (for different trajectories). It may keep environments live between steps as long as each
    step's results are what the stateless rebuild would give; a `close()` of its own is called at the run's end."""

    def __call__(self, task: Mapping[str, Any], before: Sequence[tuple[ToolCall, str]],
                 calls: Sequence[ToolCall]) -> Sequence[ToolResult]: ...


@dataclass(frozen=True)
class Rollout:
    """What makes a conversation a rollout: its task's environment fields (passed to `Execute` as they are) and the
    cap on requests per user turn."""

    task: Mapping[str, Any]
    steps: int = DEFAULT_STEPS


@dataclass(frozen=True)
class Position:
    """Where the next request of a trajectory stands: its user turn (0-based index of the ask), its step within it
    (1-based), and whether the last answer's calls still wait for their results."""

    user_turn: int
    step: int
    due: tuple[ToolCall, ...] = ()


def calls_in(answer: Answer) -> bool:
    """The answer is a step that called tools (finished, with calls): its calls are executed and it goes on."""
    return bool(answer.tool_calls) and answer.finish_reason in FINISHED


def position(answers: Sequence[Answer]) -> Position:
    """Where the request after `answers` stands: a plain answer moves to the next user turn, a call to the next step
    of the same one (its calls due)."""
    user_turn, step = 0, 1
    for a in answers:
        if calls_in(a):
            step += 1
        else:
            user_turn, step = user_turn + 1, 1
    due = answers[-1].tool_calls if answers and calls_in(answers[-1]) else ()
    return Position(user_turn, step, due)


def ended(at: Position, answer: Answer, user_turns: int, steps: int) -> str | None:
    """How `answer` to the request at `at` ends the trajectory (`ANSWERED`, `CAPPED`), None when it goes on or the
    answer is cut (its finish reason ends the trajectory)."""
    if answer.finish_reason not in FINISHED:
        return None
    if calls_in(answer):
        return CAPPED if at.step >= steps else None
    return ANSWERED if at.user_turn + 1 >= user_turns else None


def environment_label(task: Mapping[str, Any]) -> str:
    """What a task's trajectories are reported under: `bfcl:` and its involved classes in order (`bfcl:MathAPI,
    TwitterAPI`: BFCL's tasks differ by the backends they use), else the user's class as the task names it, a file
    path shortened to its file name (`kv_store.py:KeyValueStore`; the task file's folder is no part of the kind)."""
    environment = str(task["environment"])
    if environment == BFCL:
        return f"{BFCL}:{','.join(map(str, task.get('involved_classes') or ()))}"
    where, _, name = environment.rpartition(":")
    return f"{PurePath(where).name}:{name}" if where.endswith(".py") else environment


def rollout_meta(at: Position, answer: Answer, user_turns: int, steps: int, *, environment: str,
                 errors: Sequence[str | None] | None = None) -> dict[str, Any]:
    """`meta.rollout` of the record of `answer` to the request at `at`: `environment` its task's label, `errors` the
    kinds of the results this request is the first to carry (None each that did not fail; None: none carried, or
    the executor did not say)."""
    meta: dict[str, Any] = {"user_turn": at.user_turn + 1, "step": at.step, "environment": environment}
    if errors is not None:
        meta["errors"] = list(errors)
    if (how := ended(at, answer, user_turns, steps)) is not None:
        meta["ended"] = how
    return meta


def rollout_ends(rollout: Mapping[str, Any], finish_reason: str | None) -> bool:
    """A rollout record (its `meta.rollout` and finish reason) ends its trajectory: what the store's index says of it
    (a cut answer ends it as in any conversation; `ended` otherwise)."""
    return finish_reason not in FINISHED or bool(rollout.get("ended"))


def replayed_calls(answers: Sequence[Answer]) -> tuple[ToolCall, ...]:
    """Every call the trajectory executed before the last answer's, in order: what `Execute` replays."""
    done = answers[:-1] if answers and calls_in(answers[-1]) else answers
    return tuple(c for a in done if calls_in(a) for c in a.tool_calls)


def result_parts(results: Sequence[ToolResult]) -> tuple[tuple[str, ...], tuple[str | None, ...] | None]:
    """The texts of `Execute`'s results, and their kinds (None when the executor gave texts alone: kinds are never
    guessed from the wording). A mix is refused: an executor says its kinds for every call or for none."""
    if all(isinstance(r, str) for r in results):
        return tuple(results), None  # type: ignore[arg-type]
    if any(isinstance(r, str) for r in results):
        raise TypeError("the environment returned kinds for some results and not for others")
    return tuple(r.text for r in results), tuple(r.error for r in results)  # type: ignore[union-attr]


def tool_messages(calls: Sequence[ToolCall], results: Sequence[str]) -> list[dict[str, Any]]:
    """The results as sent: one `tool` message per call, in the calls' order, with the call's exact id."""
    if len(results) != len(calls):
        raise ValueError(f"the environment returned {len(results)} results for {len(calls)} calls")
    for r in results:
        if not isinstance(r, str):
            raise TypeError(f"the environment returned a {type(r).__name__} result; a result is its text")
    return [{"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(calls, results)]


def recorded_results(answers: Sequence[Answer], messages: Sequence[Mapping[str, Any]], where: str) \
        -> tuple[tuple[str, ...], ...]:
    """The results of the executed steps among `answers` (all but a last step still due), read from `messages`, the
    last record's request (what the model was shown); `where` names that record in the error when one is missing."""
    shown = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    out: list[tuple[str, ...]] = []
    for a in answers[:-1] if answers and calls_in(answers[-1]) else answers:
        if not calls_in(a):
            continue
        missing = [c.id for c in a.tool_calls if not isinstance(shown.get(c.id), str)]
        if missing:
            raise ValueError(f"{where}: its messages lack the result of call {missing[0]!r}")
        out.append(tuple(str(shown[c.id]) for c in a.tool_calls))
    return tuple(out)
