"""The on-policy arm's answers: the verifier's own, greedy, every turn on its own history, made one of two ways.

- `through_generation`: the project's own pipeline, as a user regenerates a data set: generate.ipynb
  (`backend: local`, temperature 0) against a vLLM serving the verifier. Its records are any dataset's, token-exact
  (the server's ids).
- `in_process`: transformers' batched `generate` (`arms.regenerate_greedy`), where no vLLM can run (a GPU machine
  without it, the tests).

How the server is started and how the notebook runs are seams (`workspace.ExperimentSeams.serve` / `.generate`):
the notebook runner is `eagledata.notebooks.generate_notebook`, passed in by the callers (quality.ipynb, the CLI),
never imported here (notebooks.py reads `quality.config`).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import atomic_write_text, iter_jsonl, write_jsonl
from ..generation.policy import StopReason
from ..records import Record
from ..status import duration, eta_s
from ..summaries import read_summary
from .arms import ArmChat, ArmRecords, Asks, regenerate_greedy, transformers_generate
from .config import QualityConfig

SERVED_NAME = "target"  # the served model's name in the regeneration's requests and records
Serve = Callable[[QualityConfig, Path, Path], AbstractContextManager[str]]  # (config, verifier, log) -> base URL
RunNotebook = Callable[[dict[str, Any], Path], None]  # (notebook parameters, executed notebook's path)


def prompt_row(asks: Asks) -> dict[str, Any]:
    """A prompt-file line asking exactly `asks.asks`: the asks with the data set's answers between them (generation
    drops those and asks after each user turn on the verifier's own answers)."""
    messages: list[dict] = []
    for j, ask in enumerate(asks.asks):
        if j:
            messages.append({"role": "assistant", "content": asks.answers[j - 1] or ""})
        messages += ask
    return {"id": asks.id, "messages": messages}


def serve_verifier(config: QualityConfig, verifier: Path, log_file: Path) -> AbstractContextManager[str]:
    """A vLLM chat server for the verifier (quality/serve.py), from the config's vLLM environment."""
    from .serve import serve_chat

    return serve_chat(config.vllm_python, verifier, log_file, served_name=SERVED_NAME,
                      max_model_len=config.sample_tokens + config.answer_tokens, threads=config.threads)


