"""How much the batch route sends in a round (pure): new conversations toward a target, and the money check.

A batch's answers all come back hours later, so a round cannot be paced answer by answer as the realtime pool is:
it is planned on expectations. A dataset's first round sends the conversations that are expected to bring
`first_share` of its target (the budget model's estimate, on a length guess nobody has measured yet: the share keeps
a wrong guess from overshooting). Each later round measures the answers so far and tops up what is still missing,
aiming a little over the target (`TOP_UP_AIM`), so that the last round is seldom a round of one.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TOP_UP_AIM = 1.015   # a top-up round aims this far over the target: under it, one more round (hours) is needed
OVER_LIMIT = 1.04    # ... and never plans an expected total plus two standard deviations past this
MEASURED = 20        # answers before the measured lengths replace the guess


@dataclass(frozen=True)
class TurnLengths:
    """Output tokens per answer (reasoning included): mean and standard deviation, and how often an answered turn
    lets its conversation go on (`go_on`: cut answers and tool mismatches end conversations early)."""

    mean: float
    sd: float
    go_on: float = 1.0
    measured: bool = False

    @classmethod
    def of(cls, lengths: Sequence[int], guess: TurnLengths, went_on: int = 0, ended: int = 0) -> TurnLengths:
        """The measured lengths once there are `MEASURED`, else the guess; `go_on` from the counts when any."""
        go_on = went_on / (went_on + ended) if went_on + ended >= MEASURED else guess.go_on
        if len(lengths) < MEASURED:
            return TurnLengths(guess.mean, guess.sd, go_on, False)
        n = len(lengths)
        mean = sum(lengths) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in lengths) / max(1, n - 1))
        return cls(mean, sd, go_on, True)

    def conversation(self, turns: int) -> tuple[float, float]:
        """Expected tokens (mean, variance) of `turns` answers still to come, each going on with `go_on`."""
        reach = sum(self.go_on ** k for k in range(turns))  # expected number of those turns answered
        return self.mean * reach, self.sd ** 2 * reach


@dataclass(frozen=True)
class Need:
    """A dataset's position before a round: recorded tokens, and what its open conversations are expected to add."""

    target: int
    recorded: int
    open_mean: float = 0.0
    open_var: float = 0.0

    @property
    def expected(self) -> float:
        return self.recorded + self.open_mean


def new_conversations(need: Need, turns: Iterable[int], lengths: TurnLengths, *, first: bool,
                      first_share: float) -> int:
    """How many of the next prompts (`turns[i]`: the requests prompt i asks for) a round starts.

    Adds prompts while the expected total stays within the aim (`first_share` × target on the guess; `TOP_UP_AIM` ×
    target once measured) and its two-sd bound within `OVER_LIMIT` × target; at least one while the expected total
    is short of the target and the round would otherwise start nothing (a target is met, not approached)."""
    if need.recorded >= need.target:
        return 0
    aim = need.target * (first_share if first and not lengths.measured else TOP_UP_AIM)
    mean, var, n, any_left = need.expected, need.open_var, 0, False
    for k in turns:
        any_left = True
        m, v = lengths.conversation(k)
        if mean + m > aim or mean + m + 2 * math.sqrt(var + v) > need.target * OVER_LIMIT:
            break
        mean, var, n = mean + m, var + v, n + 1
    if n == 0 and any_left and need.open_mean == 0 and need.recorded < need.target:
        return 1
    return n


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
