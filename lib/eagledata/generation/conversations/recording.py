"""What an answer becomes (pure): the record, with its exact token ids.

Kept out of the engine so that the recipe (DESIGN.md: reasoning ids, `</think>`, content ids, the tool-call section,
`<|im_end|>` unless cut), the calls' ids as the model wrote them, and what a local server's own ids override can be
read and tested without running anything.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...openrouter import Completion, Kind, Outcome
from ...records import Record
from ...text import Tokenizer, agreement, output_ids
from .rollouts import environment_label, rollout_meta
from .turns import TOOL_MISMATCH, Turn, model_call_ids

# -- the service's count against our ids ---------------------------------------------------------------------------
COUNT_DISAGREES = "count_disagrees"  # the error class of an answer refused for its count: retried elsewhere
# How far a kept answer's `completion_diff` may leave its provider's offset (fidelity.py: 0 or -1 on answers that end
# in `<|im_end|>`, 0 on cut ones). An honest provider leaves it by one token at most, and rarely: the emulator's
# faithful answers by +1 when a cut fell inside a character or right after `</think>` (2 of 250 cut answers), the real
# model's by one per non-canonical split it sampled (rare: a faithful provider's answers leave the offset well under
# 1 % of the time, fidelity.py; an answer with two such splits is refused and costs one retry). The smallest wrong
# split moves it by two: a literal `</think>` in the answer (three text tokens) taken for the one control token; a
# withheld reasoning by its whole length; spaces beside the special tokens (vllm#33457) by two.
COUNT_TOLERANCE = 1


def count_refusal(completion: Completion, check: Mapping[str, Any], offset: int, *, server_ids: bool = False,
                  tolerance: int = COUNT_TOLERANCE) -> Outcome | None:
    """The refusal of an answer whose rebuilt ids the service's own count contradicts, else None (pure).

    Refused (`count_disagrees`, retried with its provider ignored, as `reasoning_missing`): `check`'s `completion_diff`
    (usage minus ids) leaves `offset`, the provider's, by more than `tolerance`, whatever the provider's verdict; and
    a repaired answer (`bare_close`, `bare_close_cut`) with no count to agree with, since a repair is an inference the
    count must confirm. Kept unchecked: an answer served whole with no count (`completion_diff` None), and one whose
    ids are a local server's own (`server_ids`: they are the truth the count stands for)."""
    if server_ids:
        return None
    diff, repaired = check.get("completion_diff"), completion.repaired
    if diff is None:
        if not repaired:
            return None
        why = f"repaired ({repaired}) with no completion count to agree with: the split cannot be confirmed"
    elif abs(diff - offset) <= tolerance:
        return None
    else:
        u = completion.usage
        why = (f"rebuilt ids {u.completion_tokens - diff} vs the service's {u.completion_tokens} completion tokens "
               f"({diff:+d}), beyond {completion.provider or 'its provider'}'s offset {offset:+d} ± {tolerance}"
               + (f" (repaired: {repaired})" if repaired else ""))
    return Outcome(Kind.RETRY, COUNT_DISAGREES, 200, why, provider=completion.provider, completion=completion)


def answer_check(completion: Completion, prompt_ids: list[int], output_ids: list[int], *,
                 shaped: bool = True) -> dict[str, Any]:
    """`meta.fidelity` of a kept answer: the repair rule applied ("" when served whole) and how the service's own
    counts differ from our ids (`usage` minus ids; None when the service gave no count). A provider's differences
    are constant (it counts `<|im_end|>` or not); spread-out ones mean its text is not the model's
    (generation/conversations/fidelity.py judges them). `shaped` False: a model without a reasoning section, whose
    answer is recorded as served (no repair applies)."""
    u = completion.usage
    return {"repaired": completion.repaired if shaped else "",
            "completion_diff": u.completion_tokens - len(output_ids) if u.completion_tokens else None,
            "prompt_diff": u.prompt_tokens - len(prompt_ids) if u.prompt_tokens else None}


def build_record(tok: Tokenizer, *, turn: Turn, dataset: str, prompt_ids: list[int], completion: Completion,
                 attempts: int, sampling: dict[str, Any] | None = None) -> Record:
    """The record of one answer to `turn` (its id, conversation, turn number and messages as sent). A lone surrogate
    (legal in JSON, not in UTF-8) has no exact ids: it raises UnicodeEncodeError rather than record ids that decode to
    other text. `sampling`: the request's sampling settings, kept in `meta.sampling` (the fidelity audit compares
    providers under the same settings). A turn of a chained conversation keeps `meta.turns`, its last turn's number:
    with the finish reason it tells a resume whether the conversation went on; a rollout's keeps `meta.rollout`
    instead (rollouts.py: its user turn and step, and `ended` where it ended its trajectory)."""
    # K2.5's shape rules (an inline `<think>` split off, a bare `</think>` repaired) are for a family that reasons;
    # a model without a reasoning section records its text as served
    shaped = tok.structure.reasons
    a = completion.answer if shaped else completion.as_served
    a.reasoning.encode("utf-8"), a.content.encode("utf-8")
    calls, rebuilt = model_call_ids(a.tool_calls, turn.messages)
    ids = output_ids(tok, a.reasoning, a.content, a.finish_reason, tool_calls=calls)
    meta: dict[str, Any] = {"attempts": attempts}
    if (rollout := turn.conversation.rollout) is not None:  # where in its task, and whether it ended the trajectory
        meta["rollout"] = rollout_meta(turn.position, a, len(turn.conversation.asks), rollout.steps,
                                       environment=environment_label(rollout.task), errors=turn.errors)
    elif turn.conversation.chained:
        meta["turns"] = turn.conversation.last
    if rebuilt:  # the provider's ids (`call_…`) replaced by the model's `functions.NAME:IDX`
        meta["served_tool_call_ids"] = [c.id for c in a.tool_calls]
    if turn.mismatch(a):  # the dataset's names beside the ended loop: why it ended (turns.mismatch_kind)
        meta["ended"] = TOOL_MISMATCH
        meta["dataset_calls"] = [c.name for c in turn.dataset_calls or ()]
    if sampling is not None:
        meta["sampling"] = dict(sampling)
    if completion.reasoning_inline and shaped:
        meta["reasoning_inline"] = True
    p_ids = prompt_ids
    if completion.output_token_ids is not None:  # a local backend told us the true ids: store those
        meta["ids_source"] = "server"
        meta["retokenized_agreement"] = agreement(ids, completion.output_token_ids)
        ids = list(completion.output_token_ids)
        if completion.prompt_token_ids is not None:
            meta["prompt_ids_match"] = list(completion.prompt_token_ids) == p_ids
            p_ids = list(completion.prompt_token_ids)
    meta["fidelity"] = answer_check(completion, p_ids, ids, shaped=shaped)
    return Record(id=turn.id, dataset=dataset, conversation_id=turn.conversation.id, turn=turn.number,
                  messages=turn.messages, tools=list(turn.conversation.tools or ()) or None,
                  tool_calls=[c.to_api() for c in calls] or None,
                  reasoning=a.reasoning, content=a.content, finish_reason=a.finish_reason,
                  model=completion.model, provider=completion.provider, generation_id=completion.generation_id,
                  usage=completion.usage, prompt_ids=p_ids, output_ids=ids, meta=meta)
