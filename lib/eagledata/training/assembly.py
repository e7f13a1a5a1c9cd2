"""One training set from several datasets' records: dedupe, truncation and length policy (the trainers' exports
of it: `exports.py`).

A sample is what the drafter trains on: `input_ids = prompt_ids + output_ids`, `loss_mask` 0 over
the prompt and 1 over what the model produced. Policies are pure functions over records so that
the stats table says exactly why each record was left out.

Generation judges each provider's answers while it runs and writes a verdict per provider into the dataset's
`summary.json` (`fidelity.providers.<provider>.verdict`, `consistent` or `suspect`, with its evidence). A
provider called `suspect` there served text the model did not generate (reasoning served wrongly, leaked
spaces: its ids are not the model's), so by default its records are left out of the set: of every dataset
assembled, not only the one whose summary called it so, since the verdict is about the endpoint, not about one
dataset's prompts. `AssemblyPolicy.keep_suspect_providers` keeps them. Either way `Assembly.provenance()` says which
providers, how many records and why, and the hidden-states manifest records it under `assembly`. A summary
without `fidelity` (an older run), or no summary at all, leaves nothing out.

Several records may answer one prompt (two datasets from one prompt file, a prompt asked again): dedupe keeps one,
the first, except that an answer the model finished always wins over one it never ended (`finish_reason` "cut": the
run closed the stream at a target or on Ctrl-C and kept the prefix; "length": max_tokens), whichever came first
(`supersedes`; issue 53: nine ~280-token cut stubs of an earlier dataset had kept finished answers out). The stats
count the unfinished ones so left out as `replaced_by_finished` and `Assembly.replaced` lists them.

A record is one generated assistant turn, so a sample is one turn: a multi-turn conversation gives a sample per
turn, turn j's history (its own earlier answers, reasoning dropped by the chat template) as context with loss 0
and turn j's answer with loss 1. Later turns re-read their history, so extraction reads more tokens than it
supervises: `Assembly.extraction_cost()` says how many, overall and per dataset. The history drops the earlier
answers' reasoning, so no single sequence holds every turn as generated: one sample per turn is the only exact
form (the speculators data tools write the same).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError
from ..paths import OUTPUT_DIR, DatasetFiles, records_file
from ..records import CUT, CUT_FINISHES, Record, common_prefix, iter_records
from ..settings import Settings, setting
from ..summaries import fidelity_suspects, read_summary
from ..text import Tokenizer, prompt_ids
from ..text.tokenizer import VOCAB_SIZE

Overlong = Literal["drop", "truncate"]


@dataclass(frozen=True)
class Sample:
    """One training sequence, with where it came from (for error messages and stats)."""

    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool  # the model never ended it: cut by max_tokens ("length") or by the run ("cut")
    shortened: bool = False  # shortened after reading: the max-length policy truncated it, or quality equalized it
    provider: str = ""  # who served the record (the fidelity audit's groups); not part of the digest
    sampling: str = ""  # the record's sampling settings as canonical JSON ("" when the record does not say)
    conversation_id: str = ""  # the record's conversation ("" when not known, e.g. a set read back from its index)
    turn: int = 1  # the user turn this sample answers (1-based); not part of the digest

    def __len__(self) -> int:
        return len(self.input_ids)

    def digest(self) -> str:
        """Identity of the ids and mask: resume refuses stored states made from other ids."""
        return self._digest

    @cached_property
    def _digest(self) -> str:  # asked for by the writer, the resume check and the set's hash: computed once
        return sequence_digest(self.input_ids, self.loss_mask)

    def to_speculators(self) -> dict[str, Any]:
        """A line of the token export: speculators' fields, then where the sample came from (`read_samples`
        gives it back, so an extraction from the export keeps the audit's providers)."""
        return {"id": self.id, "input_ids": self.input_ids, "loss_mask": self.loss_mask, "seq_len": len(self),
                "dataset": self.dataset, "provider": self.provider, "sampling": self.sampling,
                "conversation_id": self.conversation_id or self.id, "turn": self.turn}


