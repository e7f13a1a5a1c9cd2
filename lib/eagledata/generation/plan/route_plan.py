"""The time–money plan behind budget.ipynb's "Time and money by route": the same targets through OpenRouter in
realtime, through Moonshot's Batch API (first-party weights at its batch price, answers within a window), or split
between them by dataset, each with its $ and its expected and worst-case time; with a deadline, the cheapest plan
whose time meets it, and the generate command(s) that run it (pure arithmetic, apart from `plan_routes`' inputs).

Realtime time: the longer of two. A small job is as slow as its answers (`realtime_seconds`: a pool of `concurrency`
slots simulated at the routed endpoint's per-request speed and latency, a conversation's turns one after another, the
run ending when the tokens delivered reach the targets: 225 requests wait for their longest answer, not 48 s); its
worst case at the slowest eligible endpoint's speed and latency. A big job is as slow as the pool: output tokens ÷ a
realtime run's output tokens/s. By default the reference run's measured ~21k tok/s
at 2,000 in flight (DESIGN.md), scaled to `concurrency`: it includes what an endpoint's per-request speed ×
concurrency leaves out (429s, queueing, prompt processing, the long answers' tail), and a routing file does not keep
the endpoints' throughput anyway. When the endpoint sort=price routes to lists a per-request speed, speed ×
concurrency bounds it from above and the lower of the two is used. A run makes one pool over all its datasets, so
its time is the sum of their tokens over one rate.

Batch time: rounds. Turn j of a conversation can only be asked once turn j−1's answer is back, so a dataset whose
longest conversation has k user turns needs k rounds (turn j in round j; k = 1 with `turns: last`). The batch route
(batch/plan.py) sends the budget model's estimate first (`batch_first_round` of the target) and tops up in the next
round on the answers measured so far, as new conversations beside the earlier ones' next turns: each top-up starts a
round after the one before and adds one round, so k + `batch_topups` rounds (one top-up is the rule: the first round
aims below the target, a top-up a little over it). A round ends within the window (worst: rounds × window, the
Batch API's own bound) and typically sooner (expected: rounds × `batch_round_expected_h`, an assumption: Moonshot
documents the window, not a turnaround).
Datasets run side by side, so the batch part takes as long as its deepest dataset.

A mixed plan runs the batch part and the realtime part at once (two accounts, disjoint datasets): it takes the longer
of the two. Deadlines are judged on `basis`: `worst` by default (the batch part's rounds × window; realtime has no
documented bound, so its estimate stands for both), or `expected`.
"""
from __future__ import annotations

import heapq
import itertools
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

import numpy as np

from ...defaults import is_emulator
from ...errors import InputError
from ...moonshot import facts
from ...openrouter import Endpoint
from ...openrouter import cheapest as pick_cheapest
from ..config import BudgetConfig, GenerateConfig, Route
from .budget import DatasetStats, OutputLengths, Plan, PriceBasis, Prices, cost_usd

Basis = Literal["worst", "expected"]
ROUTES: tuple[Route, ...] = ("realtime", "batch")

# DESIGN.md: the comparable real run made ~42M output tokens in 33 minutes (~21k tok/s) with 2,000 requests in flight.
REFERENCE_OUTPUT_TPS = 21_000.0
REFERENCE_CONCURRENCY = 2000
EXHAUSTIVE_MAX = 12  # datasets up to which every split is priced (2^12 = 4,096 plans); beyond, splits by depth


@dataclass(frozen=True)
class DatasetWork:
    """One dataset's target as each route makes it: its tokens and requests (the budget plan's), the turns of its
    longest conversation (what the batch route's rounds follow) and its $ at each route's price."""

    name: str
    output_tokens: int
    requests: int
    max_turns: int
    realtime_usd: float
    batch_usd: float
    available: int = 0                                   # requests its prompts can make (0: `requests`)
    turns: tuple[tuple[int, int], ...] = ()              # (turns, conversations) of its prompts (): one turn each

    def usd(self, route: Route) -> float:
        return self.batch_usd if route == "batch" else self.realtime_usd


@dataclass(frozen=True)
class AnswerTimes:
    """How long one realtime answer takes: its first token after `latency_s`, then `speed_tps` output tokens/s (the
    routed endpoint's figures, else the pool's rate shared by its requests); `worst_*`: the slow case's."""

    speed_tps: float
    latency_s: float
    worst_speed_tps: float
    worst_latency_s: float
    source: str


