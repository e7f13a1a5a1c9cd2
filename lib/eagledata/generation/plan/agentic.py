"""Planning an agentic dataset (issue 61 item 6): by steps per task, not by one answer per prompt.

A task is a trajectory of S requests (its steps: a request per tool round and per answer, over its user turns), and
each step re-sends the whole history: step k's prompt is the first request's P0 tokens plus what the k−1 steps before
added (each answer, its reasoning kept in a tool loop in flight, its calls' results, the next user turn), about g
tokens a step. So a task of S steps reads S·P0 + g·S(S−1)/2 prompt tokens and writes S·o output tokens: its prompt
side grows with the square of its length, and a long tail of steps costs more than its mean says.

The shape (S's distribution, P0, g, o) comes from a pilot run's records (`pilot_shape`: a run of the same tasks with a
`limit`; every ended trajectory's steps, each request's prompt growth and output) or from a prior (`prior_shape`: the
task file's own first prompts and user turns, an assumed number of steps per user turn, the output guess and a result
size: budget.ipynb's `prior_steps_per_user_turn` and `prior_tool_result_tokens`). Pure but for `measure_tasks` (the
tokenizer over a task file) and `read_pilot`.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...files import iter_jsonl
from ...prompts import iter_prompts
from ...records import output_tokens
from ...text import Tokenizer, prompt_ids
from ..conversations.turns import Conversation, pauses
from .budget import Z90, Prices


@dataclass(frozen=True)
class AgenticShape:
    """What a task costs, step by step: `steps` its distribution (steps per task -> tasks), `first_prompt_tokens`
    P0, `growth_tokens` g (what each step adds to the next step's prompt), `output_tokens` o per step (mean, sd)."""

    steps: Mapping[int, int]
    first_prompt_tokens: float
    growth_tokens: float
    output_tokens: float
    output_sd: float
    source: str  # "pilot (N trajectories)" or "prior (...)"

    def __post_init__(self) -> None:
        if not self.steps or any(s < 1 or n < 0 for s, n in self.steps.items()) or not sum(self.steps.values()):
            raise InputError("steps per task must be a non-empty distribution of counts over steps >= 1",
                             field="steps")

    def _weights(self) -> list[tuple[int, float]]:
        total = sum(self.steps.values())
        return [(s, n / total) for s, n in sorted(self.steps.items()) if n]

    def prompt_tokens(self, steps: int) -> float:
        """Prompt tokens of a task of `steps` requests: each re-sends the history before it."""
        return steps * self.first_prompt_tokens + self.growth_tokens * steps * (steps - 1) / 2

    @property
    def steps_mean(self) -> float:
        return sum(s * w for s, w in self._weights())

    def steps_quantile(self, q: float) -> int:
        """The smallest step count with at least a share `q` of the tasks at or below it."""
        acc = 0.0
        for s, w in self._weights():
            acc += w
            if acc >= q - 1e-12:
                return s
        return max(self.steps)

    def task_usd(self, prices: Prices) -> tuple[float, float]:
        """(mean, sd) of one task's money: its steps drawn from the distribution, its outputs spread around o."""
        p_in, p_out = prices.prompt_per_m / 1e6, prices.completion_per_m / 1e6
        cost = {s: self.prompt_tokens(s) * p_in + s * self.output_tokens * p_out for s, _ in self._weights()}
        mean = sum(cost[s] * w for s, w in self._weights())
        var = sum(w * ((cost[s] - mean) ** 2 + s * (self.output_sd * p_out) ** 2) for s, w in self._weights())
        return mean, math.sqrt(var)


@dataclass(frozen=True)
class AgenticEstimate:
    """What `tasks` tasks of a shape are expected to take: requests, prompt and output tokens, money (P50, P90)."""

    tasks: int
    steps_mean: float
    steps_p90: int
    requests: float
    prompt_tokens: float
    output_tokens: float
    usd: float
    usd_p90: float
    usd_per_task: float
    source: str

    def row(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "steps_mean": round(self.steps_mean, 2), "steps_p90": self.steps_p90,
                "requests": round(self.requests), "prompt_tokens": round(self.prompt_tokens),
                "output_tokens": round(self.output_tokens), "usd": round(self.usd, 4),
                "usd_p90": round(self.usd_p90, 4), "usd_per_task": round(self.usd_per_task, 6), "shape": self.source}


def estimate(shape: AgenticShape, tasks: int, prices: Prices) -> AgenticEstimate:
    """The expected requests, tokens and money of `tasks` tasks, with the P90 of the money (the tasks' costs added up:
    mean N·m, spread √N·sd)."""
    w = shape._weights()
    mean, sd = shape.task_usd(prices)
    return AgenticEstimate(
        tasks=tasks, steps_mean=shape.steps_mean, steps_p90=shape.steps_quantile(0.9),
        requests=tasks * shape.steps_mean,
        prompt_tokens=tasks * sum(shape.prompt_tokens(s) * p for s, p in w),
        output_tokens=tasks * shape.steps_mean * shape.output_tokens,
        usd=tasks * mean, usd_p90=tasks * mean + Z90 * math.sqrt(tasks) * sd, usd_per_task=mean, source=shape.source)


def tasks_for_budget(shape: AgenticShape, prices: Prices, money_usd: float) -> int:
    """The most tasks whose P90 money fits `money_usd` (the balance less the reserve): N·m + Z90·√N·sd ≤ money."""
    mean, sd = shape.task_usd(prices)
    if money_usd <= 0 or mean <= 0:
        return 0
    b = Z90 * sd
    x = (-b + math.sqrt(b * b + 4 * mean * money_usd)) / (2 * mean)  # √N
    n = math.floor(x * x)
    while n > 0 and n * mean + Z90 * math.sqrt(n) * sd > money_usd:  # the root's float rounding
        n -= 1
    return n


def pilot_shape(records: Iterable[Mapping[str, Any]]) -> AgenticShape | None:
    """The shape a pilot run's records (their JSON objects) show: steps per ended trajectory, the first requests'
    prompts, the mean growth between consecutive requests of a trajectory, output per request. Pause samples and
    records of no rollout are left out; None when no trajectory ended."""
    prompts: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    ended: set[tuple[str, str]] = set()
    outputs: list[int] = []
    for r in records:
        rollout = (r.get("meta") or {}).get("rollout")
        if not isinstance(rollout, Mapping) or pauses(r.get("meta")):
            continue
        key = (str(r.get("dataset")), str(r.get("conversation_id") or r["id"]))
        prompts[key][int(r.get("turn") or 1)] = len(r.get("prompt_ids") or ())
        outputs.append(output_tokens((r.get("usage") or {}).get("completion_tokens"), r.get("output_ids")))
        if rollout.get("ended") or r.get("finish_reason") not in ("stop", "tool_calls"):
            ended.add(key)
    if not ended:
        return None
    steps = Counter(len(prompts[k]) for k in ended)
    firsts = [p[1] for p in prompts.values() if 1 in p]
    growth = [p[n + 1] - p[n] for p in prompts.values() for n in p if n + 1 in p]
    mean_out = sum(outputs) / len(outputs)
    sd_out = math.sqrt(sum((o - mean_out) ** 2 for o in outputs) / len(outputs))
    return AgenticShape(dict(steps), sum(firsts) / len(firsts), sum(growth) / len(growth) if growth else 0.0,
                        mean_out, sd_out, f"pilot ({len(ended)} trajectories)")


def prior_shape(user_turns: Sequence[int], first_prompt_tokens: Sequence[int], *, output_tokens: float,
                output_sd: float, steps_per_user_turn: float, result_tokens: float,
                user_turn_tokens: float = 0.0) -> AgenticShape:
    """The shape before any pilot: each task's user turns × `steps_per_user_turn` steps (rounded, at least one per
    user turn), its first prompt as measured, each step adding its answer (`output_tokens`: in a tool loop the
    reasoning is re-sent), its results (`result_tokens`) and its share of a later user turn (`user_turn_tokens`, one
    per `steps_per_user_turn` steps)."""
    if not user_turns or len(user_turns) != len(first_prompt_tokens):
        raise InputError("one user-turn count and one first prompt per task", field="tasks")
    if steps_per_user_turn < 1:
        raise InputError("at least one request per user turn", field="prior_steps_per_user_turn")
    steps = Counter(max(u, round(u * steps_per_user_turn)) for u in user_turns)
    return AgenticShape(dict(steps), sum(first_prompt_tokens) / len(first_prompt_tokens),
                        output_tokens + result_tokens + user_turn_tokens / steps_per_user_turn, output_tokens,
                        output_sd,
                        f"prior ({steps_per_user_turn:g} steps per user turn, {result_tokens:g} result tokens)")


@dataclass(frozen=True)
class TaskFile:
    """A task file's facts the prior needs: each task's user turns, its first request's prompt tokens (measured with
    the real tokenizer and template, tools included), and the mean tokens of a later user turn's message."""

    user_turns: list[int]
    first_prompt_tokens: list[int]
    later_user_turn_tokens: float


def measure_tasks(tok: Tokenizer, path: str | Path) -> TaskFile | None:
    """The agentic tasks of a prompt file measured (None when it holds none)."""
    turns, firsts, later = [], [], []
    for p in iter_prompts(path):
        if p.task is None:
            continue
        c = Conversation.of(p)
        turns.append(len(c.asks))
        firsts.append(len(prompt_ids(tok, c.turn().messages, tools=c.tools)))
        later += [len(tok.encode(str(m.get("content") or ""))) for ask in c.asks[1:] for m in ask]
    if not turns:
        return None
    return TaskFile(turns, firsts, sum(later) / len(later) if later else 0.0)


def read_pilot(records: str | Path) -> AgenticShape | None:
    """`pilot_shape` of a records file (None when there is none, or no trajectory in it ended)."""
    path = Path(records)
    if not path.is_file():
        return None
    return pilot_shape(r for _, r in iter_jsonl(path, tolerate_torn_tail=True))


def plan_agentic(tok: Tokenizer, prompts: Mapping[str, str | Path], records: Mapping[str, str | Path], prices: Prices,
                 *, output_tokens: float, output_sd: float, money_usd: float, steps_per_user_turn: float,
                 result_tokens: float) -> list[dict[str, Any]]:
    """budget.ipynb's agentic table: per dataset whose prompt file holds tasks, its shape (its own records as the
    pilot when a run ended some trajectory, else the prior from its task file and the output guess), what all its
    tasks are expected to take, and how many tasks `money_usd` allows at P90."""
    rows = []
    for name, path in prompts.items():
        measured = measure_tasks(tok, path)
        if measured is None:
            continue
        shape = read_pilot(records[name]) if name in records else None
        shape = shape or prior_shape(measured.user_turns, measured.first_prompt_tokens, output_tokens=output_tokens,
                                     output_sd=output_sd, steps_per_user_turn=steps_per_user_turn,
                                     result_tokens=result_tokens, user_turn_tokens=measured.later_user_turn_tokens)
        rows.append({"dataset": name, **estimate(shape, len(measured.user_turns), prices).row(),
                     "tasks_in_budget": tasks_for_budget(shape, prices, money_usd)})
    return rows