def sampling_key(record: Record) -> str:
    """A record's sampling settings (`meta.sampling`, written by generation) as canonical JSON."""
    sampling = record.meta.get("sampling")
    return json.dumps(sampling, sort_keys=True, separators=(",", ":")) if sampling is not None else ""


def sequence_digest(input_ids: Sequence[int], loss_mask: Sequence[int]) -> str:
    h = hashlib.sha256(json.dumps([list(input_ids), list(loss_mask)], separators=(",", ":")).encode())
    return h.hexdigest()[:16]


def samples_hash(samples: Iterable[Sample], digests: Sequence[str] | None = None) -> str:
    """Hash of a whole set (ids, masks, order): recorded in the hidden-states manifest. `digests`: the samples'
    digests when already known (a set's index parts carry them: no need to hash every id again)."""
    h = hashlib.sha256()
    for i, s in enumerate(samples):
        h.update(f"{s.id}\0{digests[i] if digests else s.digest()}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True)
class AssemblyPolicy(Settings):
    keep_truncated: bool = setting(True, "keep answers the model never ended (still its tokens): length (cut by "
                                         "max_tokens) and cut (the run closed the stream at a target or on Ctrl-C)")
    min_cut_tokens: int = setting(0, "leave out cut answers (the run closed the stream) of fewer output tokens; "
                                     "0 keeps them all")
    max_length: int | None = setting(None, "longest sample in tokens; None -> no limit")
    overlong: Overlong = setting("drop", "samples longer than max_length: drop or truncate")
    dedupe_prompts: bool = setting(True, "keep one record of an identical prompt: the first, but a finished answer "
                                         "replaces an earlier unfinished one (turns of one conversation are never "
                                         "merged)")
    keep_suspect_providers: bool = setting(False, "keep the records of providers that generation's summary.json "
                                                  "calls suspect (fidelity); False: leave them out, the manifest "
                                                  "says which, how many and why")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_cut_tokens < 0:
            raise InputError(f"must be 0 or more, got {self.min_cut_tokens}", field="min_cut_tokens")


@dataclass(frozen=True)
class SuspectProvider:
    """A provider that generation called suspect: where it was said, why, and its records in this assembly."""

    provider: str
    evidence: dict[str, str]  # summary.json path -> the verdict's evidence there
    records: int = 0  # its records among those read
    by_dataset: dict[str, int] = field(default_factory=dict)

    def to_publish(self) -> dict[str, Any]:
        return {"records": self.records, "by_dataset": dict(sorted(self.by_dataset.items())),
                "evidence": dict(self.evidence)}


def read_generation_suspects(records: Path) -> dict[str, str]:
    """{provider: evidence} of the providers the summary.json beside a records file calls suspect
    (`summaries.fidelity_suspects`); {} when there is none."""
    path = DatasetFiles(records.parent).summary
    if not path.is_file():
        return {}
    return {provider: why or "(no evidence given)"
            for provider, why in fidelity_suspects(read_summary(path), path).items()}


def per_loss_token(tokens: int, loss_tokens: int) -> float | None:
    """Tokens read per supervised token; None when nothing is supervised."""
    return tokens / loss_tokens if loss_tokens else None


def extraction_cost(samples: Iterable[Sample]) -> dict[str, Any]:
    """What extracting a set costs against what it trains (pure): `tokens` the verifier reads (every sample's whole
    sequence), `loss_tokens` the drafter is trained on (loss mask 1), their ratio, overall and per dataset. A later
    turn re-reads its history, so the ratio grows with the turns per conversation and the length of the answers.
    How much of that is a repeat: `reread_tokens`, the ids a later turn shares from its start with its previous
    turn's sample (a causal verifier's states over them are that sample's again: what a prefix cache or one
    extraction per conversation would not compute twice), and `whole_prefix_turns`, the later turns that hold
    their previous turn's sample whole (its states a slice of theirs; never where the chat template drops an
    earlier answer's reasoning from the history, as Kimi's does)."""
    samples = list(samples)
    by_turn = {(s.dataset, s.conversation_id, s.turn): s for s in samples if s.conversation_id}
    rows: dict[str, dict[str, Any]] = {}
    conversations: dict[str, set[str]] = {}
    for s in samples:
        row = rows.setdefault(s.dataset, {"samples": 0, "later_turns": 0, "tokens": 0, "loss_tokens": 0,
                                          "reread_tokens": 0, "whole_prefix_turns": 0})
        row["samples"] += 1
        row["later_turns"] += s.turn > 1
        row["tokens"] += len(s)
        row["loss_tokens"] += sum(s.loss_mask)
        previous = by_turn.get((s.dataset, s.conversation_id, s.turn - 1)) if s.conversation_id else None
        if previous is not None:
            shared = common_prefix(previous.input_ids, s.input_ids)
            row["reread_tokens"] += shared
            row["whole_prefix_turns"] += shared == len(previous)
        conversations.setdefault(s.dataset, set()).add(s.conversation_id or s.id)
    for name, row in rows.items():
        row["conversations"] = len(conversations[name])
        row["tokens_per_loss_token"] = per_loss_token(row["tokens"], row["loss_tokens"])
    total = {k: sum(r[k] for r in rows.values()) for k in ("samples", "conversations", "later_turns", "tokens",
                                                           "loss_tokens", "reread_tokens", "whole_prefix_turns")}
    return {**total, "tokens_per_loss_token": per_loss_token(total["tokens"], total["loss_tokens"]),
            "by_dataset": {name: rows[name] for name in sorted(rows)}}


@dataclass(frozen=True)
class Located:
    """A record and the file line it came from, so any later error can name file:line."""

    record: Record
    path: Path
    line: int


@dataclass(frozen=True)
class Replacement:
    """An unfinished answer left out because a later record answers the same prompt to its end (`supersedes`)."""

    left_out: str  # the unfinished record's id
    dataset: str
    finish_reason: str  # "cut" or "length"
    output_tokens: int  # its output ids
    kept: str  # the finished record's id
    kept_dataset: str


@dataclass
class Assembly:
    samples: list[Sample]
    records: list[Record]  # the kept records, in sample order (SpecForge export needs the text)
    dropped: Counter  # reason -> count
    sources: dict[str, str]  # records file -> sha256
    read: int = 0
    suspects: dict[str, SuspectProvider] = field(default_factory=dict)  # generation's suspects, by provider
    kept_suspects: bool = False  # their records were kept (AssemblyPolicy.keep_suspect_providers)
    replaced: list[Replacement] = field(default_factory=list)  # counted in `dropped` as replaced_by_finished

    def replacements_table(self) -> list[dict[str, Any]]:
        """One row per unfinished answer a later finished one replaced (the notebook shows them)."""
        return [{"left_out": r.left_out, "dataset": r.dataset, "finish_reason": r.finish_reason,
                 "output_tokens": r.output_tokens, "kept": r.kept, "kept_dataset": r.kept_dataset}
                for r in self.replaced]

    def provenance(self) -> dict[str, Any]:
        """What the hidden-states manifest records under `assembly` and the notebook publishes: the providers
        generation called suspect, their records (left out, or kept by the setting) and the evidence; and what
        extracting the set costs against what it trains (`extraction_cost`)."""
        doc = {p: s.to_publish() for p, s in sorted(self.suspects.items())}
        return {"left_out_providers": {} if self.kept_suspects else doc,
                "kept_suspect_providers": doc if self.kept_suspects else {},
                "extraction_cost": self.extraction_cost()}

    def extraction_cost(self) -> dict[str, Any]:
        """Tokens extracted against tokens supervised, overall and per dataset (`extraction_cost`)."""
        return extraction_cost(self.samples)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.samples)

    @property
    def num_loss_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.samples)

    def digest(self) -> str:
        return samples_hash(self.samples)

    def stats(self) -> dict[str, Any]:
        lengths = sorted(len(s) for s in self.samples)

        def pct(q: float) -> int:
            return lengths[min(len(lengths) - 1, int(q * len(lengths)))] if lengths else 0

        cost = self.extraction_cost()
        return {"records_read": self.read, "samples": len(self.samples),
                "conversations": cost["conversations"], "later_turns": cost["later_turns"],
                **{f"dropped_{k}": v for k, v in sorted(self.dropped.items())},
                "truncated_kept": sum(s.truncated for s in self.samples),
                "cut_to_max_length": sum(s.shortened for s in self.samples),  # the stat's name is published: kept
                "tokens": cost["tokens"], "loss_tokens": cost["loss_tokens"],
                "tokens_per_loss_token": cost["tokens_per_loss_token"], "reread_tokens": cost["reread_tokens"],
                "whole_prefix_turns": cost["whole_prefix_turns"],
                "length_p50": pct(0.5), "length_p90": pct(0.9), "length_p99": pct(0.99),
                "length_max": lengths[-1] if lengths else 0}

    def by_dataset(self) -> dict[str, dict[str, Any]]:
        """Per dataset: samples (turns), conversations, later turns, tokens extracted and supervised, their ratio."""
        return self.extraction_cost()["by_dataset"]


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_ids(located: Located, vocab_size: int = VOCAB_SIZE) -> None:
    """Ids outside the vocabulary cannot be run through the model: name the line and record."""
    r = located.record
    for name in ("prompt_ids", "output_ids"):
        bad = [i for i in getattr(r, name) if not 0 <= i < vocab_size]
        if bad:
            raise InputError(f"record {r.id!r}: token ids {bad[:5]} outside the vocabulary (0..{vocab_size - 1})",
                             located.path, located.line, name)


