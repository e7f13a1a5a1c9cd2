"""What a killed run's streams had delivered, kept by the next run (issue 60): each journaled stream's text
(money/killed.py) rebuilt into the answer it was so far, recorded as a pause sample (`meta.cut: killed`) as a Ctrl-C's
cut stream is, and its turn asked again.

A prefix is kept only where it is one for sure, by the rule a Ctrl-C's cut follows (`openrouter.stream.cut_completion`:
reasoning served in its own field, nothing repaired, the content to its last whole word, calls that had begun left
out), from a provider the run does not hold suspect, and for the turn its conversation is at now (a turn recorded
before the kill wrote its end has moved on). Its record carries what it holds, its prompt and prefix at the provider's
price (`cost_of`), never more than the service billed for the generation (`KilledBefore.costs`, read by its id) where
it knows the id by then, as a Ctrl-C's cut sample does: the rest of what was billed (tokens generated past the
journal's last flush, or to the end on a provider that bills whole answers) stays the killed run's waste. An id it does
not know yet is an answer still generating upstream, or one that ended in an error the killed run had not read: billed
nothing, though its record carries its prefix's price (bench/README.md, issue 60's scenario: 4-20 of ~17,000 samples).
Keeping is idempotent: a stream whose generation id a pause sample of its turn already holds (a run killed while
keeping, before its journal was rewritten) is not kept twice."""
from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from ...aio import in_executor
from ...openrouter.stream import StreamState, cut_completion
from ...text import prompt_ids
from ..conversations.recorder import Recorder
from ..conversations.recording import build_record
from ..conversations.turns import KILLED, Turn
from ..lanes import DatasetRun
from ..money.killed import Delivered, KilledBefore


def rebuilt(d: Delivered) -> StreamState:
    """The stream's state as its journaled text leaves it (one delta holding all of it)."""
    state = StreamState()
    state.chunk({"id": d.generation_id, "provider": d.provider, "model": d.model, "choices": [{"delta": d.delta()}]})
    return state


async def keep_delivered(lane: DatasetRun, delivered: dict[str, Delivered], killed: KilledBefore,
                         recorder: Recorder, cost_of: Callable[[str, int, int], float],
                         complete: Callable[[Turn], Awaitable[Turn]]) -> None:
    """Record each stream's delivered prefix of `lane` as a pause sample of its turn; `killed` counts those kept (and
    what they hold) and why the others were not. `cost_of(provider, prompt tokens, output tokens)`: at its price.
    `complete`: a rollout's turn whose calls are due, with their results (the messages its stream was sent)."""
    by_conversation: dict[str, list[Delivered]] = {}
    for d in delivered.values():
        by_conversation.setdefault(d.conversation_id, []).append(d)
    store, why = lane.store, Counter[str]()
    for prompt in lane.scan:  # the conversations still to do (a stream of a finished one: its turn was recorded)
        if not by_conversation:
            break
        streams = by_conversation.pop(prompt.id, None)
        if streams is None:
            continue
        turn = lane.first_turn(lane.conversation(prompt))
        held = {r.generation_id for r in store.pause_samples(turn.id)}
        ids: list[int] | None = None
        for d in streams:
            if d.turn_id != turn.id:
                why["its turn was recorded"] += 1
                continue
            if d.generation_id in held:
                continue
            if d.provider in recorder.fidelity.suspects:
                why["a suspect provider"] += 1
                continue
            c, no = cut_completion(rebuilt(d))
            if c is None:
                why[no] += 1
                continue
            if ids is None:
                turn = await complete(turn)
                ids = await in_executor(recorder.executor, prompt_ids, recorder.tok, turn.messages,
                                        tools=turn.conversation.tools)
            try:
                record = await in_executor(recorder.executor, build_record, recorder.tok, turn=turn,
                                           dataset=lane.name, prompt_ids=ids, completion=c, attempts=1,
                                           sampling={"temperature": recorder.temperature})
            except UnicodeEncodeError:
                why["text with no ids"] += 1
                continue
            cost = cost_of(c.provider, len(ids), len(record.output_ids))
            if d.generation_id in killed.costs:
                cost = min(cost, killed.costs[d.generation_id])
            record.meta["cut"], record.id, record.usage.cost = KILLED, store.next_pause_id(turn.id), cost
            store.add_record(record, cost)
            killed.kept += 1
            killed.kept_usd += cost
    why["its conversation was finished"] += sum(map(len, by_conversation.values()))
    killed.not_kept = {k: n for k, n in why.items() if n}
