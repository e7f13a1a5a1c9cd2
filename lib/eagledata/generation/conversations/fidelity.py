"""Judging providers while the run goes (pure): is each one serving the model's own text?

Every kept answer carries `meta.fidelity` (recording.answer_check): the repair rule applied and how the
service's counts (`usage.completion_tokens`, `usage.prompt_tokens`, the native tokenizer's) differ from the ids
we rebuilt. A provider's difference is a constant offset: 0 or -1 on finished answers (it counts `<|im_end|>` or
not; a tool-call answer ends in `<|im_end|>` too), 0 on cut ones, the commonest one on prompts; a faithful
provider leaves it only rarely: when the model chose a non-canonical split, or a cut fell inside a character. A
provider whose text is not the model's (spaces beside special tokens, another chat template) moves the count on most
answers. Refused answers (reasoning billed, never served; ids off the service's count beyond the provider's offset
and `recording.COUNT_TOLERANCE`, whatever its verdict) count against their provider too.

The rule (`judge`): a provider is `suspect` once it has at least `MIN_ANSWERS` answers and its bad ones
(count mismatches + refusals) are too many for a faithful provider, whose rate is at most `FAITHFUL_RATE`:
the one-sided binomial tail P(X >= bad | answers, FAITHFUL_RATE) is below `ALPHA`. An absolute floor, not a
comparison with the other providers, so a run where every provider is bad flags every one. A verdict is final:
the engine leaves a suspect provider out of the rest of the run; when every eligible provider is suspect the run
stops (`no_faithful_providers`) rather than pay for answers it would not use.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...summaries import CONSISTENT, SUSPECT, fidelity_suspects

FAITHFUL_RATE = 0.05  # the most a faithful provider's answers leave its offset (measured: well under 1 %)
ALPHA = 1e-6          # false alarm per look: a faithful provider is never left out for bad luck
MIN_ANSWERS = 20      # fewer answers decide nothing
ENDED = ("stop", "tool_calls")  # finish reasons whose ids end in `<|im_end|>`: the one token a provider may not count


def _ending(finish: str) -> str:
    """The offset an answer's count is held to: "stop" for every answer that ends in `<|im_end|>`."""
    return "stop" if finish in ENDED else finish


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space from k (terms shrink once k > n p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p
                        + (n - i) * log_q)
        total += term
        if i > n * p and term < 1e-17 * total:
            break
    return min(1.0, total)


@dataclass
class ProviderFidelity:
    """One provider's answers as the checks saw them."""

    answers: int = 0       # answers read: kept (served whole or repaired) and refused
    repaired: int = 0
    refused: int = 0       # reasoning billed, never served; or ids off the service's count (count_refused)
    count_refused: int = 0  # refused because their ids left the service's count by more than offset + tolerance
    count_unchecked: int = 0  # kept with no service count to hold their ids to (no usage.completion_tokens)
    counts: Counter = field(default_factory=Counter)  # (finish, completion_diff, prompt_diff) -> kept answers
    mismatch_before: int = 0  # count mismatches of earlier runs (their summary.json), beside this run's `counts`
    verdict: str = CONSISTENT
    evidence: str = ""

    def offsets(self) -> tuple[dict[str, int], int | None]:
        """Its constant offsets. Completion: on finished answers (stop, tool calls) 0 or -1, whichever is commoner
        (it counts `<|im_end|>` or not), on cut ones 0 (no `<|im_end|>` to count); never learned beyond that, so a
        text that shifts every count alike (spaces beside specials) is not mistaken for an offset. Prompt: the
        commonest."""
        stop: Counter = Counter()
        prompt: Counter = Counter()
        for (finish, cd, pd), n in self.counts.items():
            if finish in ENDED:
                stop[cd] += n
            prompt[pd] += n
        completion = {"stop": -1 if stop[-1] > stop[0] else 0}
        return completion, (prompt.most_common(1)[0][0] if prompt else None)

    @property
    def count_mismatch(self) -> int:
        """Kept answers whose counts differ from the provider's offsets."""
        completion, prompt = self.offsets()
        return self.mismatch_before + sum(n for (finish, cd, pd), n in self.counts.items()
                                          if cd != completion.get(_ending(finish), 0) or pd != prompt)

    def completion_offset(self, finish: str) -> int:
        """The completion offset (usage minus ids) its answer ending in `finish` is held to (0 until learned)."""
        return self.offsets()[0].get(_ending(finish), 0)

    def to_dict(self) -> dict[str, Any]:
        return {"answers": self.answers, "repaired": self.repaired, "refused": self.refused,
                "count_mismatch": self.count_mismatch, "count_refused": self.count_refused,
                "count_unchecked": self.count_unchecked, "verdict": self.verdict, "evidence": self.evidence}


