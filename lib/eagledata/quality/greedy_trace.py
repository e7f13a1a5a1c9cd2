"""The verifier's greedy decode of an evaluation set, recorded once and replayed for every drafter.

Greedy verification reads only the verifier's greedy sequence (`batched.GreedyVerifier`): every drafter measured
on the same questions with the same k and answer cap reads the same tokens and the same aux states. So the experiment
decodes that sequence once (`TraceRecorder`, under `GreedyVerifier`: each turn's prompt, its greedy tokens through its
end and k on, and the aux states of every position) and measures each drafter against it (`TraceReplay`: the same
seam as `BatchVerifier`, answered from the trace, no forward): four drafters for the verifier's cost of one, and every
drafter reads the very same states (no float difference between their runs).

Torch only, as `speculative.py`: the trace is written in the project's environment and read in the speculators one.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .batch_verifier import BatchVerifier, Verification

FORMAT = "eagledata-greedy-trace/1"


@dataclass
class TraceEntry:
    """One turn: its prompt (the first `prompt` tokens), then the verifier's greedy tokens through its end and k on;
    `states`: the aux states at every position but the last ([len(tokens) − 1, S]; None without aux layers)."""

    tokens: list[int]
    prompt: int
    states: torch.Tensor | None


@dataclass
class GreedyTrace:
    """Every turn of a decode, by its prompt, with what it was decoded under (k, the cap, the layers, the stops)."""

    k: int
    max_new_tokens: int
    aux_layers: tuple[int, ...] | None
    stop_ids: list[int]
    verifier: str = ""
    entries: dict[tuple[int, ...], TraceEntry] = field(default_factory=dict)

    def add(self, entry: TraceEntry) -> None:
        self.entries[tuple(entry.tokens[:entry.prompt])] = entry

    def lookup(self, prompt: Sequence[int]) -> TraceEntry:
        entry = self.entries.get(tuple(prompt))
        if entry is None:
            raise ValueError(f"the greedy trace holds no turn with this prompt ({len(prompt)} tokens): it was "
                             f"recorded on other questions, another verifier or chat template; record it again")
        return entry

    def check(self, *, k: int, max_new_tokens: int) -> None:
        """A drafter measured with another k or cap would read past what was recorded, or count otherwise."""
        if (k, max_new_tokens) != (self.k, self.max_new_tokens):
            raise ValueError(f"the greedy trace was recorded with k {self.k}, max_new_tokens {self.max_new_tokens}; "
                             f"this measurement asks k {k}, max_new_tokens {max_new_tokens}")

    def save(self, path: str | Path) -> None:
        """One torch file, written whole under a temporary name, then renamed (a stopped write leaves none)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"format": FORMAT, "k": self.k, "max_new_tokens": self.max_new_tokens,
                    "aux_layers": list(self.aux_layers) if self.aux_layers is not None else None,
                    "stop_ids": sorted(self.stop_ids), "verifier": self.verifier,
                    "entries": [{"tokens": e.tokens, "prompt": e.prompt, "states": e.states}
                                for e in self.entries.values()]}, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> GreedyTrace:
        doc = torch.load(path, weights_only=True)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"{path}: not a greedy trace ({FORMAT})")
        layers = doc["aux_layers"]
        trace = cls(doc["k"], doc["max_new_tokens"], tuple(layers) if layers is not None else None,
                    list(doc["stop_ids"]), doc["verifier"])
        for e in doc["entries"]:
            trace.add(TraceEntry(list(e["tokens"]), int(e["prompt"]), e["states"]))
        return trace


