"""The experiment's two arms, as records any dataset's records are: `on_policy` (the verifier's own answers to the
prompts, every turn on its own history) and `off_policy` (the data set's own answers, rendered with the verifier's
chat template). Both then go through `training.assemble` alike; `equalize` trims them to the same supervised tokens
over the same prompts.

Policy here is pure (records in, records or samples out, with counts of what was left out and why); the one thing
that runs a model, `regenerate_greedy`, takes the model and the chat as arguments.

A record is one assistant turn (`conversation_id`, `turn`, id `c` for turn 1 and `c#j` after, as generation writes
them): for turn j its prompt is the conversation up to user turn j with the arm's earlier answers as history (the
data set's for off-policy, the verifier's own for on-policy), its output the answer and the end-of-turn token, loss
on the answer only (`Record.loss_mask`). The asks are split as generation splits them (`split_answered`: generation's
`split_asks` walk, with the data set's answers from the same walk): leading assistant
messages stay as context, a second assistant message in a row is the data set's and dropped, a last ask with no
answer has no off-policy record.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import InputError
from ..generation.conversations.turns import split_answered, turn_id
from ..records import Record, Usage
from ..text import Tokenizer, output_ids, parse_output_ids, prompt_ids
from ..training.assembly import Sample

ARMS = ("on_policy", "off_policy")
GREEDY = {"temperature": 0.0, "greedy": True}  # the on-policy records' meta.sampling


class ArmChat(Protocol):
    """The verifier's chat as both arms need it: messages → the prompt's ids (ending in the generation prompt), an
    answer's text → its ids as the model would end it, and a generated answer's ids → the text the next turn
    carries."""

    def prompt_ids(self, messages: Sequence[dict]) -> list[int]: ...

    def answer_ids(self, content: str) -> list[int]: ...

    def answer_text(self, output_ids: Sequence[int]) -> str: ...

    def stop_ids(self) -> set[int]: ...


@dataclass
class TextStageChat:
    """The text stage's interface (`text.load_tokenizer`'s tokenizer: `text.prompt_ids`, `text.output_ids` with no
    reasoning, finish "stop", `text.parse_output_ids`): the recipe generation uses for its records, so an off-policy
    record is built as a generated one would be, and an answer's text is encoded as text (a literal `<|im_end|>` in a
    ShareGPT answer stays text)."""

    tok: Tokenizer

    def prompt_ids(self, messages: Sequence[dict]) -> list[int]:
        return prompt_ids(self.tok, messages)

    def answer_ids(self, content: str) -> list[int]:
        return output_ids(self.tok, "", content, "stop")

    def answer_text(self, output_ids: Sequence[int]) -> str:
        return parse_output_ids(self.tok, output_ids).content

    def stop_ids(self) -> set[int]:
        """The family's end of turn (`tok.structure`), the one id a finished answer ends with."""
        return {self.tok.structure.end_of_turn}


# -- the asks and the data set's answers -------------------------------------------------------------------------
@dataclass(frozen=True)
class Asks:
    """A conversation split into asks as generation splits it, with the data set's answer after each (None: none)."""

    id: str
    asks: list[list[dict]]
    answers: list[str | None]


def conversation_asks(cid: str, messages: Sequence[dict], max_turns: int) -> Asks | str:
    """The first `max_turns` asks of a conversation and the data set's answers to them, or why it has none
    (`split_answered`: the asks cut from the conversation without its trailing assistant messages, as a prompt file
    reads it, `prompts.normalize_prompt`, and the answers from the same walk)."""
    split = split_answered(messages)
    if split is None:
        return "cannot be asked turn by turn"
    asks, answers = split
    return Asks(cid, asks[:max_turns], answers[:max_turns])


# -- off-policy: the data set's answers as records ---------------------------------------------------------------
@dataclass
class ArmRecords:
    """An arm's records and what was left out (reason → count), as the stats table shows it."""

    records: list[Record]
    dropped: Counter = field(default_factory=Counter)

    @property
    def supervised_tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.records)


def cap_answer(ids: list[int], max_tokens: int | None) -> tuple[list[int], str]:
    """An answer's ids cut at `max_tokens` as the on-policy answers are (finish "length": no end-of-turn token)."""
    if max_tokens is not None and len(ids) > max_tokens:
        return ids[:max_tokens], "length"
    return ids, "stop"