@dataclass
class FidelityJudge:
    """Per-provider books and verdicts; `answer` / `refusal` return True when that provider just became suspect."""

    providers: dict[str, ProviderFidelity] = field(default_factory=dict)
    decides: bool = True  # False: books only (a dataset's share of a run); the run's judge gives the verdicts
    faithful_rate: float = FAITHFUL_RATE
    alpha: float = ALPHA
    min_answers: int = MIN_ANSWERS

    @classmethod
    def carried(cls, summaries: Iterable[Mapping[str, Any]], *, decides: bool = True) -> FidelityJudge:
        """The books of earlier runs, from their summary.json `fidelity` sections: counts carried as totals (a
        dataset's summary counts all its runs, as its records do), and a suspect stays suspect. Without this a
        later run, or a finished report run again, would rewrite summary.json without the verdict, and the
        suspect's records would pass into the training set."""
        judge = cls(decides=decides)
        for summary in summaries:
            for name, d in ((summary.get("fidelity") or {}).get("providers") or {}).items():
                p = judge._book(name)
                p.answers += int(d.get("answers", 0))
                p.repaired += int(d.get("repaired", 0))
                p.refused += int(d.get("refused", 0))
                p.count_refused += int(d.get("count_refused", 0))
                p.count_unchecked += int(d.get("count_unchecked", 0))
                p.mismatch_before += int(d.get("count_mismatch", 0))
                if d.get("verdict") == SUSPECT and p.verdict != SUSPECT:
                    p.verdict, p.evidence = SUSPECT, str(d.get("evidence", ""))
        return judge

    def _book(self, provider: str) -> ProviderFidelity:
        return self.providers.setdefault(provider or "?", ProviderFidelity())

    def answer(self, provider: str, check: Mapping[str, Any], finish_reason: str) -> bool:
        """A kept answer with its `meta.fidelity`."""
        p = self._book(provider)
        p.answers += 1
        p.repaired += bool(check.get("repaired"))
        cd, pd = check.get("completion_diff"), check.get("prompt_diff")
        p.count_unchecked += cd is None
        if cd is not None and pd is not None:
            p.counts[(finish_reason, cd, pd)] += 1
        return self.judge(p)

    def refusal(self, provider: str, *, count: bool = False) -> bool:
        """A refused answer; `count`: refused for its ids leaving the service's count (recording.count_refusal)."""
        p = self._book(provider)
        p.answers += 1
        p.refused += 1
        p.count_refused += count
        return self.judge(p)

    def completion_offset(self, provider: str, finish: str) -> int:
        """The offset `provider`'s count of an answer ending in `finish` is held to: its learned one, else 0."""
        p = self.providers.get(provider or "?")
        return p.completion_offset(finish) if p is not None else 0

    def judge(self, p: ProviderFidelity) -> bool:
        """The stated rule (module doc); True when `p` turns suspect now."""
        if not self.decides or p.verdict == SUSPECT or p.answers < self.min_answers:
            return False
        mismatch = p.count_mismatch
        bad = mismatch + p.refused
        if bad <= self.faithful_rate * p.answers:
            return False
        tail = binomial_tail(bad, p.answers, self.faithful_rate)
        if tail >= self.alpha:
            return False
        completion, prompt = p.offsets()
        p.verdict = SUSPECT
        p.evidence = (f"{bad} of {p.answers} answers bad ({mismatch} token counts off its offsets "
                      f"completion {completion or '-'} prompt {prompt if prompt is not None else '-'}, "
                      f"{p.refused} refused); a faithful provider's rate is at most {self.faithful_rate:.0%}: "
                      f"P = {tail:.1e} < {self.alpha:g}")
        return True

    @property
    def suspects(self) -> list[str]:
        return sorted(name for name, p in self.providers.items() if p.verdict == SUSPECT)

    def suspect_headlines(self) -> tuple[str, ...]:
        """`name: N of M answers bad` per suspect (the evidence's head): what the status line shows."""
        return tuple(f"{n}: {self.providers[n].evidence.split(' (')[0]}" for n in self.suspects)

    def summary(self, verdicts: FidelityJudge | None = None) -> dict[str, Any]:
        """`{"providers": {name: {answers, repaired, refused, count_mismatch, count_refused, count_unchecked, verdict,
        evidence}}}`; `verdicts`: the run's judge, whose verdicts a dataset's counts carry (providers are judged over
        the whole run)."""
        out = {}
        for name, p in sorted(self.providers.items()):
            d = p.to_dict()
            if verdicts is not None and name in verdicts.providers:
                d["verdict"], d["evidence"] = verdicts.providers[name].verdict, verdicts.providers[name].evidence
            out[name] = d
        return {"providers": out}


def suspects_in(summary: Mapping[str, Any]) -> dict[str, str]:
    """{suspect provider: its evidence} from a run's or a dataset's summary (its `fidelity` section, read by
    `summaries.fidelity_suspects`)."""
    return {name: f"fidelity while generating: {evidence}" for name, evidence in fidelity_suspects(summary).items()}


def ignore_suspects(summary: Mapping[str, Any] | str | Path, routing_path: str | Path):
    """Write the summary's suspect providers into the routing file's `provider.ignore`, each with its evidence
    (`routing.ignore_in_routing`), so the next run avoids them from its first request. `summary`: the dict
    `generate` returned, or a summary.json path. Returns the decision as written (unchanged when none is suspect)."""
    import json

    from ...openrouter import ignore_in_routing

    read = json.loads(Path(summary).read_text()) if isinstance(summary, (str, Path)) else summary
    return ignore_in_routing(suspects_in(read), routing_path)
