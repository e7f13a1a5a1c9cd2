"""Budget model: how many output tokens each dataset can have for the money (pure arithmetic), and
budget.ipynb's settings and the prices it plans with.

Cost of a dataset with output target T: T × price.completion + (T / mean output per request) ×
mean prompt tokens per request × price.prompt. Targets are chosen so the expected cost of the whole plan
stays within balance − reserve; the band (P50/P90) comes from the spread of output lengths and the
requests still in flight when a run stops issuing.

A request is one turn of a conversation (`turns: all`, see turns.py): turn j's prompt is the asks 1..j with
the model's answers to turns 1..j−1 between them, so prompts grow along a conversation. What can be
measured is measured exactly (the rendered asks and template, `measure_prompts`); the answers are not
written yet, so each earlier answer adds the expected content tokens of an answer (`ContentLengths`:
earlier runs' finished answers, else a share of the output guess). A dataset can send as many requests as
its conversations have turns; `turns: last` is one request per prompt, the prompt as written.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...files import iter_jsonl
from ...openrouter import Price, RoutingDecision, load_routing
from ...paths import dataset_files
from ...prompts import iter_prompts
from ...records import output_tokens
from ...text import Structure, Tokenizer, prompt_ids, render_chat
from ...text.tokenizer import KIMI_STRUCTURE
from ..config import BudgetConfig, Policy, PriceMode
from ..conversations.turns import Conversation, TurnsMode

Z90 = 1.2815515655446004  # standard normal 90th percentile


@dataclass(frozen=True)
class DatasetStats:
    """Prompt-side facts of one dataset: its requests' prompt tokens (measured with the real tokenizer and chat
    template, plus the expected contents of earlier answers) and how many requests its prompts make.

    With `turns: all` a prompt is a conversation of one request per user turn, so `requests` (what the run can
    send, and what caps a target) is the sum of the turns, not `prompts`; prompt-token figures are per request."""

    name: str
    prompts: int
    prompt_tokens_mean: float
    prompt_tokens_sd: float
    prompt_tokens_p50: float
    prompt_tokens_p90: float
    prompt_tokens_total: int
    requests: int | None = None  # None: one request per prompt
    turns_per_conversation: dict[int, int] | None = None  # requests in a conversation -> conversations
    turns_mean: float = field(init=False)

    def __post_init__(self) -> None:
        if self.requests is None:
            object.__setattr__(self, "requests", self.prompts)
        if self.turns_per_conversation is None:
            object.__setattr__(self, "turns_per_conversation", {1: self.prompts})
        object.__setattr__(self, "turns_mean", self.request_count / self.prompts if self.prompts else 0.0)

    @property
    def request_count(self) -> int:
        """`requests` as built: never None (None is only the constructor's "one per prompt")."""
        assert self.requests is not None
        return self.requests

    @classmethod
    def from_lengths(cls, name: str, lengths: Sequence[float] | np.ndarray, *, prompts: int | None = None,
                     extra_variance: float = 0.0,
                     turns_per_conversation: dict[int, int] | None = None) -> DatasetStats:
        """From each request's prompt tokens (one per prompt unless `prompts` says how many prompts made them).
        `extra_variance`: spread the lengths do not show (answers not yet written), added to their variance."""
        if len(lengths) == 0:
            raise InputError("dataset has no prompts", field=name)
        a = np.asarray(lengths, dtype=float)
        return cls(name, len(a) if prompts is None else prompts, float(a.mean()),
                   float(math.sqrt(a.var() + extra_variance)), float(np.percentile(a, 50)),
                   float(np.percentile(a, 90)), int(round(a.sum())), requests=len(a),
                   turns_per_conversation=turns_per_conversation)


@dataclass(frozen=True)
class ContentLengths:
    """Content tokens of one earlier answer, as the later turns of its conversation carry it in their prompts.

    Only the content counts: K2.5's template renders an earlier answer as `<think></think>` + content, so its
    reasoning costs later turns nothing. Only finished answers (`stop`) become history: a cut one ends its
    conversation."""

    mean: float
    sd: float
    source: str

    @classmethod
    def from_records(cls, paths: Iterable[str | Path], structure: Structure = KIMI_STRUCTURE) -> ContentLengths | None:
        """Content tokens of earlier runs' finished answers (the model's structural ids: `tok.structure`); None
        when there are none."""
        lengths, used = record_lengths(paths, lambda r: content_tokens(r, structure))
        if not lengths:
            return None
        a = np.asarray(lengths, dtype=float)
        return cls(float(a.mean()), float(a.std()),
                   f"content of {len(a):,} finished answers of earlier runs ({', '.join(used)})")

    @classmethod
    def prior(cls, lengths: OutputLengths, share: float) -> ContentLengths:
        """Before any finished answer exists: a share of the output-length model (the rest is reasoning)."""
        if not 0 <= share <= 1:
            raise InputError(f"must be within [0, 1], got {share!r}", field="prior_content_share")
        return cls(share * lengths.mean, share * lengths.sd, f"{share:g} x output lengths ({lengths.source})")


def record_lengths(paths: Iterable[str | Path], measure: Callable[[dict], int | None]) -> tuple[list[int], list[str]]:
    """`measure` of every record (as a dict) in the records files that exist, leaving out None; and the datasets
    (folder names) read."""
    lengths, used = [], []
    for p in map(Path, paths):
        if not p.is_file():
            continue
        used.append(p.parent.name)
        for _, rec in iter_jsonl(p, tolerate_torn_tail=True):
            if (n := measure(rec)) is not None:
                lengths.append(n)
    return lengths, used


def content_tokens(record: dict, structure: Structure = KIMI_STRUCTURE) -> int | None:
    """Content tokens of a record's answer if it finished (else None: a cut answer is never history).

    From the output ids (those after the end of reasoning `</think>`, less the closing end of turn `<|im_end|>`),
    else from usage: completion minus reasoning minus the closing specials (both, or the end of turn alone for a
    target without reasoning)."""
    if record.get("finish_reason") != "stop":
        return None
    ids = record.get("output_ids")
    close, end = structure.end_of_reasoning, structure.end_of_turn
    if ids:
        after = ids[ids.index(close) + 1:] if close is not None and close in ids else ids
        return len(after) - (1 if after and after[-1] == end else 0)
    usage = record.get("usage") or {}
    if not usage.get("completion_tokens"):
        return None
    return max(0, usage["completion_tokens"] - (usage.get("reasoning_tokens") or 0) - (2 if structure.reasons else 1))


@dataclass(frozen=True)
class PromptTurns:
    """A dataset's requests, measured as far as they can be before any answer exists: per request, its prompt
    tokens with every earlier answer's content left empty (the asks, the template, the generation prompt and
    each earlier answer's `<think></think>` and `<|im_end|>`), and how many earlier answers of the target it
    carries. Adding those answers' expected content gives the prompt tokens the run will send."""

    name: str
    turns: TurnsMode
    asks_tokens: np.ndarray = field(repr=False)       # per request
    earlier_answers: np.ndarray = field(repr=False)   # per request: its turn index within its conversation
    conversation_turns: np.ndarray = field(repr=False)  # per prompt: requests it makes

    def prompt_tokens(self, content_mean: float) -> np.ndarray:
        """Expected prompt tokens per request when each earlier answer has `content_mean` content tokens."""
        return self.asks_tokens + self.earlier_answers * content_mean

    def stats(self, content: ContentLengths | None = None) -> DatasetStats:
        """The dataset's stats with earlier answers at `content`'s mean (needed once any request carries one).
        The answers' spread adds (earlier answers) x sd² to each request's variance; P50/P90 are of the expected
        counts."""
        if content is None and self.earlier_answers.any():
            raise InputError("requests carry earlier answers: a content-length model is needed", field=self.name)
        mean, sd = (content.mean, content.sd) if content is not None else (0.0, 0.0)
        turns, counts = np.unique(self.conversation_turns, return_counts=True)
        return DatasetStats.from_lengths(
            self.name, self.prompt_tokens(mean), prompts=len(self.conversation_turns),
            extra_variance=float(self.earlier_answers.mean()) * sd ** 2,
            turns_per_conversation={int(t): int(c) for t, c in zip(turns, counts)})


@dataclass(frozen=True)
class _Scaffold:
    """Ids the template puts around a request, read off the template once: the generation prompt, and an
    earlier answer with empty content. None of the template's specials merge with text, so a conversation's
    turn-j prompt is its last prompt up to the j-th such answer, then the generation prompt."""

    generation: tuple[int, ...]
    empty_answer: tuple[int, ...]

    @classmethod
    def of(cls, tok: Tokenizer) -> _Scaffold | None:
        """None when the template does not render so (every turn is then rendered on its own)."""
        user = [{"role": "user", "content": "x"}]
        bare = tok.encode(render_chat(tok, user, add_generation_prompt=False), allow_special=True)
        asking = prompt_ids(tok, user)
        answered = tok.encode(render_chat(tok, [*user, {"role": "assistant", "content": ""}],
                                          add_generation_prompt=False), allow_special=True)
        if asking[:len(bare)] != bare or answered[:len(bare)] != bare or len(answered) == len(bare):
            return None
        return cls(tuple(asking[len(bare):]), tuple(answered[len(bare):]))

    def starts(self, ids: Sequence[int]) -> list[int]:
        """Where each empty answer begins in `ids`."""
        pat, n, out, i = self.empty_answer, len(self.empty_answer), [], 0
        while i <= len(ids) - n:
            if ids[i] == pat[0] and tuple(ids[i:i + n]) == pat:
                out.append(i)
                i += n
            else:
                i += 1
        return out


def turn_prompt_tokens(tok: Tokenizer, conversation: Conversation, scaffold: _Scaffold | None = None) -> list[int]:
    """Prompt tokens of each request of a conversation with every earlier answer's content empty.

    One render per conversation (its last request, cut at the answers): the template render costs milliseconds,
    and rendering every turn made measuring 5-turn conversations ~4x slower. Rendered turn by turn when the
    answers are not found exactly once each (an empty leading assistant message, the scaffold typed in a user
    turn)."""
    n = len(conversation.asks)
    empty = [conversation.stand_in(k) for k in range(n - 1)]
    tools = conversation.tools
    ids = prompt_ids(tok, conversation.turn(empty).messages, tools=tools)
    if n > 1 and scaffold is not None and len(starts := scaffold.starts(ids)) == n - 1:
        return [s + len(scaffold.generation) for s in starts] + [len(ids)]
    return [len(prompt_ids(tok, conversation.turn(empty[:k]).messages, tools=tools)) for k in range(n - 1)] + [len(ids)]


def measure_prompts(tok: Tokenizer, name: str, path: str | Path, turns: TurnsMode = "all",
                    tools: list[dict] | None = None) -> PromptTurns:
    """Every request a prompt file makes under `turns` (generation's setting), exactly as generation will render
    it (template + generation prompt), with the model's earlier answers left empty (`PromptTurns.stats` adds
    their expected content). `last` is one request per prompt: the prompt as written. `tools`: the dataset's
    declarations for prompts without their own (they are rendered into every request)."""
    if turns not in ("all", "last"):
        raise InputError(f"must be all or last, got {turns!r}", field="turns")
    scaffold = _Scaffold.of(tok)
    asks: list[int] = []
    earlier: list[int] = []
    per_conversation: list[int] = []
    for p in iter_prompts(path, tools=tools):
        lengths = turn_prompt_tokens(tok, Conversation.of(p, turns), scaffold)
        asks += lengths
        earlier += range(len(lengths))
        per_conversation.append(len(lengths))
    if not per_conversation:
        raise InputError("no prompts in file", path, field=name)
    return PromptTurns(name, turns, np.asarray(asks, dtype=np.int64), np.asarray(earlier, dtype=np.int64),
                       np.asarray(per_conversation, dtype=np.int64))


@dataclass(frozen=True)
class OutputLengths:
    """Output tokens per request (reasoning included), capped at max_tokens."""

    mean: float
    sd: float
    p50: float
    p90: float
    source: str
    samples: tuple[int, ...] = field(default=(), repr=False)

    @classmethod
    def from_samples(cls, samples: Iterable[int], source: str) -> OutputLengths:
        a = np.asarray(list(samples), dtype=float)
        if a.size == 0:
            raise InputError("no output lengths to model from", field="output_lengths")
        return cls(float(a.mean()), float(a.std()), float(np.percentile(a, 50)), float(np.percentile(a, 90)),
                   source, tuple(int(x) for x in a[:200_000]))

    @classmethod
    def lognormal(cls, median: float, sigma: float, max_tokens: int, n: int = 200_000,
                  seed: int = 0) -> OutputLengths:
        """A parametric guess before any run: reasoning lengths are roughly log-normal."""
        if median <= 0 or sigma < 0 or max_tokens <= 0:
            raise InputError("median and max_tokens must be > 0, sigma >= 0", field="output_lengths")
        a = np.minimum(np.random.default_rng(seed).lognormal(math.log(median), sigma, n), max_tokens).round()
        return cls.from_samples(a.astype(int), f"lognormal(median={median:g}, sigma={sigma:g}, cap={max_tokens})")

    @classmethod
    def from_records(cls, paths: Iterable[str | Path]) -> OutputLengths | None:
        """Completion tokens of earlier runs (usage, else output ids); None when there are none."""
        lengths, used = record_lengths(
            paths, lambda rec: output_tokens((rec.get("usage") or {}).get("completion_tokens"), rec.get("output_ids"))
            or None)
        if not lengths:
            return None
        return cls.from_samples(lengths, f"{len(lengths):,} records of earlier runs ({', '.join(used)})")


@dataclass(frozen=True)
class Prices(Price):
    """The price a plan assumes, and where it came from."""

    source: str = ""

    @classmethod
    def from_routing(cls, decision: RoutingDecision, mode: PriceMode = "cheapest",
                     mix: dict[str, float] | None = None) -> Prices:
        """Prices to plan with: the cheapest eligible endpoint (sort=price routes there), the most
        expensive eligible one (a safe bound), or a weighted mix of providers (e.g. observed shares)."""
        priced = {e.provider: e.price for e in decision.eligible if e.priced}
        if not priced:
            raise InputError("the routing decision has no priced eligible endpoint", field="routing")
        if mode == "cheapest":
            best = decision.cheapest()
            assert best is not None  # some eligible endpoint is priced
            return cls(best.price.prompt_per_m, best.price.completion_per_m, f"cheapest eligible ({best.provider})")
        if mode == "worst":
            worst = decision.worst_price()
            assert worst is not None  # some eligible endpoint is priced
            return cls(worst.prompt_per_m, worst.completion_per_m, "most expensive eligible")
        if mode == "mix":
            if not mix or set(mix) - set(priced) or sum(mix.values()) <= 0:
                raise InputError(f"mix must weight eligible priced providers {sorted(priced)}", field="mix")
            total = sum(mix.values())
            return cls(sum(priced[p].prompt_per_m * w for p, w in mix.items()) / total,
                       sum(priced[p].completion_per_m * w for p, w in mix.items()) / total, f"mix {mix}")
        raise InputError("must be cheapest, worst or mix", field="price_mode")


def cost_usd(output_tokens: float, stats: DatasetStats, lengths: OutputLengths, prices: Prices) -> tuple[float, float]:
    """(input $, output $) expected for an output-token target."""
    requests = output_tokens / lengths.mean
    return (requests * stats.prompt_tokens_mean * prices.prompt_per_m / 1e6,
            output_tokens * prices.completion_per_m / 1e6)


def cost_band(output_tokens: float, stats: DatasetStats, lengths: OutputLengths, prices: Prices,
              concurrency: int) -> tuple[float, float]:
    """(P50, P90) of the total cost. Requests needed to reach T vary (renewal: var N ≈ T·σ²/μ³), prompts
    vary, and the requests in flight at the stop (at most `concurrency`) add a zero-mean spread of √c·σ tokens."""
    mu, sd = lengths.mean, lengths.sd
    n = output_tokens / mu
    var_n = output_tokens * sd ** 2 / mu ** 3
    p_in, p_out = prices.prompt_per_m / 1e6, prices.completion_per_m / 1e6
    var_in = (var_n * stats.prompt_tokens_mean ** 2 + n * stats.prompt_tokens_sd ** 2) * p_in ** 2
    var_out = min(concurrency, n) * sd ** 2 * p_out ** 2
    p50 = sum(cost_usd(output_tokens, stats, lengths, prices))
    return p50, p50 + Z90 * math.sqrt(var_in + var_out)


@dataclass(kw_only=True)
class DatasetPlan:
    name: str
    prompts: int
    requests_available: int  # turns of all its conversations: what the run can send
    target_output_tokens: int
    requests: int
    input_usd: float
    output_usd: float
    total_usd: float
    p50_usd: float
    p90_usd: float
    limited_by_prompts: bool


@dataclass
class Plan:
    datasets: list[DatasetPlan]
    balance_usd: float
    reserve_usd: float
    prices: Prices
    lengths_source: str
    policy: str

    @property
    def usable_usd(self) -> float:
        return self.balance_usd - self.reserve_usd

    @property
    def total_usd(self) -> float:
        return sum(d.total_usd for d in self.datasets)

    @property
    def targets(self) -> dict[str, int]:
        return {d.name: d.target_output_tokens for d in self.datasets}

    @property
    def planned_usd(self) -> dict[str, float]:
        """What each target is expected to cost (the run draws it as its planned spend line)."""
        return {d.name: d.total_usd for d in self.datasets}

    def frame(self):
        import pandas as pd

        df = pd.DataFrame([asdict(d) for d in self.datasets])
        total = df.sum(numeric_only=True).astype(object)  # it takes the name and the flag too
        total["name"], total["limited_by_prompts"] = "TOTAL", df["limited_by_prompts"].any()
        # P90s do not add up; the plan's P90 is the root-sum-square of the per-dataset spreads.
        total["p90_usd"] = total["p50_usd"] + math.sqrt(sum((d.p90_usd - d.p50_usd) ** 2 for d in self.datasets))
        # the total row as a column of the datasets' types: counts stay integers (not "92.00" under a float format)
        return pd.concat([df, total.to_frame().T], ignore_index=True).astype(df.dtypes.to_dict())


def _check_money(balance_usd: float | None, reserve_usd: float) -> None:
    if balance_usd is None or not isinstance(balance_usd, (int, float)) or not math.isfinite(balance_usd) \
            or balance_usd <= 0:
        raise InputError(f"must be a positive number of USD, got {balance_usd!r}", field="budget_usd")
    if not isinstance(reserve_usd, (int, float)) or reserve_usd < 0 or reserve_usd >= balance_usd:
        raise InputError(f"must be >= 0 and below the budget ({balance_usd}), got {reserve_usd!r}",
                         field="reserve_usd")


def _round_down(target: float, round_to: int) -> int:
    """`target` rounded down to a multiple of `round_to`, or to whole tokens when it is below one `round_to`."""
    if round_to > 1 and target >= round_to:
        return int(target // round_to * round_to)
    return int(target)


def plan_budget(stats: Sequence[DatasetStats], lengths: OutputLengths, prices: Prices, *, balance_usd: float,
                reserve_usd: float = 0.0, policy: Policy = "equal", weights: dict[str, float] | None = None,
                round_to: int = 100_000, concurrency: int = 2000) -> Plan:
    """Output-token targets whose expected total cost fits balance − reserve.

    Weights per dataset (equal, by requests available, or the user's) share the money; a dataset that would
    need more requests than it has (its prompts' turns: one request each) is capped at what they can give and
    the rest is shared among the others. Targets are rounded down to `round_to` tokens; one below `round_to` (a
    small dataset whose prompts give fewer tokens, or little money) is kept as it is, whole tokens rounded down, so
    a positive target never becomes 0 (which the datasets file refuses) and never exceeds what the money or the
    prompts can give. A dataset with no weight gets 0.
    """
    _check_money(balance_usd, reserve_usd)
    if not stats:
        raise InputError("no datasets to plan", field="datasets")
    for s in stats:
        if s.prompts <= 0:
            raise InputError("dataset has no prompts", field=s.name)
    if policy == "equal":
        w = {s.name: 1.0 for s in stats}
    elif policy == "proportional":
        w = {s.name: float(s.request_count) for s in stats}
    elif policy == "weights":
        if not weights or set(weights) != {s.name for s in stats} or any(v < 0 for v in weights.values()):
            raise InputError("give a non-negative weight for every dataset", field="weights")
        w = {k: float(v) for k, v in weights.items()}
    else:
        raise InputError("must be equal, proportional or weights", field="policy")

    per_token = {s.name: sum(cost_usd(1.0, s, lengths, prices)) for s in stats}
    cap = {s.name: s.request_count * lengths.mean for s in stats}  # every turn answered once
    targets: dict[str, float] = {}
    money = balance_usd - reserve_usd
    active = [s.name for s in stats if w[s.name] > 0]
    while active:  # water-filling: fix the datasets whose prompts run out, share the rest again
        scale = money / sum(per_token[n] * w[n] for n in active)
        over = [n for n in active if w[n] * scale >= cap[n]]
        if not over:
            targets.update({n: w[n] * scale for n in active})
            break
        for n in over:
            targets[n] = cap[n]
            money -= cap[n] * per_token[n]
            active.remove(n)

    plans = []
    for s in stats:
        t = _round_down(targets.get(s.name, 0.0), round_to)
        inp, out = cost_usd(t, s, lengths, prices)
        p50, p90 = cost_band(t, s, lengths, prices, concurrency)
        plans.append(DatasetPlan(name=s.name, prompts=s.prompts, requests_available=s.request_count,
                                 target_output_tokens=t, requests=math.ceil(t / lengths.mean), input_usd=inp,
                                 output_usd=out, total_usd=inp + out, p50_usd=p50, p90_usd=p90,
                                 limited_by_prompts=s.name in targets and targets[s.name] >= cap[s.name]))
    return Plan(plans, balance_usd, reserve_usd, prices, lengths.source, policy)


def scenario_table(stats: Sequence[DatasetStats], lengths: OutputLengths, prices: Prices,
                   per_dataset_targets: Sequence[int], balance_usd: float, reserve_usd: float = 0.0):
    """Cost of giving every dataset the same target, for several targets: does it fit?"""
    import pandas as pd

    _check_money(balance_usd, reserve_usd)
    rows = []
    for t in per_dataset_targets:
        inp = sum(cost_usd(t, s, lengths, prices)[0] for s in stats)
        out = sum(cost_usd(t, s, lengths, prices)[1] for s in stats)
        rows.append({"per_dataset_output_tokens": t, "datasets": len(stats), "output_tokens": t * len(stats),
                     "input_usd": inp, "output_usd": out, "total_usd": inp + out,
                     "fits_balance": inp + out <= balance_usd, "fits_usable": inp + out <= balance_usd - reserve_usd})
    return pd.DataFrame(rows)


def planned_vs_actual(plan: Plan, output_dir: str | Path):
    """Per dataset: planned tokens and $ against what each run's summary.json says it did."""
    import pandas as pd

    rows = []
    for d in plan.datasets:
        path = dataset_files(d.name, output_dir).summary
        if not path.is_file():
            continue
        try:
            s = json.loads(path.read_text())
            actual_tokens, actual_usd = int(s["output_tokens"]), float(s["spend_usd"])
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"not a run summary ({e})", path) from None
        rows.append({"dataset": d.name, "planned_tokens": d.target_output_tokens, "actual_tokens": actual_tokens,
                     "planned_usd": d.total_usd, "actual_usd": actual_usd,
                     "planned_usd_per_m": 1e6 * d.total_usd / max(1, d.target_output_tokens),
                     "actual_usd_per_m": 1e6 * actual_usd / max(1, actual_tokens)})
    return pd.DataFrame(rows, columns=["dataset", "planned_tokens", "actual_tokens", "planned_usd", "actual_usd",
                                       "planned_usd_per_m", "actual_usd_per_m"])


def plot_plan(plan: Plan, stats: Sequence[DatasetStats], lengths: OutputLengths):
    """Cost vs per-dataset target with the budget lines; the chosen allocation per dataset."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    top = max(d.target_output_tokens for d in plan.datasets) * 1.6 or 1e6
    xs = np.linspace(0, top, 50)
    ys = [sum(sum(cost_usd(x, s, lengths, plan.prices)) for s in stats) for x in xs]
    ax1.plot(xs / 1e6, ys, label="every dataset at this target")
    ax1.axhline(plan.balance_usd, color="tab:red", label=f"balance ${plan.balance_usd:g}")
    ax1.axhline(plan.usable_usd, color="tab:orange", ls="--", label=f"usable ${plan.usable_usd:g}")
    ax1.set_xlabel("output tokens per dataset (M)")
    ax1.set_ylabel("expected cost ($)")
    ax1.legend(fontsize=8)
    names = [d.name for d in plan.datasets]
    ax2.bar(names, [d.target_output_tokens / 1e6 for d in plan.datasets], color="tab:blue")
    for i, d in enumerate(plan.datasets):
        ax2.annotate(f"${d.total_usd:.2f}", (i, d.target_output_tokens / 1e6), ha="center", va="bottom", fontsize=8)
    ax2.set_ylabel("target output tokens (M)")
    ax2.set_title(f"allocation ({plan.policy})")
    fig.tight_layout()
    return fig


# -- budget.ipynb's prices ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PriceBasis:
    """The prices a plan assumes and where they come from: a routing file, or the catalog judged now."""

    prices: Prices
    decision: RoutingDecision
    routing_file: Path | None  # None: no decision on disk, derived from the catalog
    note: str                  # one sentence for the reader


async def plan_prices(cfg: BudgetConfig) -> PriceBasis:
    """The prices budget.ipynb plans with.

    With no routing decision yet (providers.ipynb has not run) the plan still works: the endpoint catalog (a
    snapshot, the emulator or live OpenRouter) is judged now under the default precision policy and the plan
    takes its cheapest eligible price, and says so. A routing file named explicitly must exist."""
    path = cfg.routing_path()
    if cfg.routing and not path.is_file():
        raise InputError("routing decision not found", path, field="routing")
    decision = await load_routing(cfg.model, base_url=cfg.base_url, api_key_env=cfg.api_key_env, path=path,
                                  snapshot=cfg.snapshot)
    prices = Prices.from_routing(decision, cfg.price_mode, cfg.price_mix)
    if path.is_file():
        return PriceBasis(prices, decision, path, f"prices from the routing decision {path}: {prices.source}")
    catalog = decision.source.removeprefix("derived at run time from ")
    return PriceBasis(prices, decision, None,
                      f"no routing decision at {path} (providers.ipynb writes it): prices from the endpoint catalog "
                      f"({catalog}) under the default precision policy: {prices.source}")
