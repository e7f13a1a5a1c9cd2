"""A model family's structural ids: the special tokens the output-id recipe places by the answer's structure, never by
tokenizing text (docs/FORMATS.md#output-ids-and-loss-mask).

Each tokenizer carries one `Structure`, so the recipe (`sequences.output_ids`), its inverse and the round-trip checks
serve every family: K2.5 closes its reasoning with `</think>` and has a tool-call section; SmolLM2 (ChatML) has only
an end of turn. A family without a reasoning section gets no `</think>`, and reasoning text for it is an error.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolSection:
    """The tool-call section's ids, K2.5's layout: `begin` + per call `call_begin` ID `argument_begin` ARGS `call_end`
    + `end` (docs/FORMATS.md#tool-calls)."""

    begin: int
    end: int
    call_begin: int
    argument_begin: int
    call_end: int

    @property
    def ids(self) -> frozenset[int]:
        return frozenset((self.begin, self.end, self.call_begin, self.argument_begin, self.call_end))


@dataclass(frozen=True)
class Structure:
    """`end_of_turn` ends every answer that was not cut; `end_of_reasoning` (None: the family does not reason) closes
    the reasoning before the content; `tool_calls` (None: no tool-call section) follows the content."""

    end_of_turn: int
    end_of_reasoning: int | None = None
    tool_calls: ToolSection | None = None

    @property
    def reasons(self) -> bool:
        return self.end_of_reasoning is not None
