"""Many turns at once (`speculative_decode_batch`, `measure.py --batch`): each row decodes one turn as
`speculative_decode` does (its own drafts, acceptance, crop and count), the rows' chains verified together, either
by one batched verifying forward over them (`BatchVerifier.verify`) or against the verifier's own greedy decode run
ahead, one token per row a forward (`GreedyVerifier`): every position a greedy verification reads lies on that
sequence, so both give the same tokens and counts, and the second costs a token's forward per emitted token instead
of a chain's per verification (τ ≈ 1.3–1.8: 2–3× less arithmetic). A chat's next turn keeps the positions it shares
with its earlier turns in its row.

Torch only, as `speculative.py`: the same file runs in the project's environment and in the speculators one.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..records import common_prefix
from .batch_verifier import BatchVerifier, Verification
from .speculative import Decoded, Drafter, turn_ends


class RowForwards(Protocol):
    """What `GreedyVerifier` runs its one-token steps on: `BatchVerifier`, or its steps recorded or replayed
    (`greedy_trace.TraceRecorder`, `TraceReplay`)."""

    rows: int
    aux_layers: tuple[int, ...] | None

    def reset(self, row: int, keep: int = 0) -> None: ...

    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]: ...

    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]: ...


class GreedyVerifier:
    """Chains verified against the verifier's own greedy decode, decoded ahead of them: what `BatchVerifier.verify`
    answers, for one token per row per forward instead of the whole chain.

    Greedy verification accepts a chain's drafts up to the first that differs from the verifier's greedy token
    there, and that token is the bonus; every position it reads lies on the verifier's greedy sequence (the drafts
    before it equal it). So the verifier's tokens a verification needs are that sequence's, whichever drafter
    proposed the chain: this decodes each row's sequence greedily (`BatchVerifier` forwards of one token per row,
    every row that has not reached its end moving on together, so the weights are read once per token of all the
    rows), holds the tokens and aux states not yet verified, and answers `verify` from them: the chains it can answer
    now, the others waiting (the loop brings them again) while rows that have run ahead go on, finish and give their
    row to a new turn; a forward happens when no chain can be answered. A row runs ahead to its end (its first stop
    id or `max_new_tokens`), then `k` tokens on (where a last chain's drafts may still be counted, as a verifying
    forward counts them). The drafter, the chains, the counts and the loop are `speculative_decode_batch`'s; what
    differs from verifying forwards is only the float rounding of each position's logits (a forward of one token
    against one of the chain's), as batching rows differs from one row alone."""

    def __init__(self, verifier: RowForwards, *, k: int, max_new_tokens: int, stop_ids: Collection[int] = (),
                 complete_rows: bool = False):
        self.inner = verifier
        self.complete_rows = complete_rows  # decode each row through its end and k on before it is reset
        self.rows = verifier.rows
        self.aux_layers = verifier.aux_layers
        self.k, self.max_new_tokens, self.stop_ids = k, max_new_tokens, set(stop_ids)
        self.tokens: list[list[int]] = [[] for _ in range(self.rows)]  # prompt and greedy tokens decoded so far
        self.prompt = [0] * self.rows
        self.verified = [0] * self.rows  # the row's verified positions (all the loop holds but its last token)
        self.states: list[list[torch.Tensor]] = [[] for _ in range(self.rows)]  # [1, S] per decoded position …
        self.first_state = [0] * self.rows  # … from this position on
        self.end: list[int | None] = [None] * self.rows  # the output index of the row's last token, once decoded
        self.active: set[int] = set()
        self.forwards = 0

    def reset(self, row: int, keep: int = 0) -> None:
        """A new sequence in `row` that begins with its first `keep` positions' tokens (`prefill` the rest)."""
        if keep > self.verified[row]:
            raise ValueError(f"row {row} holds {self.verified[row]} verified positions, not {keep}")
        if self.complete_rows:
            self.complete([row])
        self.inner.reset(row, keep)
        del self.tokens[row][keep:]
        self.active.discard(row)

    def length(self, row: int) -> int:
        return self.verified[row]

    def crop(self, row: int, length: int) -> None:
        """The row's verified positions after a verification (the tokens decoded beyond stay: they are the
        verifier's greedy ones, the next chains' to read)."""
        if not self.prompt[row] <= length < len(self.tokens[row]):
            raise ValueError(f"cannot crop row {row} to {length}")
        self.verified[row] = length
        drop = length - self.first_state[row]  # the next chain's states start at position `length`
        if drop > 0:
            del self.states[row][:drop]
            self.first_state[row] += drop

    def _complete(self, row: int) -> bool:
        end = self.end[row]
        return end is not None and len(self.tokens[row]) - self.prompt[row] > end + self.k

    def complete(self, rows: Collection[int] | None = None) -> None:
        """Decode the active `rows` (all: None) through their end and k on: what any drafter's chains could read
        (`greedy_trace.TraceRecorder` keeps it)."""
        while todo := [r for r in (self.active if rows is None else rows)
                       if r in self.active and not self._complete(r)]:
            self._advance(todo)

    def _note_end(self, row: int) -> None:
        out = len(self.tokens[row]) - self.prompt[row]
        if self.end[row] is None and (self.tokens[row][-1] in self.stop_ids or out >= self.max_new_tokens):
            self.end[row] = out - 1

    @torch.no_grad()
    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        """Each row's prompt after the positions `reset` kept: its first greedy token and those positions' states."""
        verdicts = self.inner.prefill(prompts)
        for r, v in verdicts.items():
            self.tokens[r] += [*prompts[r], v.best[0]]
            self.prompt[r] = self.verified[r] = len(self.tokens[r]) - 1
            self.states[r], self.first_state[r], self.end[r] = [], self.prompt[r], None
            self.active.add(r)
            self._note_end(r)
        return verdicts

    def _advance(self, needed: Collection[int]) -> None:
        """One forward: the next greedy token of every active row short of its end + k, and of `needed`."""
        rows = {r for r in self.active if not self._complete(r)} | set(needed)
        verdicts = self.inner.verify({r: self.tokens[r][-1:] for r in rows})
        self.forwards += 1
        for r, v in verdicts.items():
            self.tokens[r].append(v.best[0])
            if v.states is not None:
                self.states[r].append(v.states)
            self._note_end(r)

    def _walk(self, row: int, chain: Sequence[int]) -> int | None:
        """How many drafts of `chain` the decoded tokens accept, or None where the walk reads past them."""
        tokens, at = self.tokens[row], self.verified[row] + 1
        a = 0
        while True:
            if at + a >= len(tokens):
                return None
            if a + 1 >= len(chain) or chain[a + 1] != tokens[at + a]:
                return a
            a += 1

    @torch.no_grad()
    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        """The verdicts of the chains the tokens decoded so far answer, after one forward where none could be
        answered before it (as many as it takes: a chain may read several tokens on). A chain left unanswered is
        the caller's to bring again; so rows that have run ahead are verified on without waiting for the others,
        finish, and give their rows to new turns, and every forward moves on all rows short of their end."""
        for r, chain in chains.items():
            if r not in self.active or not chain or chain[0] != self.tokens[r][self.verified[r]]:
                raise ValueError(f"row {r}: the chain does not follow the row's verified tokens")
        while not (answered := {r: a for r, chain in chains.items() if (a := self._walk(r, chain)) is not None}):
            self._advance(list(chains))
        out = {}
        for r, a in answered.items():
            at = self.verified[r]  # the chain's first position
            states = None
            if self.aux_layers is not None:
                first = at - self.first_state[r]
                states = torch.cat(self.states[r][first:first + a + 1])
            out[r] = Verification(self.tokens[r][at + 1:at + a + 2], states)
        return out