@dataclass(frozen=True)
class Throughput:
    """Output tokens/s a realtime run makes, and on what grounds; with `answers` (and `concurrency`, the lengths'
    `samples`), how long its answers take, so a small job's time is its answers' (`realtime_hours`), not its tokens
    over the pool's rate."""

    output_tps: float
    source: str
    answers: AnswerTimes | None = None
    concurrency: int = REFERENCE_CONCURRENCY
    samples: tuple[int, ...] = field(default=(), repr=False)

    def hours(self, work: Sequence[DatasetWork]) -> tuple[float, float]:
        """(expected, worst) hours for `work`'s targets in one pool: at least their tokens over the pool's rate, and
        with an answer-time model at least the time a simulated pool takes to deliver them (`realtime_seconds`)."""
        tokens = sum(w.output_tokens for w in work)
        pooled = tokens / self.output_tps / 3600
        if self.answers is None or not work or not self.samples:
            return pooled, pooled
        a = self.answers
        expected = realtime_seconds(work, self.samples, self.concurrency, a.speed_tps, a.latency_s) / 3600
        worst = realtime_seconds(work, self.samples, self.concurrency, a.worst_speed_tps, a.worst_latency_s) / 3600
        return max(pooled, expected), max(pooled, expected, worst)


SIMULATED = 2000  # requests a realtime run is simulated with at most (a bigger one at scale: its pool and targets too)


def realtime_seconds(work: Sequence[DatasetWork], samples: Sequence[int], concurrency: int, speed_tps: float,
                     latency_s: float, *, seed: int = 0) -> float:
    """Seconds until a realtime run's streams have delivered `work`'s targets together (cut mode: the run ends when
    the tokens delivered reach them). A pool of `concurrency` slots, each answer `latency_s` then `speed_tps` tokens/s
    of a length drawn from `samples`; a conversation's next turn asked when its answer before is in (first in line);
    new conversations while the prompts last (cut mode keeps the pool full until the cut). Bigger jobs are simulated at
    scale (`SIMULATED` requests, the pool and targets alike): its time is in its waves, not its count."""
    rng = np.random.default_rng(seed)
    requests = sum(w.requests for w in work)
    if requests <= 0:
        return 0.0
    scale = min(1.0, SIMULATED / requests)
    slots = max(1, round(concurrency * scale))
    target = sum(w.output_tokens for w in work) * scale
    chains: list[int] = []  # turns of each conversation the run may start, in the order it starts them
    for w in work:
        depths = [(t, n) for t, n in w.turns] or [(1, max(w.available, w.requests))]
        per = sum(t * n for t, n in depths)
        room = max(w.available, w.requests) * scale
        for t, n in depths:
            chains += [t] * max(1 if n else 0, round(n * room / per))
    rng.shuffle(chains)
    lengths = rng.choice(np.asarray(samples, dtype=float), size=sum(chains))
    free = [0.0] * slots
    heapq.heapify(free)
    starts: list[float] = []
    sizes: list[float] = []
    ready: list[tuple[float, int]] = []  # (time, turns left) of next turns waiting for a slot
    delivered = 0.0
    nxt = 0
    while True:
        at = heapq.heappop(free)
        if ready and ready[0][0] <= at:
            _, left = heapq.heappop(ready)
        elif nxt < len(chains):
            left, nxt = chains[nxt], nxt + 1
        elif ready:
            when, left = heapq.heappop(ready)
            at = max(at, when)
        else:
            break
        size = lengths[len(sizes)]
        starts.append(at)
        sizes.append(size)
        end = at + latency_s + size / speed_tps
        heapq.heappush(free, end)
        if left > 1:
            heapq.heappush(ready, (end, left - 1))
        delivered = max(delivered, end)
    start, size = np.asarray(starts), np.asarray(sizes)

    def got(t: float) -> float:
        return float(np.clip((t - start - latency_s) * speed_tps, 0.0, size).sum())

    if got(delivered) < target:
        return delivered
    lo, hi = 0.0, delivered
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if got(mid) < target else (lo, mid)
    return hi


@dataclass(frozen=True)
class BatchTiming:
    """How long the batch route's rounds take: up to `window_h` each, typically `round_expected_h`."""

    window_h: float
    round_expected_h: float
    topups: int = 1

    def rounds(self, max_turns: int) -> int:
        """Rounds of a dataset whose longest conversation has `max_turns` turns: its turns, and each top-up starting
        (new conversations as deep) one round after the one before."""
        return batch_rounds(max_turns, self.topups)