def check_tokenizer(located: Sequence[Located], tok: Tokenizer, sample: int = 64) -> None:
    """Records made with another tokenizer or template are refused before any compute.

    A fingerprint in `meta.tokenizer_fingerprint` must match; and for an evenly spread sample of
    records, the prompt ids must equal the chat-template render with this tokenizer.
    """
    for loc in located:
        fp = loc.record.meta.get("tokenizer_fingerprint")
        if fp is not None and fp != tok.fingerprint:
            raise InputError(f"record {loc.record.id!r} was made with another tokenizer (fingerprint {fp[:16]}, "
                             f"this one {tok.fingerprint[:16]})", loc.path, loc.line, "meta.tokenizer_fingerprint")
    step = max(1, len(located) // sample) if sample else 0
    for loc in located[::step] if step else []:
        r = loc.record
        if r.prompt_ids and prompt_ids(tok, r.messages, tools=r.tools) != r.prompt_ids:
            raise InputError(f"record {r.id!r}: prompt ids are not this tokenizer's render of its messages "
                             f"(made with another tokenizer or chat template?)", loc.path, loc.line, "prompt_ids")


TurnKey = tuple[str, str, int]  # (dataset, conversation_id, turn): prompt ids are unique within a prompt file only


def prompt_key(record: Record) -> bytes:
    """What `dedupe_prompts` compares: the exact prompt ids. A turn's prompt holds its whole history, so two
    records share a key only when everything the model saw before answering was the same."""
    return hashlib.sha256(json.dumps(record.prompt_ids).encode()).digest()


def turn_key(record: Record) -> TurnKey:
    return record.dataset, record.conversation_id, record.turn


def is_duplicate_prompt(record: Record, first_seen: dict[bytes, TurnKey]) -> bool:
    """The dedupe rule (pure): an earlier kept record of ANOTHER conversation, or of the same turn, has exactly this
    prompt.

    `first_seen`: prompt key -> the turn of the first kept record with it. Turns of one conversation are never
    duplicates of each other: each is a distinct training sample (turn j+1's prompt extends turn j's with its answer
    and the next ask, so their keys differ anyway; the rule says so rather than rely on it). One turn asked twice is
    (a pause sample, the prefix a Ctrl-C cut, and the answer the next run asked again for: `supersedes` then keeps the
    finished one). Identical prompts in different conversations (the same first ask in two datasets, a conversation
    repeated with the same answers) dedupe as one-turn prompts always did; a later turn whose history differs stays."""
    first = first_seen.get(prompt_key(record))
    return first is not None and (first[:2] != turn_key(record)[:2] or first[2] == record.turn)


def supersedes(record: Record, earlier: Record) -> bool:
    """The finished-over-unfinished rule (pure): `record` takes the place of `earlier`, a kept record it would
    duplicate, when both answer exactly the same prompt and only `record` was ended by the model. An unfinished
    answer (cut by the run, or by max_tokens) is a prefix; whichever dataset came first, the whole answer is the
    better sample (issue 53: cut stubs of an earlier dataset had kept finished answers out)."""
    return (record.finish_reason not in CUT_FINISHES and earlier.finish_reason in CUT_FINISHES
            and record.prompt_ids == earlier.prompt_ids)


def unfinished_reason(record: Record, policy: AssemblyPolicy) -> str | None:
    """Why the policy leaves an answer the model never ended out (pure): any, without `keep_truncated`; a `cut`
    one shorter than `min_cut_tokens`. None for a finished answer or one kept."""
    if record.finish_reason not in CUT_FINISHES:
        return None
    if not policy.keep_truncated:
        return "truncated"
    if record.finish_reason == CUT and len(record.output_ids) < policy.min_cut_tokens:
        return "cut_too_short"
    return None


def apply_length_policy(sample: Sample, policy: AssemblyPolicy) -> tuple[Sample | None, str | None]:
    """(sample or None, drop reason): the max-length rule alone, pure."""
    if policy.max_length is None or len(sample) <= policy.max_length:
        return sample, None
    if policy.overlong == "drop":
        return None, "too_long"
    n = policy.max_length
    if sum(sample.loss_mask[:n]) == 0:
        return None, "prompt_too_long"
    return replace(sample, input_ids=sample.input_ids[:n], loss_mask=sample.loss_mask[:n], shortened=True), None


def assemble(sources: Sequence[str | Path], *, output_dir: str | Path = OUTPUT_DIR,
             policy: AssemblyPolicy | None = None, tok: Tokenizer | None = None,
             vocab_size: int | None = None, tokenizer_sample: int = 64) -> Assembly:
    """Merge records files (dataset names or paths) into samples, in source then line order.

    Every record's ids are checked against `vocab_size` (None: the verifier's, `tok.vocab_size`; K2.5's without a
    tokenizer) and, with `tok`, a sample of prompts is re-rendered: bad input raises before anything is kept. Of
    records that duplicate each other (`is_duplicate_prompt`, or the same id) the first is kept, but a finished
    answer takes the place of the unfinished ones it duplicates (`supersedes`), at its own position, when it is kept
    itself (not too long, say). The records of a provider that any source's summary.json calls suspect are left out
    (`suspect_provider` in the stats) unless `policy.keep_suspect_providers`; `Assembly.suspects` says which, how
    many and why.
    """
    policy = policy or AssemblyPolicy()
    if isinstance(sources, (str, Path)):
        sources = [sources]
    if not sources:
        raise InputError("no datasets given", field="datasets")
    located: list[Located] = []
    hashes: dict[str, str] = {}
    evidence: dict[str, dict[str, str]] = {}  # suspect provider -> {summary.json: evidence}
    for source in sources:
        path = records_file(source, output_dir)
        if not path.is_file():
            raise InputError("no records file (dataset name or records.jsonl path)", path)
        hashes[str(path)] = _file_sha256(path)
        for provider, why in read_generation_suspects(path).items():
            evidence.setdefault(provider, {})[str(DatasetFiles(path.parent).summary)] = why
        located.extend(Located(r, path, line) for line, r in iter_records(path))
    vocab = vocab_size if vocab_size is not None else tok.vocab_size if tok is not None else VOCAB_SIZE
    for loc in located:
        check_ids(loc, vocab)
    if tok is not None:
        check_tokenizer(located, tok, tokenizer_sample)

    dropped: Counter = Counter()
    kept_at: dict[str, int] = {}  # record id -> its slot in `slots`
    seen_prompts: dict[bytes, TurnKey] = {}  # prompt key -> the turn of its first kept record
    prompt_at: dict[bytes, int] = {}  # prompt key -> the slot of that record
    slots: list[tuple[Sample, Record] | None] = []  # kept so far, in order; None: replaced by a later record
    replaced: list[Replacement] = []
    served: dict[str, Counter] = {p: Counter() for p in evidence}  # suspect -> dataset -> records
    for loc in located:
        r = loc.record
        if r.provider in served:  # before dedupe: its prompts must not keep another provider's answer out
            served[r.provider][r.dataset] += 1
        if r.provider in served and not policy.keep_suspect_providers:
            dropped["suspect_provider"] += 1
            continue
        key = prompt_key(r)
        clashes: dict[int, str] = {}  # slot of a kept record this one duplicates -> the duplicate reason
        if r.id in kept_at:
            clashes[kept_at[r.id]] = "duplicate_id"
        if policy.dedupe_prompts and is_duplicate_prompt(r, seen_prompts):
            clashes.setdefault(prompt_at[key], "duplicate_prompt")
        sample, reason = None, "no_ids" if not r.prompt_ids or not r.output_ids else unfinished_reason(r, policy)
        if reason is None:
            sample, reason = apply_length_policy(
                Sample(r.id, r.dataset, r.input_ids, r.loss_mask, r.finish_reason in CUT_FINISHES, provider=r.provider,
                       sampling=sampling_key(r), conversation_id=r.conversation_id, turn=r.turn), policy)
        earlier = {i: slots[i] for i in clashes}
        if clashes and (sample is None or not all(k is not None and supersedes(r, k[1]) for k in earlier.values())):
            reason = next(iter(clashes.values()))  # a duplicate, as it always was (its own faults are not counted)
        if reason is not None:
            dropped[reason] += 1
            continue
        assert sample is not None  # apply_length_policy gives a sample or a reason
        for i, k in earlier.items():  # a finished answer in the place of the unfinished ones it duplicates
            assert k is not None
            old = k[1]
            slots[i] = None
            kept_at.pop(old.id)
            if prompt_at.get(key) == i:  # `old` was the first kept record of this prompt: now r is
                del prompt_at[key], seen_prompts[key]
            dropped["replaced_by_finished"] += 1
            replaced.append(Replacement(old.id, old.dataset, old.finish_reason, len(old.output_ids), r.id, r.dataset))
        kept_at[r.id] = len(slots)
        if key not in seen_prompts:
            seen_prompts[key], prompt_at[key] = turn_key(r), len(slots)
        slots.append((sample, r))
    kept = [k for k in slots if k is not None]
    suspects = {p: SuspectProvider(p, evidence[p], sum(served[p].values()), dict(served[p])) for p in evidence}
    return Assembly([k[0] for k in kept], [k[1] for k in kept], dropped, hashes, read=len(located),
                    suspects=suspects, kept_suspects=policy.keep_suspect_providers, replaced=replaced)


def plot_sequence_lengths(assembly: Assembly, ax: Any = None) -> Any:
    """Sequence lengths per dataset (prompt + output tokens)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    groups: dict[str, list[int]] = {}
    for s in assembly.samples:
        groups.setdefault(s.dataset, []).append(len(s))
    ax.hist(list(groups.values()), bins=40, stacked=True, label=list(groups))
    ax.set_xlabel("tokens per sample (prompt + output)")
    ax.set_ylabel("samples")
    ax.set_title("Assembled training set: sequence lengths")
    if groups:
        ax.legend()
    return ax