class BatchDrafter(Protocol):
    """What proposes the chains of several rows at once (`speculative_decode_batch`)."""

    @property
    def aux_layers(self) -> tuple[int, ...] | None: ...

    def start(self, row: int, keep: int = 0) -> int:
        """A new sequence in `row` whose first `keep` positions are its last sequence's (the same tokens through
        position `keep`, so the same verifier states before it): how many of them the drafter keeps what it drew from
        (≤ keep; its first states then start there: the verifier keeps as many)."""
        ...

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        """Up to k drafts per row, each row's (verified ids, new states) as `Drafter.propose` reads them."""
        ...


class PerRow:
    """Any `Drafter` as a `BatchDrafter`: one drafter per row, made by `make` (ngram, EAGLE-3, tests' drafters),
    each proposing for its own row."""

    def __init__(self, make: Callable[[int], Drafter], rows: int):
        self.drafters = [make(r) for r in range(rows)]
        layers = {d.aux_layers for d in self.drafters}
        if len(layers) != 1:
            raise ValueError(f"the rows' drafters read different verifier layers: {layers}")
        self.aux_layers = layers.pop()

    def start(self, row: int, keep: int = 0) -> int:
        """The row's drafter starts over: a drafter reading states then needs them all (keeps none)."""
        self.drafters[row].start()
        return keep if self.aux_layers is None else 0

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        return {r: [int(t) for t in self.drafters[r].propose(ids, states, k)] for r, (ids, states) in rows.items()}