def off_policy_records(conversations: Iterable[Asks], chat: ArmChat, *, dataset: str = "off_policy",
                       max_tokens: int | None = None) -> ArmRecords:
    """One record per answered ask: the conversation so far with the data set's earlier answers, then its answer
    (cut at `max_tokens` as the on-policy answers are). An empty answer, or an ask the data set never answered,
    ends the conversation there (its later turns would rest on it): counted, not kept. A cut answer ends it too,
    as a cut answer ends an on-policy conversation (generation's rule): a later turn's history is then always the
    whole text of the earlier samples, never an answer longer than the sample trained on."""
    out = ArmRecords([])
    for c in conversations:
        history: list[dict] = []
        for j, (ask, answer) in enumerate(zip(c.asks, c.answers), 1):
            messages = [*history, *ask]
            if answer is None or not answer.strip():
                out.dropped["no answer in the data set" if answer is None else "empty answer"] += 1
                break
            ids, finish = cap_answer(chat.answer_ids(answer), max_tokens)
            prompt = chat.prompt_ids(messages)
            out.records.append(Record(
                id=turn_id(c.id, j, first=j == 1), dataset=dataset, messages=messages, reasoning="", content=answer,
                finish_reason=finish, model="dataset", provider="dataset", conversation_id=c.id, turn=j,
                usage=Usage(len(prompt), len(ids)), prompt_ids=prompt, output_ids=ids,
                meta={"source": "the data set's own answer", "ids": "rendered"}))
            if finish != "stop":
                out.dropped["later turns after a cut answer"] += len(c.asks) - j
                break
            history = [*messages, {"role": "assistant", "content": answer}]
    return out


# -- on-policy: the verifier's own answers -------------------------------------------------------------------------
Generate = Callable[[list[list[int]], int], list[list[int]]]  # prompts' ids, max new tokens -> each answer's ids


def regenerate_greedy(conversations: Sequence[Asks], chat: ArmChat, generate: Generate, *,
                      dataset: str = "on_policy", max_tokens: int, batch_size: int = 8, model: str = "target",
                      progress: Callable[[int, int], None] | None = None) -> ArmRecords:
    """Every ask answered by the verifier, greedily, on its own earlier answers: turn j of every conversation after
    turn j − 1 of all of them, `batch_size` prompts at a time (`generate` returns each answer's ids, cut at the
    first stop id, which it keeps). An answer cut by `max_tokens` (finish "length") ends its conversation, as a cut
    answer ends one in generation. `progress(done, total)` after each batch, counted in asks."""
    out = ArmRecords([])
    history: dict[str, list[dict]] = {c.id: [] for c in conversations}
    alive = list(conversations)
    stops = chat.stop_ids()
    total, done = sum(len(c.asks) for c in conversations), 0
    for j in range(1, max((len(c.asks) for c in conversations), default=0) + 1):
        todo = [c for c in alive if len(c.asks) >= j]
        alive = []
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            messages = [[*history[c.id], *c.asks[j - 1]] for c in batch]
            prompts = [chat.prompt_ids(m) for m in messages]
            answers = generate(prompts, max_tokens)
            for c, m, p, ids in zip(batch, messages, prompts, answers):
                finish = "stop" if ids and ids[-1] in stops else "length"
                content = chat.answer_text(ids[:-1] if finish == "stop" else ids)
                out.records.append(Record(
                    id=turn_id(c.id, j, first=j == 1), dataset=dataset, messages=m, reasoning="", content=content,
                    finish_reason=finish, model=model, provider="local", conversation_id=c.id, turn=j,
                    usage=Usage(len(p), len(ids)), prompt_ids=p, output_ids=list(ids),
                    meta={"sampling": GREEDY, "ids": "model"}))
                if finish == "stop" and content.strip():
                    history[c.id] = [*m, {"role": "assistant", "content": content}]
                    alive.append(c)
                else:
                    out.dropped["later turns after a cut or empty answer"] += len(c.asks) - j
            done += len(batch)
            if progress is not None:
                progress(done, total)
    return out


def transformers_generate(model: Any, stop_ids: Iterable[int], pad_id: int) -> Generate:
    """`Generate` by a transformers causal LM: greedy (`do_sample=False`), a batch left-padded with `pad_id`, each
    answer cut after its first stop id. The ids are the model's own, so the records are token-exact by construction;
    batching pads, and float rounding under padding may flip a near-tie against one-at-a-time decoding."""
    import torch

    stops = set(stop_ids)

    def generate(prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=sorted(stops), pad_token_id=pad_id)
        answers = []
        for row in out[:, width:].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
            answers.append(row[:end])
        return answers

    return generate


# -- equal supervised tokens over the same prompts ---------------------------------------------------------------
def turn_key(s: Sample) -> tuple[str, int]:
    return (s.conversation_id or s.id, s.turn)


def supervised(samples: Iterable[Sample]) -> int:
    return sum(sum(s.loss_mask) for s in samples)