@dataclass
class RegenerationProgress:
    """What generate.ipynb has recorded so far, read from its records file as it grows (its own status lines stay in
    the executed generate.ipynb, which a quality run's log does not show): a line of asks answered of the most there
    can be (a cut answer's later turns are never asked, so the ETA is a bound), output tokens, tokens/s and ETA at
    this run's rate (records already there when it started, a resumed run's, left out of the rate)."""

    records: Path
    total: int
    clock: Callable[[], float] = time.monotonic
    answered: int = 0
    tokens: int = 0
    _offset: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.poll()
        self.started, self.at_start, self.tokens_at_start = self.clock(), self.answered, self.tokens

    def poll(self) -> None:
        """Count the whole lines appended since the last poll (a line still being written waits for the next; one
        that is not a record counts without tokens: reading the records after the run is what refuses it)."""
        if not self.records.is_file():
            return
        with open(self.records, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.splitlines():
            if line.strip():
                self.answered += 1
                with suppress(ValueError, AttributeError):
                    self.tokens += len(json.loads(line).get("output_ids") or ())

    def line(self) -> str:
        self.poll()
        elapsed = self.clock() - self.started
        rate = (self.tokens - self.tokens_at_start) / elapsed if elapsed > 0 else 0.0
        left = eta_s(self.answered, self.total, elapsed, self.at_start)
        return (f"  on_policy regeneration {duration(elapsed)}: {self.answered:,}/{self.total:,} asks at most, "
                f"{self.tokens:,} output tokens, {rate:,.0f} tok/s, ETA ≤ {duration(left)}")


@contextmanager
def saying_progress(progress: RegenerationProgress, say: Callable[[str], None], interval_s: float) -> Iterator[None]:
    """`progress.line()` said every `interval_s` from a thread while the body runs, and once at its end."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval_s):
            say(progress.line())

    thread = threading.Thread(target=watch, name="regeneration-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        say(progress.line())


def through_generation(asks: list[Asks], config: QualityConfig, verifier: Path, work: Path, *, serve: Serve,
                       generate: RunNotebook | None, say: Callable[[str], None],
                       progress_s: float = 60.0) -> ArmRecords:
    """generate.ipynb against a vLLM serving the verifier, in `work/`: records as any dataset's, each conversation
    cut to its first `max_turns` asks; what was not answered is counted by why."""
    if generate is None:
        raise InputError("regenerate 'vllm' runs generate.ipynb: pass its runner (ExperimentSeams(generate="
                         "eagledata.notebooks.generate_notebook)), or set regenerate 'transformers'",
                         field="regenerate")
    prompts = work / "prompts.jsonl"
    write_jsonl(prompts, (prompt_row(a) for a in asks))
    datasets = work / "datasets.yaml"
    atomic_write_text(datasets, json.dumps({"on_policy": {"prompts": str(prompts.resolve()),
                                                          "target_output_tokens": 10 ** 12}}) + "\n")
    with serve(config, verifier, work / "vllm.log") as base_url:
        params = {"dataset": "on_policy", "datasets_file": str(datasets.resolve()), "base_url": base_url,
                  "model": SERVED_NAME, "tokenizer": str(verifier.resolve()), "backend": "local",
                  "temperature": 0.0, "max_tokens": config.answer_tokens, "concurrency": config.vllm_concurrency,
                  "output_dir": str(work.resolve()), "params_dir": str((work / "params").resolve()),
                  "progress": False}
        total = sum(len(a.asks) for a in asks)
        say(f"  on_policy regeneration: generate.ipynb against {base_url} ({total} asks at most)")
        folder = work / "datasets" / "on_policy"
        with saying_progress(RegenerationProgress(folder / "records.jsonl", total), say, progress_s):
            generate(params, work / "generate.ipynb")
    require_completed(folder / "summary.json")
    made = ArmRecords([Record.from_dict(r) for _, r in iter_jsonl(folder / "records.jsonl")])
    failed = sum(1 for _ in iter_jsonl(folder / "failures.jsonl")) if (folder / "failures.jsonl").is_file() else 0
    if failed:
        made.dropped["failed (failures.jsonl: e.g. a prompt over the server's context)"] = failed
    made.dropped["not asked: a later turn after a cut or failed one"] = total - len(made.records) - failed
    return made


def require_completed(summary: Path) -> None:
    """Refuse a regeneration that stopped before every ask was answered or failed for good (a Ctrl-C or SIGTERM to
    its kernel ends generate.ipynb normally, its summary saying why): its unasked turns are not "later turns after a
    cut", and an arm built from them would be silently short. Run again: generation resumes from its checkpoint."""
    if not summary.is_file():
        raise RuntimeError(f"the on_policy regeneration left no {summary}: it did not finish")
    done = read_summary(summary)
    if done.get("stop_reason") != StopReason.COMPLETED:
        raise RuntimeError(
            f"the on_policy regeneration stopped {done.get('stop_reason')!r} with {done.get('remaining')} prompts "
            f"remaining ({summary}): run the experiment again to go on from its checkpoint")


def in_process(asks: list[Asks], config: QualityConfig, model: Any, chat: ArmChat, verifier: Path, *,
               say: Callable[[str], None]) -> ArmRecords:
    """The verifier's own greedy answers by transformers (batched), every turn on its own history."""
    stops = chat.stop_ids()
    pad = getattr(model.generation_config, "pad_token_id", None)
    generate = transformers_generate(model, stops, pad if isinstance(pad, int) else min(stops))
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        say(f"  on_policy regeneration: {done}/{total} asks, {time.monotonic() - started:.0f} s")

    return regenerate_greedy(asks, chat, generate, dataset="on_policy", max_tokens=config.answer_tokens,
                             batch_size=config.batch_size, model=str(verifier), progress=progress)