class TraceRecorder:
    """A `BatchVerifier` whose rows' sequences are kept: each sequence becomes a `TraceEntry` when its row is reset
    for another (or at `close`). Under `GreedyVerifier(..., complete_rows=True)`, which decodes every row through its
    end and k on before it is reset, each entry is whole."""

    def __init__(self, inner: BatchVerifier):
        self.inner = inner
        self.rows, self.aux_layers = inner.rows, inner.aux_layers
        self.fed: list[list[int]] = [[] for _ in range(self.rows)]  # the tokens each row's states were taken at
        self.states: list[list[torch.Tensor]] = [[] for _ in range(self.rows)]
        self.last: list[int | None] = [None] * self.rows  # the row's newest greedy token
        self.prompt = [0] * self.rows
        self.entries: list[TraceEntry] = []

    def _close(self, row: int) -> None:
        last = self.last[row]
        if last is not None:
            states = torch.cat(self.states[row]) if self.aux_layers is not None else None
            self.entries.append(TraceEntry([*self.fed[row], last], self.prompt[row], states))
            self.states[row] = [states] if states is not None else []
        self.last[row] = None

    def reset(self, row: int, keep: int = 0) -> None:
        self._close(row)
        self.inner.reset(row, keep)
        del self.fed[row][keep:]
        if self.states[row]:  # one tensor since `_close`: the kept positions, a view (the next entry's cat copies)
            self.states[row] = [self.states[row][0][:keep]]

    def _record(self, fed: Mapping[int, Sequence[int]], verdicts: dict[int, Verification]) -> None:
        for r, v in verdicts.items():
            self.fed[r] += fed[r]
            self.last[r] = v.best[0]
            if v.states is not None:
                self.states[r].append(v.states)

    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        verdicts = self.inner.prefill(prompts)
        self._record(prompts, verdicts)
        for r in prompts:
            self.prompt[r] = len(self.fed[r])
        return verdicts

    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        if any(len(chain) != 1 for chain in chains.values()):
            raise ValueError("a trace records one greedy token a forward (GreedyVerifier's steps)")
        verdicts = self.inner.verify(chains)
        self._record(chains, verdicts)
        return verdicts

    def trace(self, *, k: int, max_new_tokens: int, stop_ids: Sequence[int], verifier: str = "") -> GreedyTrace:
        """Every row's sequences so far (the rows' last ones closed)."""
        for r in range(self.rows):
            self._close(r)
        out = GreedyTrace(k, max_new_tokens, self.aux_layers, list(stop_ids), verifier)
        for entry in self.entries:
            out.add(entry)
        return out


class TraceReplay:
    """`BatchVerifier`'s seam as `GreedyVerifier` uses it (`reset`, `prefill`, one-token `verify`), answered from a
    `GreedyTrace`: each row's prompt looked up, then its greedy tokens and states read in order. A token fed that is
    not the trace's, or a read past its end, is an error: the trace was recorded otherwise."""

    def __init__(self, trace: GreedyTrace, rows: int):
        self.trace, self.rows, self.aux_layers = trace, rows, trace.aux_layers
        self.ids: list[list[int]] = [[] for _ in range(rows)]  # the tokens fed so far
        self.entry: list[TraceEntry | None] = [None] * rows
        self.forwards = 0

    def reset(self, row: int, keep: int = 0) -> None:
        del self.ids[row][keep:]
        self.entry[row] = None

    def _states(self, entry: TraceEntry, start: int, stop: int) -> torch.Tensor | None:
        return entry.states[start:stop] if entry.states is not None else None

    def prefill(self, prompts: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        out = {}
        for r, prompt in prompts.items():
            start = len(self.ids[r])
            self.ids[r] += [int(t) for t in prompt]
            entry = self.entry[r] = self.trace.lookup(self.ids[r])
            out[r] = Verification([entry.tokens[len(self.ids[r])]], self._states(entry, start, len(self.ids[r])))
        return out

    def verify(self, chains: Mapping[int, Sequence[int]]) -> dict[int, Verification]:
        out = {}
        self.forwards += 1
        for r, chain in chains.items():
            entry, at = self.entry[r], len(self.ids[r])
            if entry is None or len(chain) != 1 or at + 1 >= len(entry.tokens) or entry.tokens[at] != chain[0]:
                raise ValueError(f"row {r}: the greedy trace does not hold this step (position {at}): recorded with "
                                 f"a smaller k or answer cap, or on another verifier")
            self.ids[r].append(int(chain[0]))
            out[r] = Verification([entry.tokens[at + 1]], self._states(entry, at, at + 1))
        return out