def trim_to(sample: Sample, tokens: int) -> Sample:
    """`sample` ending right after its `tokens`-th supervised token (`shortened=True`); `tokens` ≥ 1."""
    seen = 0
    for i, m in enumerate(sample.loss_mask):
        seen += m != 0
        if seen == tokens:
            return replace(sample, input_ids=sample.input_ids[:i + 1], loss_mask=sample.loss_mask[:i + 1],
                           shortened=True)
    raise ValueError(f"sample {sample.id} has {seen} supervised tokens, fewer than {tokens}")


def take_supervised(samples: Sequence[Sample], tokens: int) -> list[Sample]:
    """Samples in (conversation id, turn) order until their supervised tokens are exactly `tokens`: whole samples
    while they fit, then the sample that crosses the line trimmed after the token that reaches it; the rest left out."""
    kept: list[Sample] = []
    total = 0
    for s in sorted(samples, key=turn_key):
        n = sum(s.loss_mask)
        if total + n <= tokens:
            kept.append(s)
            total += n
        else:
            if tokens > total:
                kept.append(trim_to(s, tokens - total))
            break
    return kept


@dataclass(frozen=True)
class Equalized:
    """The two arms over the same asks at equal supervised tokens, and what it took."""

    arms: dict[str, list[Sample]]
    supervised_tokens: int
    shared_turns: int  # (conversation, turn) pairs both arms had
    left_out: dict[str, dict[str, int]]  # arm -> {"not in the other arm": n, "over the equal tokens": n}

    def table(self) -> list[dict[str, Any]]:
        """One row per arm (summary.json's `arms`). `cut_samples` keeps its stored name: the samples equalizing
        trimmed (`Sample.shortened`), not generation's cut samples (streams the run closed)."""
        return [{"arm": a, "samples": len(s), "supervised_tokens": supervised(s),
                 "tokens": sum(len(x) for x in s), "cut_samples": sum(x.shortened for x in s),
                 **turn_shares(s), **self.left_out[a]} for a, s in self.arms.items()]


def turn_shares(samples: Sequence[Sample]) -> dict[str, Any]:
    """What an arm trains on by turn (issue 59: trained as measured): samples per user turn, and the answers the cap
    cut (`truncated`: finish "length"), as counts and shares of the arm's samples."""
    n = len(samples) or 1
    turns = Counter(s.turn for s in samples)
    cut = sum(s.truncated for s in samples)
    return {"turn_samples": {str(t): turns[t] for t in sorted(turns)},
            "turn_shares": {str(t): round(turns[t] / n, 4) for t in sorted(turns)},
            "cut_answers": cut, "cut_answer_share": round(cut / n, 4)}


def equalize(arms: dict[str, Sequence[Sample]]) -> Equalized:
    """The same prompts, the same supervised tokens: each arm keeps only the (conversation, turn)s every arm has,
    then every arm is trimmed (`take_supervised`) to the smallest arm's supervised tokens. The smallest arm stays
    whole; a larger one loses its last samples in (conversation id, turn) order, the one that crosses the line trimmed
    inside its answer."""
    if not arms:
        raise InputError("no arms given", field="arms")
    shared = set.intersection(*(set(map(turn_key, s)) for s in arms.values()))
    common = {a: [x for x in s if turn_key(x) in shared] for a, s in arms.items()}
    tokens = min(supervised(s) for s in common.values())
    if tokens == 0:
        raise InputError(f"the arms share no supervised token ({len(shared)} shared turns)", field="arms")
    out = {a: take_supervised(s, tokens) for a, s in common.items()}
    left_out = {a: {"not_in_other_arm": len(arms[a]) - len(common[a]),
                    "over_equal_tokens": len(common[a]) - len(out[a])} for a in arms}
    return Equalized(out, tokens, len(shared), left_out)


def held_out(samples: Sequence[Sample], validation: set[str]) -> tuple[list[Sample], list[Sample]]:
    """(training samples, validation samples): a sample is held out when its conversation is."""
    return ([s for s in samples if s.conversation_id not in validation],
            [s for s in samples if s.conversation_id in validation])


def shared_validation(arms: dict[str, Sequence[Sample]]) -> dict[str, list[Sample]]:
    """Each arm's validation samples over the same (conversation, turn)s: those every arm has, in (conversation id,
    turn) order (an on-policy turn 2 never asked after a cut turn 1 is left out of both)."""
    shared = set.intersection(*(set(map(turn_key, s)) for s in arms.values())) if arms else set()
    return {a: sorted((x for x in s if turn_key(x) in shared), key=turn_key) for a, s in arms.items()}
