"""How much the batch route sends in a round (pure): new conversations toward a target, and the money check.

A batch's answers all come back hours later (a round is up to a whole window), so rounds are what a batch run's time
is counted in: the plan (budget.ipynb, plan/route_plan.py) gives a dataset its deepest conversation's turns plus one
top-up round (`planned_rounds`), and every round after the first must make that plan hold. So a round is planned on
the answers' length distribution, not on its mean alone:

- the dataset's first round, before any answer is measured, sends the conversations expected to bring
  `first_share` of its target on the length guess (nobody has measured it yet: the share keeps a wrong guess from
  overshooting much);
- every later round (and a first round whose lengths an earlier run measured) is one the plan counts on: it adds
  new conversations until the target is reached with probability `REACH` (90 %): the expected total less `REACH_Z`
  standard deviations of it is at least the target. The spread counts every answer still to come (each conversation's
  turns, whether each goes on, the open conversations' turns) and the error of the measured mean itself (its
  variance × the answers to come, squared). A conversation of j turns needs j rounds, so those started in round 2
  end by round 1 + the deepest conversation, the plan's last.

The price of reaching the target in the planned rounds is the overshoot the spread asks for: a few tens of answers
(the demo's targets) overshoot by up to ~30 %; at real targets (thousands of answers) the spread is ~1 % of it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REACH = 0.90       # a round the plan counts on reaches the target with this probability ...
REACH_Z = 1.2816   # ... the normal quantile of REACH: the expected total less this many sd is at least the target
MEASURED = 5       # answers before the measured lengths replace the guess (their mean's error counted from then)


@dataclass(frozen=True)
class TurnLengths:
    """Output tokens per answer (reasoning included): mean and standard deviation, how often an answered turn lets
    its conversation go on (`go_on`: cut answers and tool mismatches end conversations early), and how many answers
    were measured (0: the guess, whose spread is the prior's)."""

    mean: float
    sd: float
    go_on: float = 1.0
    measured: int = 0

    @classmethod
    def of(cls, lengths: Sequence[int], guess: TurnLengths, went_on: int = 0, ended: int = 0) -> TurnLengths:
        """The measured lengths once there are `MEASURED`, else the guess; `go_on` from the counts, with one turn of
        the guess's among them (no count: the guess; one conversation that ended: not at once 0)."""
        go_on = (went_on + guess.go_on) / (went_on + ended + 1)
        if len(lengths) < MEASURED:
            return TurnLengths(guess.mean, guess.sd, go_on, 0)
        n = len(lengths)
        mean = sum(lengths) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in lengths) / max(1, n - 1))
        return cls(mean, sd, go_on, n)

    @property
    def mean_error_var(self) -> float:
        """The variance of the mean itself (measured: sd²/n; the guess: 0, its spread already the prior's)."""
        return self.sd ** 2 / self.measured if self.measured else 0.0

    def conversation(self, turns: int) -> tuple[float, float, float]:
        """`turns` answers still to come, each after the first going on with `go_on`: their expected tokens, the
        variance of those tokens (each answer's spread, and how many are answered), and the answers expected."""
        reach = [self.go_on ** k for k in range(turns)]  # P(at least k+1 of them are answered)
        answers = sum(reach)
        answers_sq = sum((2 * k + 1) * p for k, p in enumerate(reach))  # E[answered²]
        var = answers * self.sd ** 2 + max(0.0, answers_sq - answers ** 2) * self.mean ** 2
        return self.mean * answers, var, answers


@dataclass(frozen=True)
class Need:
    """A dataset's position before a round: its target and the tokens recorded."""

    target: int
    recorded: int


@dataclass(frozen=True)
class RoundSize:
    """What a round sends: the first `ready` of the conversations waiting for their next turn (in order: the others
    wait, and are dropped if the target is met without them), and `new` conversations; the tokens they are expected
    to bring (with what is recorded) and that total's standard deviation."""

    ready: int
    new: int
    expected: float
    sd: float


def round_size(need: Need, open_turns: Sequence[int], new_turns: Iterable[int], lengths: TurnLengths, *,
               reach: bool, first_share: float) -> RoundSize:
    """How many of the conversations waiting for their next turn (`open_turns[i]`: the turns conversation i still
    asks for) and of the next prompts (`new_turns[i]`: the requests prompt i asks for) a round sends.

    `reach` (a round the plan counts on): conversations are added, the open ones first, until the target is
    `reached`. Else (a dataset's first round, on the guess): every open one, and new ones while the expected total
    stays within `first_share` × target. At least one while the target is not met and the round would otherwise
    send nothing (a target is met, not approached)."""
    mean, var, answers = float(need.recorded), 0.0, 0.0

    def spread() -> float:  # the mean's own error grows with the answers it is multiplied by
        return math.sqrt(var + answers ** 2 * lengths.mean_error_var)

    if need.recorded >= need.target:
        return RoundSize(0, 0, mean, 0.0)
    ready = 0
    for k in open_turns:
        if reach and mean - REACH_Z * spread() >= need.target:
            break
        m, v, a = lengths.conversation(k)
        mean, var, answers, ready = mean + m, var + v, answers + a, ready + 1
    new, first = 0, None
    if ready == len(open_turns):
        for k in new_turns:
            first = k if first is None else first
            if reach and mean - REACH_Z * spread() >= need.target:
                break
            m, v, a = lengths.conversation(k)
            if not reach and mean + m > need.target * first_share:
                break
            mean, var, answers, new = mean + m, var + v, answers + a, new + 1
    if ready == new == 0 and first is not None:  # one conversation is more than the first round's aim
        m, v, a = lengths.conversation(first)
        mean, var, answers, new = mean + m, var + v, answers + a, 1
    return RoundSize(ready, new, mean, spread())


def fits(bounds: Sequence[float], committed: float, limit: float) -> int:
    """How many of the lines (their worst cases, in order) fit under `limit` on top of `committed`: every line's
    worst case is booked when it is submitted, so the money can never be overdrawn whatever the answers."""
    n = 0
    for b in bounds:
        if committed + b > limit:
            break
        committed += b
        n += 1
    return n
