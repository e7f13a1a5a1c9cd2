"""The engine's parts, built from a run's settings and datasets (engine.py supervises them; a replay in simulated time
builds the same ones): the dispatcher and the ledger on one ledger of flights, the requester, the recorder and the
reporter."""
from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from ...errors import InputError
from ...openrouter import Completion, Kind, Outcome, Price, RoutingDecision
from ...openrouter.client import read_generation
from ...openrouter.fast_stream import FastStreams
from ...records import CUT, Record
from ...text import Tokenizer
from ..clock import Clock, LoopClock
from ..config import GenerateConfig
from ..conversations.fidelity import FidelityJudge
from ..conversations.recorder import Recorder
from ..conversations.rollouts import Execute
from ..conversations.work import Work
from ..lanes import DatasetRun
from ..money.account import Books
from ..money.admission import Admission, AgeModel
from ..money.flights import Flights
from ..money.ledger import AccountReader, Ledger, MoneyStop, read_account
from ..money.readback import GenerationReader
from ..plan.priors import cost_prior, length_prior, prior_lengths
from ..policy import CANCELLED, StopReason, cancelled_outcome, rule
from .attempt import ChatCompletions, Transport
from .congestion import Congestion, ProviderCooldown
from .dispatcher import Dispatcher
from .pacing import Pacing
from .reporter import Reporter, RunShown
from .requester import Requester
from .tool_results import ToolResults

TOKENS_PER_CHAR = 0.25  # before the run has recorded MIN_CHARS characters (English text: ~4 characters a token)
MIN_CHARS = 20_000


@dataclass
class Seams:
    """What the engine talks to, each replaceable: tests and benches pass their own (virtual time among them)."""

    transport: Transport | None = None  # None: ChatCompletions with the run's stall_timeout_s
    fast_streams: FastStreams | None = None  # that ChatCompletions' streams read over it (the run makes one)
    clock: Clock = field(default_factory=LoopClock)
    account: AccountReader = read_account
    generations: GenerationReader | None = read_generation  # a closed stream's cost by id; None: the account's
    routing: RoutingDecision | None = None  # None: the routing file, else the catalog (openrouter.load_routing)
    executor: Executor | None = None        # tokenizing and records off the loop; None: two threads
    environments: Execute | None = None     # a rollout's tool calls executed (conversations/rollouts.py); None: a run
                                            # whose prompts name no environment


