"""What the run assumes before it has seen answers of its own (pure): the cost prior admission starts from and the
output-length prior pacing starts from, both from the budget model's log-normal guess unless earlier records say."""
from __future__ import annotations

from ...openrouter import Price
from .budget import OutputLengths

PRIOR_PROMPT_TOKENS = 500  # the prompt side of the cost prior (small next to the answer)
OWN_PRIOR = 30             # earlier answers a dataset needs before they replace the guess


def prior_lengths(median_tokens: float, sigma: float, max_tokens: int) -> list[int]:
    """The budget model's guess of output lengths (before a dataset has records of its own)."""
    return list(OutputLengths.lognormal(median_tokens, sigma, max_tokens, n=20_000).samples)


def cost_prior(costs: list[float], worst: Price, lengths: list[int]) -> list[float]:
    """What an answer may cost before this run has seen any: the datasets' earlier records, else the guessed
    output lengths at the worst eligible price."""
    if len(costs) >= OWN_PRIOR:
        return costs
    return [worst.cost(PRIOR_PROMPT_TOKENS, n) for n in lengths]


def length_prior(lengths: list[int], guess: list[int]) -> list[int]:
    """A dataset's earlier records' output lengths, else the guess."""
    return lengths if len(lengths) >= OWN_PRIOR else guess