def batch_rounds(max_turns: int, topups: int = 1) -> int:
    """The batch route's rounds for a dataset whose longest conversation has `max_turns` turns: turn j goes in round
    j, and each top-up starts one round later (generate plans one: batch/plan.py's second round reaches the target)."""
    return max_turns + topups


@dataclass(frozen=True)
class RoutePlan:
    """Every dataset on a route: what it costs and how long it takes."""

    name: str                 # realtime | batch | mixed
    routes: dict[str, Route]  # dataset -> route
    usd: float
    realtime_usd: float
    batch_usd: float
    realtime_output_tokens: int
    realtime_h: float         # the realtime part, expected (Throughput.hours)
    batch_rounds: int         # the batch part: its deepest dataset's rounds
    batch_expected_h: float
    batch_worst_h: float
    realtime_worst_h: float = 0.0  # the realtime part in the slow case (its answers at the slow endpoints' speed)

    @property
    def expected_h(self) -> float:
        return max(self.realtime_h, self.batch_expected_h)

    @property
    def worst_h(self) -> float:
        return max(self.realtime_h, self.realtime_worst_h, self.batch_worst_h)

    def time_h(self, basis: Basis) -> float:
        return self.worst_h if basis == "worst" else self.expected_h

    def datasets(self, route: Route) -> list[str]:
        return [n for n, r in self.routes.items() if r == route]


def price_split(work: Sequence[DatasetWork], routes: dict[str, Route], throughput: Throughput,
                timing: BatchTiming, name: str | None = None) -> RoutePlan:
    """The plan that sends each dataset the way `routes` says (named realtime, batch or mixed unless `name`)."""
    if set(routes) != {w.name for w in work}:
        raise InputError(f"a route for every dataset: {sorted(w.name for w in work)}", field="routes")
    realtime = [w for w in work if routes[w.name] == "realtime"]
    batch = [w for w in work if routes[w.name] == "batch"]
    tokens = sum(w.output_tokens for w in realtime)
    realtime_h, realtime_worst_h = throughput.hours(realtime)
    rounds = max((timing.rounds(w.max_turns) for w in batch), default=0)
    kinds = {routes[w.name] for w in work}
    return RoutePlan(
        name=name or (kinds.pop() if len(kinds) == 1 else "mixed"), routes=dict(routes),
        usd=sum(w.usd(routes[w.name]) for w in work), realtime_usd=sum(w.realtime_usd for w in realtime),
        batch_usd=sum(w.batch_usd for w in batch), realtime_output_tokens=tokens,
        realtime_h=realtime_h, batch_rounds=rounds, realtime_worst_h=realtime_worst_h,
        batch_expected_h=rounds * min(timing.round_expected_h, timing.window_h), batch_worst_h=rounds * timing.window_h)


@dataclass
class RouteChoice:
    """The routes priced for the targets, and the one to run."""

    rows: list[RoutePlan]      # the table: realtime, batch (when the model has one), mixed (when one is worth it)
    splits: list[RoutePlan]    # every split priced (the plot's cloud)
    deadline_h: float | None
    basis: Basis
    chosen: RoutePlan | None   # None: no plan meets the deadline (or nothing to generate)
    verdict: str
    throughput: Throughput
    timing: BatchTiming
    commands: list[str] = field(default_factory=list)

    def meets(self, plan: RoutePlan) -> bool:
        return self.deadline_h is None or plan.time_h(self.basis) <= self.deadline_h

    def frame(self):
        import pandas as pd

        realtime = next((r.usd for r in self.rows if r.name == "realtime"), None)
        return pd.DataFrame([{
            "route": r.name, "batch": ", ".join(r.datasets("batch")), "realtime": ", ".join(r.datasets("realtime")),
            "usd": r.usd, "vs_realtime": r.usd / realtime if realtime else None, "batch_rounds": r.batch_rounds,
            "expected": hours_text(r.expected_h), "worst": hours_text(r.worst_h), "meets_deadline": self.meets(r),
            "chosen": r is self.chosen} for r in self.rows])

    def to_dict(self) -> dict:
        """For `publish`: the rows, the choice and why, the commands, the assumptions."""
        def row(r: RoutePlan) -> dict:
            return {**asdict(r), "expected_h": r.expected_h, "worst_h": r.worst_h, "meets_deadline": self.meets(r)}
        return {"rows": [row(r) for r in self.rows], "chosen": None if self.chosen is None else row(self.chosen),
                "deadline_h": self.deadline_h, "basis": self.basis, "verdict": self.verdict,
                "commands": self.commands, "throughput": asdict(self.throughput), "timing": asdict(self.timing)}