@dataclass
class Parts:
    """The run's parts, and the two steps of a request that touch several of them at once (the caller holds the
    run's lock: the engine's slots, or a replay's loop)."""

    dispatcher: Dispatcher
    ledger: Ledger
    requester: Requester
    recorder: Recorder
    reporter: Reporter
    executor: Executor

    def admit(self, work: Work, now: float) -> int | None:
        """The request goes out when its cost fits the money left: its ticket. None: wait for money to free up, or
        (the dispatcher then says why) issuing stopped."""
        verdict = self.ledger.admit(work.bound, now, work.lane.name)
        if isinstance(verdict, MoneyStop):
            self.dispatcher.stop.set(verdict.reason)
            return None
        if verdict is not None:
            self.dispatcher.admitted(work, verdict)
            self.dispatcher.sent(work, now)
        return verdict

    def settle(self, work: Work, outcome: Outcome, record: Record | None, cost: float | None, now: float, *,
               go_on: bool = False, generation_id: str = "") -> None:
        """What an attempt came to: recorded (`record`), retried, failed for good, or cancelled; booked either way
        (`cost`: what it cost when read, else its rule says what to book; `generation_id`: the id its stream was
        given, to read what it cost by when no answer says). `go_on`: a cancelled attempt was cut off alone (its
        handle), not with its slot at the run's end: sent again."""
        r, stop, c = rule(outcome), None, outcome.completion
        if record is not None and c is not None and (contradicted := self.recorder.contradicted(record, c)):
            outcome, record, r = contradicted, None, rule(contradicted)  # the service's count says its ids are wrong
        if outcome.error_class == CUT and record is not None and c is not None:
            return self._cut(work, record, c, now)
        if cost is None and c is not None:  # an answer (or a refused one): read, and paid for
            cost = self.requester.cost(c)
        assert work.ticket is not None
        if outcome.error_class == CANCELLED:
            if self.dispatcher.cancelled(work, now, go_on=go_on):
                self.recorder.retried(work, cancelled=True)
            work.lane.stats.booked_usd += self.ledger.settle(work.ticket, r, cost, work.bound, now, generation_id)
            return
        if record is not None:
            assert c is not None and cost is not None
            recorded, stop = self.recorder.record(work, record, c, cost)
            self.dispatcher.answered(work, now, recorded.tokens, written=recorded.written,
                                     next_turn=recorded.next_turn)
        else:
            stop = self.recorder.refused(work, outcome)
            if self.dispatcher.not_ok(work, now, outcome, r) == "retry":  # failed for good: written by the dispatcher
                self.recorder.retried(work)
        booked = self.ledger.settle(work.ticket, r, cost, work.bound, now, generation_id)
        self.recorder.attempt(work, outcome, r, now - work.sent_at, booked)
        self.dispatcher.congestion.observe(now, r.rate_limited)
        self.requester.observe(now, c.provider if c is not None else outcome.provider, r.rate_limited)
        if stop is not None:
            self.dispatcher.stop.set(stop)
        if record is not None and work.lane.target_met and self.requester.at_target == "cut":
            self.requester.streams.cut_streams_of(work.lane, StopReason.TARGET_REACHED)

    def tick(self, now: float) -> float:
        """A few times a second: pacing re-estimates what is in flight by how far the streams have got; a dataset
        whose cut came (pacing's cut mode) has its streams cut, and one near it sends only to endpoints that stop
        billing on a closed stream. Returns the seconds until the next cut is due (inf: none coming)."""
        streams = self.requester.streams.progress(self.tokens_per_char()) if self.requester.streams else None
        for lane in self.dispatcher.tick(now, streams):
            self.requester.streams.cut_streams_of(lane, StopReason.TARGET_REACHED)
        if streams and self.requester.at_target == "cut":  # a stream that went out as its dataset met its target
            for lane in self.dispatcher.lanes.values():      # (its cut already made) is cut too, not waited for
                if lane.target_met:
                    self.requester.streams.cut_streams_of(lane, StopReason.TARGET_REACHED)
        for lane in self.dispatcher.lanes.values():
            lane.near_target = self.dispatcher.pacing.lanes[lane.name].near()
        return self.dispatcher.pacing.next_cut_in()

    def tokens_per_char(self) -> float:
        """This run's output tokens per reasoning and content character (a stream says characters; the service
        counts tokens only in its last chunk); a typical English ratio until enough is recorded."""
        lanes = self.dispatcher.lanes.values()
        chars = sum(lane.stats.chars for lane in lanes)
        return sum(lane.stats.output_tokens for lane in lanes) / chars if chars >= MIN_CHARS else TOKENS_PER_CHAR

    def _cut(self, work: Work, record: Record, c: Completion, now: float) -> None:
        """A cut sample: recorded as any answer; its cost is unknown (a closed stream has no usage chunk), so the
        books hold its bound until it is read back by its generation id (or an account reading settles it); its
        record carries the prefix's cost at the provider's price (what the store's totals and the next run's cost
        prior read)."""
        assert work.ticket is not None and work.prompt_ids is not None
        price = self.requester.price_by_provider.get(c.provider, self.requester.worst)
        recorded, stop = self.recorder.record(work, record, c, price.cost(len(work.prompt_ids), len(record.output_ids)))
        self.dispatcher.answered(work, now, recorded.tokens, written=recorded.written, next_turn=recorded.next_turn,
                                 cut=True, paused=recorded.paused)
        cancelled = cancelled_outcome()
        booked = self.ledger.settle(work.ticket, rule(cancelled), None, work.bound, now, c.generation_id)
        self.recorder.attempt(work, Outcome(Kind.OK, CUT, 200, completion=c), rule(cancelled), now - work.sent_at,
                              booked)
        if stop is not None:
            self.dispatcher.stop.set(stop)


