"""Pacing (pure): which dataset the next request is for, and whether a dataset may take one more.

Several datasets share one pool of slots and one budget. Each dataset with a token target advances in
proportion to it: the next request goes to the dataset furthest behind, measured as

    expected = recorded tokens + Σ E[tokens | age] over its requests in flight
               + E[tokens] × (requests about to start + later turns of its started conversations)

÷ its target. E[tokens | age] comes from the same Kaplan–Meier estimate admission uses for money
(`AgeModel`), over this run's attempts of that dataset: requests in flight are length-biased (long answers stay
longer), so counting them at the plain mean of the answers finished so far under-counts them about twofold. That
bias is what made one-dataset runs end 18–31 % over target. So if the money runs out first, every dataset
holds about the same fraction of its target, as the budget plan assumed.

A dataset stops taking requests once one more would put its expected total past `target × (1 + AIM)`, or
its upper bound (expected + Z·sd, the sd of what is in flight plus the estimate's own error, which grows for old
requests: their estimate rests on the few answers that took longer) past `target × (1 + BOUND)`, so that none
ends more than `MAX_OVERSHOOT` (5 %) over. It opens again when answers come in shorter than expected, and a
dataset under its target with nothing in flight is always open, so every target is met. A started conversation's
later turns count among the expected tokens (they are coming), which closes the dataset to new conversations first,
but never before what is in hand (recorded and in flight) will meet the target: those turns come a whole answer
later, and counting on them made the last dataset wait for them. Its next turns go on while the answers on their
way, those later turns left out, stay at the aim and its bound (`may_continue`). Datasets without a target come
after those with one: they take the slots no dataset with a target can use, sharing them in proportion to their
prompts.

**Streams.** A streamed request in flight says how far it has got (`Streamed`: the tokens delivered so far). Its
expected length is then conditioned on that, E[L | L > delivered] (a Kaplan–Meier estimate over answer lengths, the
streams in flight censored at what they delivered), not on its age alone: a 43 s old request estimated at 6,377 tokens
from its age ended at 23,635; its stream would have shown it was long. **Cut mode** (`cut`: streaming with
`at_target: cut`): a stream whose endpoint stops billing when closed (`cuttable`) is cut at its dataset's target and
kept as far as it got, so what is *in hand* is the recorded tokens and what the cuttable streams delivered. The dataset
is cut once that reaches `target × (1 + CUT_AIM)`, and never before the tokens actually delivered (recorded, and what
every stream sent so far) reach it (`due_cuts`; the engine looks again when `next_cut_in` says that
comes, not at its next tick: the last dataset at its target receives the whole pool's tokens, ~2 % of a target in half
a tick at 2,000 streams): its target is met at once, and its other requests
(billed whole whatever the client does) finish and count on top, up to `WHOLE_OVER` of the target in expectation
(more of them, and the cut comes that much earlier: the target then waits for them). It takes requests until its cut
is expected, those others counted at their expected end, within `LEAD` of the median answer time (at the rate it is
receiving tokens): no target waits for a whole answer, the pool stays full to the end, and a late request still
delivers a useful sample.
Within the `NEAR` quantile of the answer times before its cut, its requests go only to endpoints that cancel
(requester.py), so few answers billed whole are in flight at the cut (they are what passes the target).

Times are the caller's clock (tests and the bench run this in simulated time).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..money.admission import AgeModel
from ..money.flights import Flight, Flights

AIM = 0.02            # the overshoot a dataset aims at: expected final tokens ≈ target × 1.02
MAX_OVERSHOOT = 0.05  # the promise: no dataset ends more than 5 % over its target
BOUND = 0.04          # … kept by holding its upper bound at Z standard deviations under target × 1.04, 1 % left
Z = 3.25              # for the estimate; not always kept: checked after every answer, the bound that stays the last
# is the one whose requests in flight came long, and answer lengths have a heavier tail than the normal's. Replayed on
# ten runs' answers (bench/README.md, issue 31's "paired draws"), 3.6 % of job runs end a dataset 5-6 % over (5.2 % at
# Z = 3), for ~1 % more time to the last target; on the eight chosen from, 1.8 % (3.6 %; 0.6 % at Z = 4, 3.7 % slower)
PRIOR_WEIGHT = 30     # pseudo-observations the prior is worth in the estimation-error term
OWN_MODEL_EVENTS = 1000  # a dataset's own estimate once it has this many attempts; before, all datasets' together
# (the tail of E[tokens | age], old requests, rests on few answers: pooled, it is steadier)
CUT_AIM = 0.002       # cut mode: a dataset is cut once what is in hand reaches target × (1 + CUT_AIM) (the prefixes
# are counted at the run's tokens per character, a little off: aiming just over keeps the cut from falling short)
WHOLE_OVER = 0.015    # cut mode: the answers billed whole still in flight at the cut may pass the target by this much;
# beyond it the cut comes earlier by the rest of their expected tokens (and the target waits for them)
LEAD = 0.25           # cut mode: no new request once the cut is expected within LEAD × the median answer time (a late
# request delivers at least about a quarter of a median answer; the pool stays full until then)
NEAR = 0.999          # cut mode: a dataset is near its cut within this quantile of the answer times: its requests then
# go only to endpoints that stop billing on a closed stream (requester.py), so that few answers billed whole (which
# finish and count after the cut) are in flight at the cut: each is what passes the target
RATE_WINDOW = 20      # refreshes over which a dataset's delivery rate (tokens/s, recorded and streamed) is measured
LATENCIES = 2000      # the answer times (the newest) the median answer time is taken over


@dataclass(frozen=True)
class Streamed:
    """How far one streamed request in flight has got: output tokens delivered so far, and whether closing its
    stream stops its billing (`cuttable`: its endpoint has stream cancellation)."""

    tokens: float
    cuttable: bool


@dataclass(frozen=True)
class LaneSpec:
    name: str
    target: int | None
    prompts: int
    recorded: int
    finished: int
    prior_tokens: Sequence[float]


@dataclass
class Lane:
    """One dataset as pacing sees it. `recorded` and `finished` count every run (the store's totals)."""

    name: str
    target: int | None
    prompts: int                    # prompts in the file (up to `limit`)
    recorded: int                   # output tokens recorded
    finished: int                   # prompts done (records + failures)
    model: AgeModel                 # this dataset's attempts
    pooled: AgeModel                # every dataset's attempts (age says most: generation time grows with length)
    lengths: AgeModel               # this dataset's answer lengths (E[L | L > delivered], for streams)
    pooled_lengths: AgeModel        # every dataset's
    cut: bool = False               # cut mode (streaming, `at_target: cut`)
    waiting: int = 0                # taken, not started yet (tokenizing, waiting for money)
    promised: int = 0               # later turns of started conversations, not taken yet (each counts as a request)
    flights: dict[int, Flight] = field(default_factory=dict)  # its requests in flight (the run's ledger's)
    _sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # Σ mean, var, error in flight
    _new: tuple[float, float] | None = None  # moments of a request about to start, cached between refreshes
    own: bool = False               # its own estimate is in use (chosen at each refresh, so never an unfitted one)
    cutting: bool = False           # cut mode: its cut was called; no more requests until its streams are in
    answer_s: float = 0.0           # the median answer time (0 before any answer)
    near_s: float = 0.0             # the NEAR quantile of the answer times
    _cut_held: float = 0.0          # cut mode: Σ tokens the cuttable streams delivered so far
    _whole: float = 0.0             # cut mode: Σ expected tokens of the other requests in flight (billed whole)
    _rate: float = 0.0              # tokens/s it is receiving (recorded and streamed)
    _delivered: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    @property
    def estimator(self) -> AgeModel:
        return self.model if self.own else self.pooled

    @property
    def length_estimator(self) -> AgeModel:
        return self.lengths if self.own else self.pooled_lengths

    def in_hand(self) -> float:
        """Cut mode: the tokens this dataset would hold if its cuttable streams were cut now (recorded, and what they
        delivered so far)."""
        return self.recorded + self._cut_held

    def time_to_cut(self) -> float:
        """Cut mode: seconds until what is in hand, and the other requests in flight at their expected end (they are
        billed whole, so they finish and count), reach target × (1 + CUT_AIM), at the rate tokens are arriving."""
        return self._seconds_to_aim(self._whole)

    def delivered(self) -> float:
        """The tokens recorded and those every stream in flight delivered so far (what the data holds if it ended
        now, the streams billed whole included)."""
        return self.recorded + sum(f.streamed for f in self.flights.values() if f.paced)

    def cut_in(self) -> float:
        """Cut mode: seconds until what is in hand, with the answers billed whole expected beyond WHOLE_OVER of the
        target, reaches the target's aim, at the rate tokens are arriving (0: it has); and never before what was
        delivered reaches it. Requests not yet streaming count at their expected length among those billed whole
        (their endpoint is not known), so on a small dataset, all of it in flight at once, the first rule alone fell
        due at the first streamed token and cut every answer to a stub short of the target (issue 53)."""
        assert self.target is not None
        by_expected = self._seconds_to_aim(max(0.0, self._whole - WHOLE_OVER * self.target))
        left = self.target * (1 + CUT_AIM) - self.delivered()
        if left <= 0:
            return by_expected
        return max(by_expected, left / self._rate if self._rate > 0 else math.inf)

    def _seconds_to_aim(self, counted: float) -> float:
        """Seconds until what is in hand and `counted` more reach target × (1 + CUT_AIM) at the rate tokens arrive."""
        assert self.target is not None
        left = self.target * (1 + CUT_AIM) - self.in_hand() - counted
        if left <= 0:
            return 0.0
        return left / self._rate if self._rate > 0 else math.inf

    def _cut_open(self) -> bool:
        return not self.cutting and self.time_to_cut() > LEAD * self.answer_s

    def near(self) -> bool:
        """Cut mode: its cut is expected within the NEAR quantile of the answer times; before any answer, once what
        it has taken is expected to reach its target (a small dataset, all of it in flight in the first seconds: an
        answer billed whole taken then finishes after the cut, and passed the demo's 60,000 target by 10 %)."""
        if not self.cut or self.target is None:
            return False
        if self.near_s > 0:
            return self.time_to_cut() <= self.near_s
        return self.expected() >= self.target

    def new_moments(self) -> tuple[float, float]:
        if self._new is None:
            self._new = self.estimator.new_request(math.inf)
        return self._new

    def expected(self) -> float:
        """Output tokens this dataset will hold once everything taken has finished, in expectation."""
        return self.outlook(0)[0]

    def upper(self, extra: int = 0) -> float:
        """`expected` (plus `extra` new requests) at Z standard deviations, the estimate's error included."""
        return self.outlook(extra)[1]

    def outlook(self, extra: int, *, promised: bool = True) -> tuple[float, float]:
        """(expected, upper bound) of the output tokens once everything taken and `extra` new requests have
        finished; `promised=False` leaves out the later turns of started conversations (what is in hand)."""
        m0, v0 = self.new_moments()
        n_new = self.waiting + extra + (self.promised if promised else 0)
        mean = self.recorded + self._sums[0] + n_new * m0
        var = self._sums[1] + n_new * v0
        estimate_error = self._sums[2] + n_new * _error(v0, self.estimator.events)
        return mean, mean + Z * math.sqrt(max(0.0, var) + estimate_error ** 2)

    def progress(self) -> float:
        """How far along: expected ÷ target, or (for no target) prompts taken ÷ prompts."""
        if self.target is not None:
            return self.expected() / self.target
        taken = self.finished + len(self.flights) + self.waiting
        return taken / self.prompts if self.prompts else 1.0

    @property
    def target_met(self) -> bool:
        return self.target is not None and self.recorded >= self.target

    def open(self) -> bool:
        """May this dataset take one more request (a new conversation, or a retry)? While its expected total, later
        turns of started conversations included, stays at the aim; and, whatever those later turns, while what is in
        hand stays under the target: a later turn starts only when the answer before it is in, a whole answer's time
        later, so a dataset that counted on them would sit short of its target waiting for them (a conversation
        still open at the target is continued by the next run with a higher one)."""
        if self.target is None:
            return True
        if self.recorded >= self.target:
            return False
        if not self.flights and not self.waiting and not self.promised:
            return True  # under target with nothing on the way: always top up
        if self.cut:
            return self._cut_open()
        bound = self.target * (1 + BOUND)
        mean, upper = self.outlook(1)
        if mean <= self.target * (1 + AIM) and upper <= bound:
            return True
        mean, upper = self.outlook(1, promised=False)
        return mean <= self.target and upper <= bound

    def may_continue(self) -> bool:
        """May a started conversation's next turn go? While what is recorded and on its way (its later turns left
        out) stays at the aim and its bound: later than `open`, so a dataset stops starting conversations first and
        continuing them second; and no turn starts late, which the dataset would then wait for, once the answers
        in flight alone will meet the target."""
        if self.target is None:
            return True
        if self.recorded >= self.target:
            return False
        if not self.flights and not self.waiting:
            return True
        if self.cut:
            return self._cut_open()
        mean, upper = self.outlook(1, promised=False)
        return mean <= self.target * (1 + AIM) and upper <= self.target * (1 + BOUND)


class Pacing:
    """The datasets of one run and their requests in flight (the caller holds the lock). Given the run's ledger of
    flights (`flights`, which admission opens and closes), pacing reads the flights admission opened; alone (its
    tests, a bench of pacing only) it keeps a ledger of its own and opens and closes them itself."""

    def __init__(self, lanes: Iterable[LaneSpec], flights: Flights | None = None, *, cut: bool = False):
        specs = list(lanes)
        self.owns = flights is None
        self.flights = Flights() if flights is None else flights
        prior = [t for spec in specs for t in spec.prior_tokens]
        self.pooled, self.pooled_lengths = AgeModel(prior), AgeModel(prior)
        self.latencies: deque[float] = deque(maxlen=LATENCIES)  # answers' times, for LEAD
        self.lanes = {spec.name: Lane(spec.name, spec.target, spec.prompts, spec.recorded, spec.finished,
                                      AgeModel(spec.prior_tokens), self.pooled, AgeModel(spec.prior_tokens),
                                      self.pooled_lengths, cut, flights=self.flights.of(spec.name))
                      for spec in specs}

    @staticmethod
    def lane(name: str, *, target: int | None, prompts: int, recorded: int, finished: int,
             prior_tokens: Sequence[float]) -> LaneSpec:
        """A dataset as it stands when the run starts; `prior_tokens`: its earlier records' lengths, else a guess."""
        return LaneSpec(name, target, prompts, recorded, finished, prior_tokens)

    def order(self, names: Iterable[str] | None = None) -> list[str]:
        """The open datasets, the one furthest behind first; those without a target after those with one."""
        lanes = [self.lanes[n] for n in (self.lanes if names is None else names)]
        return [lane.name for lane in sorted((lane for lane in lanes if lane.open()),
                                             key=lambda lane: (lane.target is None, lane.progress()))]

    def ranked(self, names: Iterable[str]) -> list[str]:
        """Every dataset of `names`, open or not, the one furthest behind first (a started conversation's next turn
        goes ahead whether or not its dataset may start more)."""
        return [lane.name for lane in sorted((self.lanes[n] for n in names),
                                             key=lambda lane: (lane.target is None, lane.progress()))]

    def hold(self, name: str, *, later: int = 0, promised: bool = False) -> None:
        """An item of `name` was taken (it will start, or be put back with `release`). `later`: turns its
        conversation has after it (a conversation starting); `promised`: it is such a turn, counted till now."""
        lane = self.lanes[name]
        if promised:
            self.forgo(name, 1)
        lane.waiting += 1
        lane.promised += later

    def unsettled(self, name: str) -> str | None:
        """What pacing still counts for a dataset that has nothing left (every conversation finished, nothing in
        hand), or None: anything left means the engine's books leaked and pacing would hold the dataset shut."""
        lane = self.lanes[name]
        if lane.waiting or lane.promised or lane.flights:
            return (f"pacing: {name}: {lane.waiting} taken, {lane.promised} promised turns and {len(lane.flights)} "
                    f"in flight left with every conversation finished")
        return None

    def forgo(self, name: str, turns: int) -> None:
        """`turns` promised turns will not be asked in this run (their conversation ended early, or was put back)."""
        lane = self.lanes[name]
        if turns > lane.promised:
            raise ValueError(f"pacing: {name}: {turns} promised turns forgone, {lane.promised} promised")
        lane.promised -= turns

    def release(self, name: str) -> None:
        """A taken item goes back unstarted (money gone, the run stopping)."""
        self._untake(self.lanes[name], "given back")

    @staticmethod
    def _untake(lane: Lane, what: str) -> None:
        if lane.waiting <= 0:  # the caller's books are wrong: say so (the engine stops cleanly) rather than drift
            raise ValueError(f"pacing: {lane.name}: a request {what} that was never taken")
        lane.waiting -= 1

    def start(self, name: str, now: float, ticket: int | None = None) -> int:
        """A taken request of `name` starts: the flight admission opened for it (`ticket`), or, alone, a new one."""
        lane = self.lanes[name]
        self._untake(lane, "started")
        f = self.flights.open(now, 0.0, name) if ticket is None else self.flights.live[ticket]
        if f.lane != name or f.paced:
            raise ValueError(f"pacing: flight {f.ticket} of {f.lane!r} started again for {name!r}")
        m, v = lane.new_moments()
        f.tokens, f.tokens_var, f.tokens_error, f.paced = m, v, _error(v, lane.estimator.events), True
        _add(lane, f, 1.0)
        return f.ticket

    def end(self, ticket: int, now: float, tokens: int, *, finished: bool, cut: bool = False) -> None:
        """The attempt ended with `tokens` recorded (0 for an error or a cancel); `finished`: the prompt is done;
        `cut`: a stream cut short (its length says only that the answer was longer: the estimates do not learn from
        it). Before admission closes the flight (pacing alone closes its own)."""
        f = self.flights.close(ticket) if self.owns else self.flights.live[ticket]
        if not f.paced:
            raise ValueError(f"pacing: flight {ticket} ended twice, or never started")
        f.paced = False
        lane = self.lanes[f.lane]
        _add(lane, f, -1.0)
        if f.cuttable:
            lane._cut_held = max(0.0, lane._cut_held - f.streamed)
        else:
            lane._whole = max(0.0, lane._whole - f.tokens)
        if len(lane.flights) == (0 if self.owns else 1):  # (the run's ledger closes this one next)
            lane._sums = [0.0, 0.0, 0.0]  # no float drift once nothing is in flight
            lane._cut_held = lane._whole = 0.0
            lane.cutting = False
        if not cut:
            lane.model.observe(now - f.started, tokens)
            self.pooled.observe(now - f.started, tokens)
            if tokens > 0:
                lane.lengths.observe(tokens, tokens)
                self.pooled_lengths.observe(tokens, tokens)
                self.latencies.append(now - f.started)
        lane.recorded += tokens
        lane.finished += finished

    def _cutting_soon(self) -> list[Lane]:
        """Cut mode: the datasets whose cut is still to come, with streams to cut."""
        return [lane for lane in self.lanes.values() if lane.cut and lane.target is not None and not lane.cutting
                and lane._cut_held > 0 and lane.recorded < lane.target]

    def due_cuts(self) -> list[str]:
        """Cut mode: the datasets whose cuttable streams are to be cut now (what is in hand reached the target's aim);
        each is marked cutting, and takes no more requests until its streams are in."""
        due = [lane for lane in self._cutting_soon() if lane.cut_in() <= 0]
        for lane in due:
            lane.cutting = True
        return [lane.name for lane in due]

    def next_cut_in(self) -> float:
        """Seconds until the soonest cut comes, at the rates tokens are arriving (inf: none coming): the engine looks
        again then rather than at its next tick, so a dataset receiving the whole pool's tokens is not cut half a tick
        late (at 2,000 streams that is ~2 % of a target)."""
        return min((lane.cut_in() for lane in self._cutting_soon()), default=math.inf)

    def refresh(self, now: float, streams: Mapping[int, Streamed] | None = None) -> None:
        """Re-estimate every request in flight (a few times a second): a stream by what it has delivered (`streams`,
        by ticket), any other at its current age."""
        streams = streams or {}
        paced = [f for lane in self.lanes.values() for f in lane.flights.values() if f.paced]
        for f in paced:
            st = streams.get(f.ticket)
            f.streamed, f.cuttable = (st.tokens, st.cuttable) if st is not None else (0.0, False)
        self.pooled.fit(np.array([now - f.started for f in paced]))
        self.pooled_lengths.fit(np.array([f.streamed for f in paced]))
        answer_s, near_s = (np.quantile(self.latencies, [0.5, NEAR]).tolist() if self.latencies else (0.0, 0.0))
        for lane in self.lanes.values():
            lane._new, lane.answer_s, lane.near_s = None, answer_s, near_s
            flights = [f for f in lane.flights.values() if f.paced]
            ages = np.array([now - f.started for f in flights])
            got = np.array([f.streamed for f in flights])
            lane.own = lane.model.events >= OWN_MODEL_EVENTS
            if lane.own:
                lane.model.fit(ages)
                lane.lengths.fit(got)
            lane._delivered.append((now, lane.recorded + float(got.sum())))
            (t0, d0), (t1, d1) = lane._delivered[0], lane._delivered[-1]
            lane._rate = max(0.0, (d1 - d0) / (t1 - t0)) if t1 > t0 else 0.0
            if not flights:
                continue
            unbounded = np.full(len(flights), np.inf)
            means, variances = lane.estimator.moments(ages, unbounded)
            beyond = lane.estimator.events_beyond(ages)
            if got.any():  # a stream that has delivered: E[L | L > delivered]
                lengths = lane.length_estimator
                lm, lv = lengths.moments(got, unbounded)
                past = lengths.events_beyond(got)
                for i in np.flatnonzero(past == 0):  # longer than every answer so far: the prior's tail above it
                    lm[i], lv[i] = lengths.prior_tail(float(got[i]))
                streamed = got > 0
                means, variances = np.where(streamed, np.maximum(lm, got), means), np.where(streamed, lv, variances)
                beyond = np.where(streamed, past, beyond)
            lane._sums, lane._cut_held, lane._whole = [0.0, 0.0, 0.0], 0.0, 0.0
            for f, m, v, k in zip(flights, means.tolist(), variances.tolist(), beyond.tolist()):
                f.tokens, f.tokens_var, f.tokens_error = m, v, _error(v, k)
                _add(lane, f, 1.0)
                if f.cuttable:
                    lane._cut_held += f.streamed
                else:
                    lane._whole += f.tokens


def _error(variance: float, events: int) -> float:
    """What the estimate of one request's mean may be off by: its sd over the root of the answers it rests on
    (for a request of age a, those that took longer than a: an old request's estimate rests on few). The
    errors share their data, so the lane adds them up (fully correlated) rather than in quadrature."""
    return math.sqrt(variance) / math.sqrt(events + PRIOR_WEIGHT)


def _add(lane: Lane, f: Flight, sign: float) -> None:
    """Running sums of what is in flight, each a sum of non-negative terms: the float drift of adding at start and
    subtracting at finish (it went below zero in a long run, and the square root of a negative variance killed it)
    is clamped here, and every `refresh` recomputes the sums from the flights."""
    s = lane._sums
    s[0] = max(0.0, s[0] + sign * f.tokens)
    s[1] = max(0.0, s[1] + sign * f.tokens_var)
    s[2] = max(0.0, s[2] + sign * f.tokens_error)