def hours_text(h: float) -> str:
    """A duration for a reader: seconds under a minute, minutes under an hour, days from two days."""
    if h < 1 / 60:
        return f"{h * 3600:.0f} s"
    if h < 1:
        return f"{h * 60:.0f} min"
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} d"


def _splits(work: Sequence[DatasetWork], routes: Sequence[Route]) -> Iterable[dict[str, Route]]:
    """Every assignment of the routes to the datasets; with many datasets, the splits by depth (the datasets of at
    most r turns batch, the deeper ones realtime), which hold both pure plans."""
    names = [w.name for w in work]
    if len(routes) == 1 or len(work) <= EXHAUSTIVE_MAX:
        for combo in itertools.product(routes, repeat=len(names)):
            yield dict(zip(names, combo))
        return
    for depth in sorted({0, *(w.max_turns for w in work)}):
        yield {w.name: "batch" if w.max_turns <= depth else "realtime" for w in work}


def _cheapest(plans: Iterable[RoutePlan], basis: Basis) -> RoutePlan | None:
    """The cheapest plan; at equal $, the sooner."""
    return min(plans, key=lambda p: (round(p.usd, 9), p.time_h(basis)), default=None)


def choose_route(work: Sequence[DatasetWork], throughput: Throughput, timing: BatchTiming, *,
                 deadline_h: float | None = None, basis: Basis = "worst", batch: bool = True) -> RouteChoice:
    """Price every split of the datasets between the routes and pick the cheapest whose time (on `basis`) meets the
    deadline (none: the cheapest). The table's mixed row is the cheapest split that is neither pure plan and meets
    the deadline; with no deadline, the cheapest that finishes sooner than batch alone. `batch=False`: the model has
    no batch route (realtime only)."""
    if basis not in ("worst", "expected"):
        raise InputError(f"must be worst or expected, got {basis!r}", field="deadline_basis")
    if deadline_h is not None and not deadline_h > 0:
        raise InputError(f"must be > 0 or None, got {deadline_h!r}", field="deadline_h")
    if not throughput.output_tps > 0:
        raise InputError(f"must be > 0, got {throughput.output_tps!r}", field="realtime_output_tps")
    work = [w for w in work if w.output_tokens > 0]
    if not work:
        return RouteChoice([], [], deadline_h, basis, None, "no dataset has a target: nothing to generate",
                           throughput, timing)
    routes: tuple[Route, ...] = ROUTES if batch else ("realtime",)
    splits = [price_split(work, s, throughput, timing) for s in _splits(work, routes)]
    pure = {p.name: p for p in splits if p.name != "mixed"}

    def meets(p: RoutePlan) -> bool:
        return deadline_h is None or p.time_h(basis) <= deadline_h

    sooner = (lambda p: p.time_h(basis) < pure["batch"].time_h(basis)) if deadline_h is None and batch else meets
    mixed = _cheapest((p for p in splits if p.name == "mixed" and sooner(p)), basis)
    rows = [pure[r] for r in routes] + ([mixed] if mixed is not None else [])
    chosen = _cheapest((r for r in rows if meets(r)), basis)
    return RouteChoice(rows, splits, deadline_h, basis, chosen,
                       _verdict(rows, chosen, deadline_h, basis, batch), throughput, timing)


def _verdict(rows: list[RoutePlan], chosen: RoutePlan | None, deadline_h: float | None, basis: Basis,
             batch: bool) -> str:
    realtime = rows[0]
    judged = f"judged on the {'worst-case' if basis == 'worst' else 'expected'} time"
    if chosen is None:
        fastest = min(rows, key=lambda r: r.time_h(basis))
        return (f"NO PLAN MEETS THE DEADLINE of {hours_text(deadline_h or 0)} ({judged}): the fastest, {fastest.name}, "
                f"takes {hours_text(fastest.time_h(basis))}. Give more time (deadline_h), smaller targets, or a "
                f"faster realtime run (concurrency).")
    when = "no deadline" if deadline_h is None else f"deadline {hours_text(deadline_h)} ({judged})"
    share = f", {chosen.usd / realtime.usd:.0%} of realtime's ${realtime.usd:,.2f}" \
        if realtime.usd and chosen is not realtime else ""
    text = (f"{when}: {chosen.name}, ${chosen.usd:,.2f}{share}; expected {hours_text(chosen.expected_h)}, "
            f"worst case {hours_text(chosen.worst_h)}")
    if chosen.name == "mixed":
        text += (f" (batch: {', '.join(chosen.datasets('batch'))}, {chosen.batch_rounds} rounds; realtime: "
                 f"{', '.join(chosen.datasets('realtime'))}; start both at once: two accounts, separate datasets)")
    if not batch:
        text += " (the model has no batch route)"
    return text + "."