class BatchModelDrafter:
    """`ModelDrafter` for several rows: a causal LM drafting greedily from the ids, its k steps batched over the
    rows (`BatchVerifier` over the drafter's model), each row's cache kept up to what it shares with the new ids."""

    aux_layers = None

    def __init__(self, model: Any, rows: int):
        self.lm = BatchVerifier(model, rows)
        self.cached: list[list[int]] = [[] for _ in range(rows)]

    def start(self, row: int, keep: int = 0) -> int:
        """Its cache kept (each proposal keeps what the row's cache shares with the ids)."""
        return keep

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        feed = {}
        for r, (ids, _) in rows.items():
            keep = 0
            for a, b in zip(self.cached[r], ids[:-1]):  # at least the last id is fed again, for its logits
                if a != b:
                    break
                keep += 1
            self.lm.crop(r, keep)
            feed[r] = list(ids[keep:])
            self.cached[r] = list(ids)
        drafts: dict[int, list[int]] = {r: [] for r in rows}
        while feed:
            out = self.lm.forward(feed, last_only=True)
            feed = {}
            for r, o in out.items():
                drafts[r].append(int(o.logits[-1].argmax()))
                if len(drafts[r]) < k:
                    feed[r] = drafts[r][-1:]
                    self.cached[r].append(drafts[r][-1])
        return drafts


class NoDrafts:
    """Proposes nothing: `speculative_decode_batch` with it is plain greedy decoding on the batched verifier, one
    token per forward (the reference the batched decode must reproduce)."""

    aux_layers = None

    def start(self, row: int, keep: int = 0) -> int:
        return keep

    def propose(self, rows: Mapping[int, tuple[Sequence[int], torch.Tensor | None]], k: int) -> dict[int, list[int]]:
        return {r: [] for r in rows}


class TurnFeed(Protocol):
    """Where `speculative_decode_batch` takes its turns from and gives them back: a turn may become ready only when
    another has finished (a question's second turn on its first answer)."""

    def next_turn(self) -> tuple[Hashable, Sequence[int]] | None:
        """A ready turn (its key and prompt ids), or None when none is ready now."""

    def finished(self, key: Hashable, decoded: Decoded) -> None:
        """The turn `key` decoded."""


@dataclass
class _Row:
    key: Hashable
    ids: list[int]
    decoded: Decoded
    states: torch.Tensor | None = None


