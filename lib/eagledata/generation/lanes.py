"""One dataset inside a run: its checkpoint, its prompts still to send, the next turns of its started conversations,
its retries and its counters. The dispatcher takes work from it; the recorder writes to its store; the reporter
reads it."""
from __future__ import annotations

import functools
import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import InputError
from ..paths import dataset_files
from ..prompts import Prompt, PromptScan, scan_prompts
from .conversations.datasets import select_datasets
from .conversations.fidelity import FidelityJudge
from .conversations.rollouts import DEFAULT_STEPS, recorded_results
from .conversations.store import Store
from .conversations.turns import Conversation, Turn, TurnsMode, later_turn_ids
from .conversations.work import Work
from .money.killed import KilledBefore
from .policy import StopReason
from .report.progress import RunStats

if TYPE_CHECKING:
    from .config import GenerateConfig


@dataclass(eq=False)
class DatasetRun:
    """One dataset inside a run: its checkpoint, its prompts still to send, the next turns of its started
    conversations, its retries and its counters."""

    name: str
    store: Store
    scan: PromptScan
    target: int | None
    turns: TurnsMode = "all"
    planned_usd: float | None = None  # the budget plan's $ for its target (None: no plan, or another target)
    rollout_steps: int = DEFAULT_STEPS  # a task's requests per user turn at most (rollouts.py)
    prompts: Iterator[Prompt] = field(init=False)
    exhausted: bool = False
    ready: deque[Turn] = field(default_factory=deque)     # next turns, answered at once, ahead of new conversations
    retries: list[Work] = field(default_factory=list)   # heap by due time
    holding: int = 0
    held: int = 0                                        # refusals held by the dispatcher, not written yet
    stop_reason: str = ""
    killed_before: KilledBefore | None = None              # the streams an earlier, killed run left (killed.py)
    target_met_s: float | None = None                    # when its recorded tokens reached the target
    near_target: bool = False  # streamed, `at_target: cut`: its cut is near (pacing): only endpoints that cancel
    stats: RunStats = field(default_factory=RunStats)
    fidelity: FidelityJudge = field(init=False)  # this dataset's answers, all runs (the run's judge decides)

    def __post_init__(self) -> None:
        self.prompts = iter(self.scan)
        self.done_before = self.store.conversations_finished
        self.tokens_before = self.store.output_tokens
        self.summary_before = self.store.read_summary()  # an earlier run's: its fidelity books carry over
        # One `turns` setting per dataset: continuing with the other would make one conversation's turns both ways.
        before = ((self.summary_before or {}).get("run") or {}).get("turns")
        if self.store.recorded and before is not None and before != self.turns:
            raise InputError(f"this dataset's records were made with turns: {before}; continue with the same "
                             f"setting (or another output_dir)", self.store.files.summary, field="turns")
        self.fidelity = FidelityJudge.carried([self.summary_before] if self.summary_before else [], decides=False)
        if self.idle:  # nothing to send in this run
            self.stop_reason = StopReason.TARGET_REACHED if self.target_met else \
                StopReason.ALL_FAILED if self.all_failed else StopReason.COMPLETED

    @property
    def target_met(self) -> bool:
        return self.target is not None and self.store.output_tokens >= self.target

    @property
    def idle(self) -> bool:
        """Nothing to send: every prompt finished, or the target met."""
        return not self.scan.pending or self.target_met

    @property
    def all_finished(self) -> bool:
        """Every conversation of this run is finished (recorded to its end, failed, or refused and held to be
        written as failed): `completed` is true. (Taken is not finished: a prompt given back unstarted, when the
        money ran out, is still to do.)"""
        return self.store.conversations_finished + self.held - self.done_before >= len(self.scan.pending)

    @property
    def all_failed(self) -> bool:
        """Every prompt finished failed for good, not one recorded (all runs): `all_failed`, not `completed`."""
        return not self.store.recorded and self.store.failed + self.held > 0

    def take(self, now: float, seq: int, may_start: Callable[[], bool], may_continue: Callable[[], bool]) \
            -> Work | None:
        """The next request of this dataset: a retry that is due, else the next turn of a started conversation, else
        the first turn of the next conversation; new conversations while pacing lets the dataset take more, retries
        and next turns while it lets conversations go on (pacing.Lane.may_continue). A retry is a started
        conversation: its later turns are already counted (promised), and gated as a new one it could wait on
        itself for good: a dataset short of its target with nothing in flight but those turns would never open."""
        if self.retries and self.retries[0].due <= now and may_continue():
            work = heapq.heappop(self.retries)
            work.source = "retry"
            return work
        if self.ready and may_continue():
            return Work(0.0, seq, self.ready.popleft(), self, source="next")
        if not self.exhausted and may_start():
            prompt = next(self.prompts, None)
            if prompt is None:
                self.exhausted = True
                return None
            return Work(0.0, seq, self.first_turn(self.conversation(prompt)), self)
        return None

    def conversation(self, prompt: Prompt) -> Conversation:
        """A prompt as this dataset's run chains it (its `turns` setting, a task's step cap)."""
        return Conversation.of(prompt, self.turns, self.rollout_steps)

    def first_turn(self, conversation: Conversation) -> Turn:
        """A conversation's first request in this run: its first turn, or the one after the turns an earlier run
        recorded (from their recorded answers; a rollout's executed steps' results as its last record was shown them,
        its last step's calls `due`, executed again from the task's initial state)."""
        history = self.store.history(conversation.id) if conversation.id in self.store.chains else []
        numbers = [r.turn for r in history]
        if conversation.rollout is not None and history:
            answers = [r.answer for r in history]
            if numbers == list(range(1, len(history) + 1)):
                try:
                    return conversation.turn(answers, recorded_results(answers, history[-1].messages,
                                                                       f"record {history[-1].id!r}"))
                except ValueError as e:
                    raise InputError(f"conversation {conversation.id!r}: {e} (was the task changed?)",
                                     self.store.files.records) from None
        if numbers != list(range(conversation.first, conversation.first + len(history))) \
                or len(history) >= len(conversation.asks) and conversation.rollout is None:
            raise InputError(f"conversation {conversation.id!r}: turns {numbers} are recorded, but its prompt has "
                             f"{len(conversation.asks)} (was the prompt file changed?)", self.store.files.records)
        return conversation.turn([r.answer for r in history])

    @property
    def finished(self) -> bool:
        return bool(self.stop_reason)


def open_lanes(cfg: GenerateConfig) -> list[DatasetRun]:
    """Every dataset of the run, its store opened and every prompt validated before any request (a bad line is
    named with its file and line); on an error, what was opened is closed again."""
    lanes: list[DatasetRun] = []
    try:
        for spec in select_datasets(cfg.datasets_file, cfg.dataset):
            if not spec.prompts.is_file():
                raise InputError("prompts file not found", spec.prompts, field=f"{spec.name}.prompts")
            store = Store.open(dataset_files(spec.name, cfg.output_dir), retry_failed=cfg.retry_failed)
            try:
                scan = scan_prompts(spec.prompts, store.finished, cfg.limit, tools=spec.tools,
                                    turn_ids=functools.partial(later_turn_ids, turns=cfg.turns,
                                                               steps=cfg.rollout_steps))
                target = cfg.target_for(spec.name)
                lanes.append(DatasetRun(spec.name, store, scan, target or spec.target_output_tokens, cfg.turns,
                                        None if target else spec.planned_usd, cfg.rollout_steps))
            except BaseException:
                store.close()
                raise
    except BaseException:
        for lane in lanes:
            lane.store.close()
        raise
    return lanes