# -- from budget.ipynb's objects -----------------------------------------------------------------------------
def batch_prices(model: str) -> Prices | None:
    """The Batch API's price for the API model id (`moonshotai/kimi-k2.5` → `kimi-k2.5`); None when it serves none
    of that name."""
    slug = model.rsplit("/", 1)[-1]
    if slug not in facts.BATCH_MODELS:
        return None
    m = facts.batch_model(slug)
    return Prices(m.prompt_per_m, m.completion_per_m, f"Moonshot Batch API {slug} ({facts.DISCOUNT:.0%} off "
                                                      f"${m.realtime_prompt_per_m:g}/${m.realtime_completion_per_m:g})")


def dataset_work(plan: Plan, stats: Sequence[DatasetStats], lengths: OutputLengths,
                 batch: Prices | None) -> list[DatasetWork]:
    """The budget plan's targets as route work: realtime $ as planned, batch $ at the batch price (the same tokens
    and requests), the turns of each dataset's longest conversation."""
    by_name = {s.name: s for s in stats}
    out = []
    for d in plan.datasets:
        s = by_name[d.name]
        turns = max(s.turns_per_conversation or {1: s.prompts})
        batch_usd = sum(cost_usd(d.target_output_tokens, s, lengths, batch)) if batch is not None else float("inf")
        out.append(DatasetWork(d.name, d.target_output_tokens, d.requests, turns, d.total_usd, batch_usd,
                               available=d.requests_available,
                               turns=tuple(sorted((s.turns_per_conversation or {}).items()))))
    return out


def answer_times(throughput: Throughput, endpoints: Sequence[Endpoint], concurrency: int) -> AnswerTimes:
    """How long a realtime answer takes, from the routed endpoints' figures (the cheapest, where sort=price sends
    them; the slow case: the slowest eligible one's speed and latency): else each request at the pool's rate shared
    by `concurrency`, no latency (and half that speed in the slow case)."""
    shared = throughput.output_tps / concurrency
    cheapest = pick_cheapest(list(endpoints)) if endpoints else None
    speeds = [e.throughput_tps for e in endpoints if e.throughput_tps]
    latencies = [e.latency_s for e in endpoints if e.latency_s is not None]
    if cheapest is not None and cheapest.throughput_tps:
        latency = cheapest.latency_s or 0.0
        return AnswerTimes(cheapest.throughput_tps, latency, min(speeds), max([latency, *latencies]),
                           f"{cheapest.provider}'s {cheapest.throughput_tps:g} tok/s per request after {latency:g} s "
                           f"(slow case: {min(speeds):g} tok/s after {max([latency, *latencies]):g} s)")
    return AnswerTimes(shared, 0.0, shared / 2, 0.0,
                       f"the pool's rate shared by {concurrency:,} requests: {shared:.1f} tok/s each (slow case: half)")


def realtime_throughput(concurrency: int, *, measured_tps: float | None = None,
                        endpoint_tps: float | None = None) -> Throughput:
    """A realtime run's output tokens/s: the setting when given; else the reference run's, scaled to `concurrency`,
    or the endpoint's per-request speed × concurrency when that is lower (an upper bound: no 429s or queues in it)."""
    if measured_tps is not None:
        return Throughput(measured_tps, f"realtime_output_tps = {measured_tps:,.0f} tok/s (the setting)")
    scaled = REFERENCE_OUTPUT_TPS * concurrency / REFERENCE_CONCURRENCY
    source = (f"the reference run's {REFERENCE_OUTPUT_TPS:,.0f} output tok/s at {REFERENCE_CONCURRENCY:,} in flight "
              f"(a comparable real run: ~42M output tokens in 33 min), x {concurrency:,}/{REFERENCE_CONCURRENCY:,}")
    if endpoint_tps:
        bound = endpoint_tps * concurrency
        if bound < scaled:
            return Throughput(bound, f"the routed endpoint's {endpoint_tps:g} tok/s per request x {concurrency:,} in "
                                     f"flight (below {source}: {scaled:,.0f})")
        source += f"; the routed endpoint's {endpoint_tps:g} tok/s x {concurrency:,} would say {bound:,.0f}, a bound"
    return Throughput(scaled, source)


