"""Records as generation writes them, built from tiny texts (hidden-state, interop and notebook tests), and a
dataset folder's records read back turn by turn."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from eagledata.generation.conversations.turns import pauses
from eagledata.records import Record, ToolCall, load_records
from eagledata.text import IM_END
from eagledata.text.roundtrip import Case
from eagledata.text.sequences import output_ids, prompt_ids


def make_record(tok, i, *, words=3, finish="stop", prompt=None, dataset="B1"):
    messages = [{"role": "user", "content": prompt or f"question {i}: " + "why " * (i % 5)}]
    reasoning, content = "think " * words, f"answer {i} " + "so " * (words // 2)
    return Record(id=f"r{i}", dataset=dataset, messages=messages, reasoning=reasoning, content=content,
                  finish_reason=finish,
                  prompt_ids=prompt_ids(tok, messages), output_ids=output_ids(tok, reasoning, content, finish))


def make_conversation(tok, cid, asks, *, dataset="B1", system=None, answers=None, words=4):
    """One record per turn, as generation writes them: turn j's `messages` are the asks 1..j with this
    conversation's own earlier answers (content only) between them, its `prompt_ids` their render, its
    `output_ids` turn j's answer; turn 1 keeps the prompt's id, turn j >= 2 is `<cid>#<j>`."""
    history = [{"role": "system", "content": system}] if system else []
    records = []
    for j, ask in enumerate(asks, 1):
        messages = [*history, {"role": "user", "content": ask}]
        reasoning = f"turn {j} of {cid}: " + "think " * (words + 3 * j)
        content = answers[j - 1] if answers else f"answer {j} of {cid}: " + "so " * (words + 5 * j)
        records.append(Record(id=cid if j == 1 else f"{cid}#{j}", dataset=dataset, conversation_id=cid, turn=j,
                              messages=messages, reasoning=reasoning, content=content, finish_reason="stop",
                              prompt_ids=prompt_ids(tok, messages),
                              output_ids=output_ids(tok, reasoning, content, "stop")))
        history = [*messages, {"role": "assistant", "content": content}]
    return records


def tool_record(tok, case: Case, rid: str | None = None, section: tuple[ToolCall, ...] | None = None) -> Record:
    """A record of a tool case; `section`: the calls its output ids were built with (a planted wrong section)."""
    calls = case.tool_calls if section is None else section
    return Record(id=rid or case.id, dataset="T", messages=case.messages, reasoning=case.reasoning,
                  content=case.content, finish_reason=case.finish_reason, tools=case.tools,
                  tool_calls=[c.to_api() for c in case.tool_calls] or None,
                  prompt_ids=prompt_ids(tok, case.messages, tools=case.tools),
                  output_ids=output_ids(tok, case.reasoning, case.content, case.finish_reason, tool_calls=calls))


def recorded_turns(d: Path) -> tuple[list[Record], list[dict], dict[str, dict[int, Record]]]:
    """A dataset folder's records and failures, each turn once (a turn written twice fails here), and the answers
    by conversation and turn (pause samples, the prefixes a Ctrl-C cut, aside: their turns were asked again)."""
    records = load_records(d / "records.jsonl")
    failures = [json.loads(line) for line in (d / "failures.jsonl").read_text().splitlines() if line.strip()]
    ids = [r.id for r in records] + [f["id"] for f in failures]
    assert len(ids) == len(set(ids)), "an id written twice"
    by_conv: dict[str, dict[int, Record]] = {}
    for r in records:
        if pauses(r.meta):
            continue
        assert r.turn not in by_conv.get(r.conversation_id, {}), f"turn {r.turn} of {r.conversation_id} answered twice"
        by_conv.setdefault(r.conversation_id, {})[r.turn] = r
    return records, failures, by_conv


def answers_and_pauses(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """A records file's answers, and its pause samples (the prefixes a Ctrl-C or a kill cut, `<turn id>~n`, their
    turns asked again): each pause sample a cut one, under an id made of an answer's or a failure's id, never twice."""
    answers = [r for r in records if not pauses(r.meta)]
    paused = [r for r in records if pauses(r.meta)]
    assert len({r.id for r in paused}) == len(paused), "a pause sample written twice"
    for r in paused:
        turn, _, n = r.id.rpartition("~")
        assert turn and n.isdigit() and r.finish_reason == "cut", r.id
    return answers, paused


def check_cut_prefixes(emu, records: list[Record]) -> None:
    """Each cut sample is the prefix of the answer the emulator was generating: exact ids, no end."""
    assert records
    for r in records:
        truth = emu.ground_truth(r.generation_id)  # cancelled (billed until then), or closed after its last token
        assert r.output_ids[-1] != IM_END and r.finish_reason == "cut"
        assert r.output_ids == truth["output_ids"][:len(r.output_ids)], r.id
        assert 0 < len(r.output_ids) < len(truth["output_ids"])


def journaled_text(journal: Path, flushes: int = 1) -> set[str]:
    """The streams whose delivered text a dataset's `streams.jsonl` holds, from at least `flushes` of its flushes
    (one a second): streams that have delivered text, as the engine saw it."""
    if not journal.exists():
        return set()
    lines = Counter(json.loads(line)["text"] for line in journal.read_text().splitlines()
                    if line.endswith("}") and '"text"' in line)
    return {gid for gid, n in lines.items() if n >= flushes}