def speculative_decode_batch(verifier: BatchVerifier | GreedyVerifier, drafter: BatchDrafter, feed: TurnFeed, *,
                             k: int, max_new_tokens: int, stop_ids: Collection[int] = ()) -> None:
    """Greedy speculative decoding of every turn `feed` gives, up to `verifier.rows` at once: each row as
    `speculative_decode` decodes one turn (its own drafts, acceptance and crop; τ counted the same way), the rows'
    chains verified together (`BatchVerifier`: one batched verifying forward; `GreedyVerifier`: against the
    verifier's greedy decode run ahead); a finished row takes the next ready turn (its prefill a forward of its
    own). Returns when no row is busy and no turn is ready."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if max_new_tokens < 1:
        raise ValueError("needs max_new_tokens >= 1")
    if drafter.aux_layers is not None and tuple(drafter.aux_layers) != verifier.aux_layers:
        raise ValueError(f"the drafter reads the verifier's layers {drafter.aux_layers}, the verifier gives "
                         f"{verifier.aux_layers}")
    busy: dict[int, _Row] = {}
    held: dict[int, list[int]] = {}  # a free row's last ids: what its verifier and drafter hold
    drafts: dict[int, list[int]] = {}  # chains proposed and not yet verified

    def finish(r: int) -> None:
        row = busy.pop(r)
        held[r] = row.ids
        feed.finished(row.key, row.decoded)

    while True:
        fresh: dict[int, list[int]] = {}
        free = [r for r in range(verifier.rows) if r not in busy]
        while free:
            turn = feed.next_turn()
            if turn is None:
                break
            key, prompt = turn[0], [int(t) for t in turn[1]]
            if not prompt:
                raise ValueError(f"turn {key!r}: needs a prompt")
            # the free row whose last ids share the longest prefix with the prompt (a question's next turn: its
            # earlier turns): its positions before the last shared token are kept, the rest prefilled
            shared = {r: common_prefix(held.get(r, ()), prompt) for r in free}
            r = max(free, key=lambda r: (shared[r], -r))
            free.remove(r)
            keep = drafter.start(r, max(shared[r] - 1, 0))
            verifier.reset(r, keep)
            fresh[r] = prompt[keep:]
            busy[r] = _Row(key, list(prompt), Decoded(len(prompt), [], k=k))
        if fresh:
            for r, v in verifier.prefill(fresh).items():
                row = busy[r]
                token = v.best[0]
                row.ids.append(token)
                row.decoded.output_ids.append(token)
                row.states = v.states
                if turn_ends(token, row.decoded.output_ids, stop_ids, max_new_tokens):
                    finish(r)
            continue  # refill what finished at its first token before verifying
        if not busy:
            return
        waiting = {r: (row.ids, row.states) for r, row in busy.items() if r not in drafts}
        if waiting:
            for r, d in drafter.propose(waiting, k).items():
                if len(d) > k:
                    raise ValueError(f"the drafter proposed {len(d)} tokens, more than k = {k}")
                drafts[r] = d
        # a verifier may answer some chains only (`GreedyVerifier`): the others wait, drafted, for the next round
        verdicts = verifier.verify({r: [row.ids[-1], *drafts[r]] for r, row in busy.items()})
        if not verdicts:
            raise RuntimeError("the verifier answered none of the chains")
        for r, v in verdicts.items():
            row, chain = busy[r], drafts.pop(r)
            a = len(v.best) - 1  # best[:a] are the accepted drafts (chain[:a]), best[a] the bonus
            if v.best[:a] != chain[:a] or (a < len(chain) and chain[a] == v.best[a]):
                raise RuntimeError(f"row {r}: the verifier's verdict {v.best} does not fit the drafts {chain}")
            row.decoded.accepted.append(a)
            row.decoded.drafted.append(len(chain))
            verifier.crop(r, len(row.ids) + a)
            row.states = v.states[:a + 1] if v.states is not None else None
            for token in v.best:
                row.ids.append(token)
                row.decoded.output_ids.append(token)
                if turn_ends(token, row.decoded.output_ids, stop_ids, max_new_tokens):
                    finish(r)
                    break


@dataclass
class PromptFeed:
    """A fixed list of prompts as a `TurnFeed` (key: the prompt's index); `results()` once decoded."""

    prompts: Sequence[Sequence[int]]
    decoded: dict[int, Decoded] = field(default_factory=dict)
    given: int = 0

    def next_turn(self) -> tuple[Hashable, Sequence[int]] | None:
        if self.given == len(self.prompts):
            return None
        self.given += 1
        return self.given - 1, self.prompts[self.given - 1]

    def finished(self, key: Hashable, decoded: Decoded) -> None:
        self.decoded[int(key)] = decoded  # type: ignore[call-overload]

    def results(self) -> list[Decoded]:
        return [self.decoded[i] for i in range(len(self.prompts))]
