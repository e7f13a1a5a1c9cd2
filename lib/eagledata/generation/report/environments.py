"""How a dataset's rollouts went, per environment (issue 61 item 6): the `rollouts` section of summary.json and the
report's table.

Read from the records (and failures) themselves, not counted as the run goes: a trajectory often spans runs (a kill,
a Ctrl-C, a higher target), and only the records say whole trajectories. Each rollout record carries its task's
environment label and the kinds of the tool results it is the first to show (`meta.rollout.environment`, `.errors`:
conversations/rollouts.py), so the figures need neither the task file nor the wording of an error. Pure but for
`read_rollouts`: `Tally.add` takes one record as its JSON object.

Per environment: tasks (trajectories begun), how they ended (`answered`, `capped`, `cut`: an answer the model did not
finish, `failed`: a request failed for good) and how many are still open, steps per task (requests per ended
trajectory: mean, p50, p90), requests, calls and calls per step, failed calls by kind, results whose kind the
executor did not say, pause samples (prefixes a stop kept: money and samples, not steps), prompt and output tokens
and money (every record of the environment, pause samples included).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...files import iter_jsonl
from ...paths import DatasetFiles
from ...records import output_tokens
from ..conversations.rollouts import ANSWERED, CAPPED, FINISHED
from ..conversations.turns import pauses

CUT_ENDED, FAILED = "cut", "failed"  # how else a trajectory ends: an unfinished answer, a request failed for good
ENDINGS = (ANSWERED, CAPPED, CUT_ENDED, FAILED)
UNKNOWN_ENVIRONMENT = "?"  # a failure whose conversation no record or failure line names an environment for


@dataclass
class EnvironmentTally:
    """The counters of one environment; trajectories are keyed by (dataset, conversation id)."""

    steps: Counter = field(default_factory=Counter)   # requests recorded per trajectory (pause samples aside)
    ended: dict[tuple[str, str], str] = field(default_factory=dict)  # trajectory -> how it ended
    calls: int = 0
    errors: Counter = field(default_factory=Counter)  # failed calls by kind
    results: int = 0             # tool results shown (each counted on the request that first carries it)
    results_kind_unknown: int = 0  # of them, from an executor that gave texts alone
    pause_samples: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0

    def merge(self, other: EnvironmentTally) -> None:
        self.steps.update(other.steps)
        self.ended.update(other.ended)
        self.errors.update(other.errors)
        for name in ("calls", "results", "results_kind_unknown", "pause_samples", "prompt_tokens", "output_tokens",
                     "usd"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def figures(self) -> dict[str, Any]:
        """The environment's figures as summary.json writes them (docs/FORMATS.md, `summary.json`'s `rollouts`)."""
        requests = sum(self.steps.values())
        done = [self.steps[t] for t in self.ended]
        endings = Counter(self.ended.values())
        return {"tasks": len(self.steps.keys() | self.ended.keys()), "ended": {k: endings[k] for k in ENDINGS},
                "open": len(self.steps.keys() - self.ended.keys()),
                "steps_per_task": {"mean": round(float(np.mean(done)), 3) if done else None,
                                   "p50": float(np.percentile(done, 50)) if done else None,
                                   "p90": float(np.percentile(done, 90)) if done else None},
                "requests": requests, "calls": self.calls,
                "calls_per_step": round(self.calls / requests, 3) if requests else None,
                "errors": dict(sorted(self.errors.items())), "results": self.results,
                "results_kind_unknown": self.results_kind_unknown, "pause_samples": self.pause_samples,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "usd": round(self.usd, 8)}


def _trailing_results(messages: Iterable[Mapping[str, Any]]) -> int:
    """The tool results at the end of a request: the ones it is the first to carry."""
    n = 0
    for m in reversed(list(messages)):
        if m.get("role") != "tool":
            break
        n += 1
    return n


@dataclass
class Tally:
    """Per environment label, the rollouts of one or more datasets."""

    environments: dict[str, EnvironmentTally] = field(default_factory=dict)
    owner: dict[tuple[str, str], str] = field(default_factory=dict)  # trajectory -> its environment

    def _of(self, label: str) -> EnvironmentTally:
        return self.environments.setdefault(label, EnvironmentTally())

    def add(self, record: Mapping[str, Any]) -> None:
        """One record (its JSON object); a record of no rollout is left out."""
        rollout = (record.get("meta") or {}).get("rollout")
        if not isinstance(rollout, Mapping):
            return
        label = str(rollout.get("environment") or UNKNOWN_ENVIRONMENT)
        key = (str(record.get("dataset")), str(record.get("conversation_id") or record["id"]))
        self.owner[key] = label
        env, usage = self._of(label), record.get("usage") or {}
        env.prompt_tokens += len(record.get("prompt_ids") or ())
        env.output_tokens += output_tokens(usage.get("completion_tokens"), record.get("output_ids"))
        env.usd += usage.get("cost") or 0.0
        if pauses(record.get("meta")):  # its turn is asked again: a sample and money, not a step
            env.pause_samples += 1
            return
        env.steps[key] += 1
        env.calls += len(record.get("tool_calls") or ())
        errors = rollout.get("errors")
        if errors is not None:
            env.results += len(errors)
            env.errors.update(e for e in errors if e is not None)
        else:
            shown = _trailing_results(record.get("messages") or ())
            env.results += shown
            env.results_kind_unknown += shown
        if rollout.get("ended"):
            env.ended[key] = str(rollout["ended"])
        elif record.get("finish_reason") not in FINISHED:
            env.ended[key] = CUT_ENDED

    def fail(self, failure: Mapping[str, Any], dataset: str) -> None:
        """A failures.jsonl line: the trajectory it names ended failed (a line of no rollout is left out)."""
        key = (dataset, str(failure.get("conversation_id") or failure["id"]))
        label = failure.get("environment") or self.owner.get(key)
        if label is None:
            return
        self.owner[key] = str(label)
        self._of(str(label)).ended[key] = FAILED

    def merge(self, other: Tally) -> Tally:
        for label, env in other.environments.items():
            self._of(label).merge(env)
        self.owner.update(other.owner)
        return self

    def figures(self) -> dict[str, dict[str, Any]]:
        """{environment label: its figures}, labels in order."""
        return {label: self.environments[label].figures() for label in sorted(self.environments)}


def read_rollouts(files: DatasetFiles, dataset: str) -> Tally:
    """One dataset's rollouts, from its records.jsonl then failures.jsonl (a torn last line left out)."""
    tally = Tally()
    if files.records.is_file():
        for _, r in iter_jsonl(files.records, tolerate_torn_tail=True):
            tally.add(r)
    if files.failures.is_file():
        for _, f in iter_jsonl(files.failures, tolerate_torn_tail=True):
            tally.fail(f, dataset)
    return tally


def environment_rows(rollouts: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per environment of a summary's `rollouts` section: what the report's table shows."""
    rows = []
    for label, f in rollouts.items():
        steps = f["steps_per_task"]
        rows.append({"environment": label, "tasks": f["tasks"], **{k: f["ended"][k] for k in ENDINGS},
                     "open": f["open"], "steps_mean": steps["mean"], "steps_p50": steps["p50"],
                     "steps_p90": steps["p90"], "requests": f["requests"], "calls_per_step": f["calls_per_step"],
                     "call_errors": sum(f["errors"].values()),
                     "errors_by_kind": ", ".join(f"{k} {n}" for k, n in f["errors"].items()) or "-",
                     "results_kind_unknown": f["results_kind_unknown"], "prompt_tokens": f["prompt_tokens"],
                     "output_tokens": f["output_tokens"], "usd": f["usd"]})
    return rows