def route_commands(plan: RoutePlan, names: Sequence[str], cfg: BudgetConfig,
                   targets: dict[str, int] | None = None) -> list[str]:
    """The generate command(s) of a plan: one per route it uses, with the datasets that go there. A study against
    the emulator keeps `-p base_url emulator` (without it the command is a paid run, or fails for the key, writing
    into the emulator's folder); `targets`, when the plan did not write them into the datasets file (`write: False`),
    go into the commands (`-y 'target_output_tokens: {…}'`)."""
    emulator = is_emulator(cfg.base_url)
    defaults = GenerateConfig(base_url=cfg.base_url) if emulator else GenerateConfig()
    common = ["-p", "base_url", "emulator"] if emulator else []
    for key in ("datasets_file", "model", "output_dir"):
        if getattr(cfg, key) != getattr(defaults, key):
            common += ["-p", key, shlex.quote(str(getattr(cfg, key)))]
    out = []
    for route in ROUTES:
        chosen = plan.datasets(route)
        if not chosen:
            continue
        if len(chosen) == 1:
            which = ["-p", "dataset", shlex.quote(chosen[0])]
        elif sorted(chosen) == sorted(names):
            which = ["-p", "dataset", "all"]
        else:
            which = ["-y", shlex.quote(f"dataset: [{', '.join(chosen)}]")]
        extra = ["-p", "batch_window", shlex.quote(cfg.batch_window)] if route == "batch" else []
        slug = cfg.model.rsplit("/", 1)[-1]
        if route == "batch" and slug != defaults.batch_model:
            extra += ["-p", "batch_model", shlex.quote(slug)]
        if targets is not None:
            extra += ["-y", shlex.quote("target_output_tokens: {" + ", ".join(f"{n}: {targets[n]}" for n in chosen)
                                        + "}")]
        out.append(" ".join(["papermill", "notebooks/generate.ipynb", f"outputs/generate-{route}.ipynb", *which,
                             "-p", "route", route, *extra, *common]))
    return out


def plan_routes(plan: Plan, stats: Sequence[DatasetStats], lengths: OutputLengths, basis: PriceBasis,
                cfg: BudgetConfig) -> RouteChoice:
    """budget.ipynb's time–money plan for its targets: the routes priced and timed, the choice, its commands."""
    batch = batch_prices(cfg.model)
    cheapest = basis.decision.cheapest()
    throughput = realtime_throughput(cfg.concurrency, measured_tps=cfg.realtime_output_tps,
                                     endpoint_tps=cheapest.throughput_tps if cheapest is not None else None)
    answers = answer_times(throughput, basis.decision.eligible, cfg.concurrency)
    throughput = replace(throughput, answers=answers, concurrency=cfg.concurrency, samples=lengths.samples,
                         source=f"{throughput.source}; answers: {answers.source}")
    timing = BatchTiming(facts.window_hours(cfg.batch_window), cfg.batch_round_expected_h, cfg.batch_topups)
    choice = choose_route(dataset_work(plan, stats, lengths, batch), throughput, timing, deadline_h=cfg.deadline_h,
                          basis=cfg.deadline_basis, batch=batch is not None)
    if choice.chosen is None:
        return choice
    targets = None if cfg.write else {d.name: d.target_output_tokens for d in plan.datasets}
    return replace(choice, commands=route_commands(choice.chosen, [d.name for d in plan.datasets], cfg, targets))


def plot_routes(choice: RouteChoice):
    """$ against time: every split priced (grey), each row from its expected to its worst-case time, the
    deadline."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.scatter([max(p.time_h(choice.basis), 1e-3) for p in choice.splits], [p.usd for p in choice.splits],
               s=8, color="0.75", label="every split by dataset")
    for row, colour in zip(choice.rows, ("tab:blue", "tab:green", "tab:purple")):
        lo, hi = max(row.expected_h, 1e-3), max(row.worst_h, 1e-3)
        ax.plot([lo, hi], [row.usd, row.usd], "-o", color=colour, ms=4,
                label=f"{row.name}{' (chosen)' if row is choice.chosen else ''}: expected → worst")
    if choice.deadline_h is not None:
        ax.axvline(choice.deadline_h, color="tab:red", ls="--", label=f"deadline {hours_text(choice.deadline_h)}")
    ax.set_xscale("log")
    ax.set_xlabel("hours to the targets (log)")
    ax.set_ylabel("$ for the targets")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