def build_parts(cfg: GenerateConfig, lanes: list[DatasetRun], routing: RoutingDecision, tok: Tokenizer,
                seams: Seams, now: float) -> Parts:
    idle = all(lane.idle for lane in lanes)
    paid = cfg.backend == "openrouter"
    worst = routing.worst_price() if paid else Price(0.0, 0.0)
    if worst is None:
        raise InputError("the routing decision has no price to reserve against", field="routing")
    tasks = {lane.name: lane.scan.rollouts for lane in lanes if lane.scan.rollouts}
    if tasks and seams.environments is None:  # before any request: a task's tool calls could not be executed
        raise InputError(f"{sum(tasks.values())} prompts of {', '.join(tasks)} name an environment (tasks), and the "
                         "run has no environments executor to run their tool calls (Seams.environments)",
                         field="environments")
    if paid:  # a max_tokens no eligible endpoint serves would be refused for every prompt alike
        routing.check_max_tokens(cfg.max_tokens)
    guess, flights = prior_lengths(cfg.prior_output_median_tokens, cfg.prior_output_sigma, cfg.max_tokens), Flights()
    costs = [c for lane in lanes for c in lane.store.costs]
    admission = Admission(AgeModel(cost_prior(costs, worst, guess) if paid else [0.0]), mode=cfg.budget_mode,
                          overshoot_probability=cfg.overshoot_probability, flights=flights)
    pacing = Pacing((Pacing.lane(lane.name, target=lane.target, prompts=lane.scan.total,
                                 recorded=lane.store.output_tokens, finished=lane.store.conversations_finished,
                                 prior_tokens=length_prior(lane.store.lengths, guess)) for lane in lanes), flights,
                    cut=cfg.stream and cfg.at_target == "cut" and any(e.stream_cancellation for e in routing.eligible))
    congestion = Congestion(cfg.concurrency)
    recorder: Recorder | None = None  # made below, with the executor; the dispatcher writes failures through it

    def failed(work: Work) -> None:
        assert recorder is not None
        recorder.fail(work)

    dispatcher = Dispatcher(lanes, pacing, congestion, max_attempts=cfg.max_attempts, t0=now,
                            retry_base_s=cfg.retry_base_s, retry_cap_s=cfg.retry_cap_s, failed=failed)
    ledger = Ledger(admission, Books(lag_s=cfg.account_lag_s), paid=paid, max_spend_usd=cfg.max_spend_usd,
                    reserve_usd=cfg.reserve_usd, concurrency=cfg.concurrency, refresh_s=cfg.account_refresh_s,
                    reader=seams.account, generations=seams.generations)
    # per-provider verdicts over the whole run, from the datasets' earlier books (a suspect is left out at once)
    fidelity = FidelityJudge.carried(lane.summary_before for lane in lanes if lane.summary_before)
    executor = seams.executor or ThreadPoolExecutor(2, thread_name_prefix="eagledata-tok")
    cooldown = ProviderCooldown(cooldown_s=cfg.provider_cooldown_s)
    transport = seams.transport or ChatCompletions(cfg.stall_timeout_s, fast_streams=seams.fast_streams)
    requester = Requester(transport, routing, fidelity, cooldown, tok, executor, worst=worst, model=cfg.model,
                          max_tokens=cfg.max_tokens, temperature=cfg.temperature, backend=cfg.backend,
                          stream=cfg.stream, at_target=cfg.at_target, tool_results=ToolResults(seams.environments))
    recorder = Recorder(tok, executor, fidelity, routing, temperature=cfg.temperature, paid=paid,
                        on_suspect=requester.streams.cancel_streams_of)
    single = cfg.dataset if isinstance(cfg.dataset, str) and cfg.dataset != "all" else None
    shown = RunShown(cfg.model, cfg.base_url, cfg.backend, cfg.budget_mode, cfg.max_tokens, cfg.turns)
    reporter = Reporter(shown, dispatcher, ledger, congestion, fidelity, routing, t0=now, idle=idle, single=single,
                        streamed=requester.streams.streamed)
    return Parts(dispatcher, ledger, requester, recorder, reporter, executor)
