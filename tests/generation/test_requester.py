"""The requester without a server: the body it builds, whom it leaves out, what an attempt may cost and what an
answer did cost, and the `Attempt` handle, sent through a scripted Transport (tests/helpers/parts.py)."""
import asyncio

import pytest

from eagledata.generation.conversations.turns import Conversation
from eagledata.generation.conversations.work import State, Work
from eagledata.generation.policy import RULES, StopReason, cancelled_outcome, rule
from eagledata.generation.realtime.attempt import Attempt
from eagledata.openrouter import Kind, Outcome
from eagledata.prompts import normalize_prompt
from eagledata.text import prompt_ids
from tests.helpers.parts import HOLD, Scripted, answered, completion, endpoint, routing
from tests.helpers.prompts import TOOLS
from tests.helpers.prompts import dataset as agent_prompt

PROVIDER = {"ignore": ["bad/fp8"], "quantizations": ["int4"], "sort": "price", "allow_fallbacks": True}
ASK = [{"role": "user", "content": "A question 0"}]


def three(**provider):
    """Three priced providers (the worst price: 1.0 in, 4.0 out per M) and one the catalog lists no price for."""
    return routing(endpoint("Cheap", 0.5, 2.0), endpoint("Mid", 0.6, 2.5), endpoint("Dear", 1.0, 4.0),
                   endpoint("Unpriced", None, None), provider={**PROVIDER, **provider})


def test_the_body_asks_for_the_model_with_reasoning_and_usage_through_the_routing(parts):
    p = parts({"A": 1}, routing=three(), model="org/target", max_tokens=1234, temperature=0.6, stream=True)
    work = p.dispatcher.take(0.0)
    assert p.requester.body(work, 0.0) == {
        "model": "org/target", "messages": ASK, "max_tokens": 1234, "stream": True, "temperature": 0.6,
        "reasoning": {"enabled": True}, "usage": {"include": True}, "provider": PROVIDER}
    p.requester.temperature = None  # the server's default: no temperature sent
    assert "temperature" not in p.requester.body(work, 0.0)
    p.requester.stream = False  # the `stream: false` setting: one JSON body
    assert p.requester.body(work, 0.0)["stream"] is False


def test_a_local_backend_asks_for_token_ids_and_reserves_nothing(parts, tok):
    """One JSON body even with `stream` on (the default): the server's ids are read from it."""
    p = parts({"A": 1}, routing=three(), backend="local", temperature=None, stream=True)
    work = p.dispatcher.take(0.0)
    asyncio.run(p.requester.prepare(work))
    assert p.requester.body(work, 0.0) == {"model": "moonshotai/kimi-k2.5", "messages": ASK, "max_tokens": 1000,
                                           "stream": False, "return_token_ids": True, "skip_special_tokens": False}
    assert work.bound == 0.0 and work.prompt_ids == prompt_ids(tok, ASK)


def test_the_tools_go_with_the_conversation_and_parallel_calls_as_its_dataset_makes_them(parts):
    p = parts({"T": 1}, routing=three(), tools=TOOLS)
    work = p.dispatcher.take(0.0)
    body = p.requester.body(work, 0.0)
    assert body["tools"] == TOOLS and body["parallel_tool_calls"] is False  # one plain ask
    assert body["messages"] == [{"role": "user", "content": "T question 0"}]
    # the agent prompt answers with two calls at once: its requests allow parallel calls
    agent = Conversation.of(normalize_prompt(agent_prompt()))
    body = p.requester.body(Work(0.0, 99, agent.turn(), work.lane), 0.0)
    assert body["tools"] == TOOLS and body["parallel_tool_calls"] is True
    assert body["messages"] == agent_prompt()["messages"][:2]  # the system prompt and the first ask


def test_the_bound_is_the_prompt_and_max_tokens_at_the_worst_price_once_per_work(parts, tok):
    p = parts({"A": 1}, routing=three(), max_tokens=1000)
    work = p.dispatcher.take(0.0)
    asyncio.run(p.requester.prepare(work))
    n = len(prompt_ids(tok, ASK))
    assert work.prompt_ids == prompt_ids(tok, ASK)
    assert work.bound == (n * 1.0 + 1000 * 4.0) / 1e6  # the priciest prompt and completion prices of the three
    work.bound, ids = 0.5, work.prompt_ids
    asyncio.run(p.requester.prepare(work))  # a retry is not tokenized again, nor its bound changed
    assert work.bound == 0.5 and work.prompt_ids is ids


class Counting:
    """An executor that runs what it is given at once, and counts it."""

    def __init__(self):
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):
        from concurrent.futures import Future

        self.calls += 1
        f = Future()
        f.set_result(fn(*args, **kwargs))
        return f


def test_a_short_prompt_is_tokenized_on_the_loop_a_long_one_or_one_with_tools_on_the_thread(parts, tok):
    """Issue 60: a trip to the tokenizer's thread and back costs two turns of a busy event loop (~200 ms each), for a
    render of well under a millisecond: short text prompts are tokenized at once; the same ids either way."""
    from eagledata.generation.realtime.requester import INLINE_CHARS

    p = parts({"A": 1, "T": 1}, routing=three(), tools=None)
    p.requester.executor = executor = Counting()
    short = p.dispatcher.take(0.0)
    asyncio.run(p.requester.prepare(short))
    assert executor.calls == 0 and short.prompt_ids == prompt_ids(tok, short.turn.messages)
    long = Work(0.0, 98, Conversation.of(normalize_prompt(
        {"id": "L", "messages": [{"role": "user", "content": "word " * (INLINE_CHARS // 5 + 1)}]})).turn(), short.lane)
    asyncio.run(p.requester.prepare(long))
    assert executor.calls == 1 and long.prompt_ids == prompt_ids(tok, long.turn.messages)
    agent = Conversation.of(normalize_prompt(agent_prompt()))
    tools = Work(0.0, 99, agent.turn(), short.lane)
    asyncio.run(p.requester.prepare(tools))
    assert executor.calls == 2 and tools.prompt_ids == prompt_ids(tok, tools.turn.messages, tools=TOOLS)


def test_the_bound_is_the_routings_max_price_when_it_sets_one(parts, tok):
    p = parts({"A": 1}, routing=three(max_price={"prompt": 3.0, "completion": 9.0}), max_tokens=500)
    work = p.dispatcher.take(0.0)
    asyncio.run(p.requester.prepare(work))
    assert work.bound == (len(prompt_ids(tok, ASK)) * 3.0 + 500 * 9.0) / 1e6


def test_suspects_refusers_and_providers_cooling_off_are_left_out(parts):
    p = parts({"A": 1}, routing=three(), provider_cooldown_s=60.0)
    req, work = p.requester, p.dispatcher.take(0.0)
    assert req.provider(work, 0.0) == PROVIDER  # nobody left out yet: the routing's own object
    for _ in range(20):
        req.fidelity.refusal("Dear")  # twenty refused answers of twenty: suspect, for good
    assert req.fidelity.suspects == ["Dear"]
    for t in range(5):
        req.observe(float(t), "Mid", rate_limited=True)  # five 429s in a row: Mid cools off for 60 s from t = 4
    req.observe(4.0, "Cheap", rate_limited=False)
    assert req.body(work, 5.0)["provider"] == {**PROVIDER, "ignore": ["Dear", "Mid", "bad/fp8"]}
    assert req.provider(work, 63.9)["ignore"] == ["Dear", "Mid", "bad/fp8"]
    assert req.provider(work, 64.0)["ignore"] == ["Dear", "bad/fp8"]  # its cooldown is over; a suspect's never is
    work.avoid = {"Cheap"}  # it refused this prompt's answer
    assert req.provider(work, 64.0)["ignore"] == ["Cheap", "Dear", "bad/fp8"]
    work.avoid = {"Cheap", "Mid", "Unpriced"}  # with the suspect that is every provider: the refusals are forgiven
    assert req.provider(work, 64.0)["ignore"] == ["Dear", "bad/fp8"]
    assert req.routing.provider == PROVIDER  # the decision itself is never changed


def test_start_sends_the_body_through_the_transport_and_returns_an_attempt_to_await(parts, tok):
    ok = answered(tok, "an answer", cost=0.001)
    p = parts({"A": 1}, routing=three(), transport=Scripted(ok, ok))
    work = p.dispatcher.take(0.0)
    client = object()  # the transport's business: passed through untouched

    async def main():
        await p.requester.prepare(work)
        attempt = p.requester.start(client, work, 0.0)
        assert isinstance(attempt, Attempt) and work.tries == 1
        assert await attempt is ok
        assert await p.requester.start(client, work, 0.0) is ok

    asyncio.run(main())
    sent = p.requester.transport
    assert sent.sent == [p.requester.body(work, 0.0)] * 2 and sent.clients == [client, client]
    assert work.tries == 2


def test_a_cancelled_attempt_stops_the_request_and_settles_as_the_cancelled_outcome(parts):
    script = Scripted(HOLD)
    p = parts({"A": 1}, routing=three(), transport=script)
    work = p.dispatcher.take(0.0)

    async def main():
        await p.requester.prepare(work)
        assert p.admit(work, 0.0) is not None
        attempt = p.requester.start(None, work, 0.0)
        await asyncio.sleep(0)  # the request is under way
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
        return attempt

    asyncio.run(main())
    assert script.cancelled == 1 and len(script.sent) == 1  # the transport saw its request cut off
    cancelled = cancelled_outcome()
    assert cancelled == Outcome(Kind.RETRY, "cancelled", None, "cancelled by the run")
    assert rule(cancelled) is RULES["cancelled"] and rule(cancelled).cost == "unknown" and not rule(cancelled).counts
    p.settle(work, cancelled, None, None, 2.0, go_on=True)  # as the slot settles it: cut off through its handle
    # the run goes on (a suspect's stream closed): sent again at once, not counted against max_attempts
    assert work.state is State.RETRIED and work.attempts == 0 and work.due == 2.0
    assert p.ledger.books.provisional_usd == work.bound > 0  # maybe billed: booked at its bound until read
    assert work.lane.stats.booked_usd == work.bound and p.ledger.in_flight == 0
    assert work.lane.store.recorded == 0 and work.lane.stats.counts == {"retried": 1}
    assert work.lane.stats.errors == {"cancelled": 1}


class Named:
    """A Transport that streams: the service names the generation (its header), then nothing comes until closed."""

    async def handle_request(self, client, body, state=None):
        state.name("gen-hdr")
        await asyncio.get_running_loop().create_future()


def test_a_stream_is_heard_the_moment_the_service_names_it_and_read_back_by_that_name_when_closed(parts):
    p = parts({"A": 1}, routing=three(), transport=Named(), stream=True)
    work = p.dispatcher.take(0.0)
    heard = []
    p.requester.streams.on_named = lambda a: heard.append((a.state.generation_id, a.state.chunks))

    async def main():
        await p.requester.prepare(work)
        assert p.admit(work, 0.0) is not None
        attempt = p.requester.start(None, work, 0.0)
        await asyncio.sleep(0)
        assert heard == [("gen-hdr", 0)]  # before its first chunk: a kill from now on leaves its id in the journal
        attempt.state.chunk({"id": "gen-hdr", "choices": []})  # the first chunk names it again: heard once
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
        return attempt

    attempt = asyncio.run(main())
    assert heard == [("gen-hdr", 0)]
    p.settle(work, cancelled_outcome(), None, None, 2.0, go_on=True, generation_id=attempt.state.generation_id)
    assert list(p.ledger.readback.pending) == ["gen-hdr"]  # booked at its bound, its cost to read by that id


@pytest.mark.parametrize("stopping, go_on", [(True, True), (False, False)])
def test_a_cancelled_attempt_of_a_stopping_run_or_cut_with_its_slot_stays_to_do(parts, stopping, go_on):
    """What is in flight when the run stops (a signal), or cut with its slot at the run's end (stragglers): not
    sent again, not counted as an error; still booked at its bound."""
    p = parts({"A": 1}, routing=three(), transport=Scripted(HOLD))
    work = p.dispatcher.take(0.0)
    asyncio.run(p.requester.prepare(work))
    assert p.admit(work, 0.0) is not None
    if stopping:
        p.dispatcher.stop.set(StopReason.INTERRUPTED)
    p.settle(work, cancelled_outcome(), None, None, 2.0, go_on=go_on)
    assert work.state is State.CANCELLED and not work.lane.stats.counts and not work.lane.stats.errors
    assert p.ledger.books.provisional_usd == work.bound > 0


def test_cost_is_the_servers_else_the_serving_providers_price_else_the_worst(parts, tok):
    req = parts({"A": 1}, routing=three()).requester
    assert req.cost(completion(tok, provider="Mid", cost=0.0123)) == 0.0123
    assert req.cost(completion(tok, provider="Mid", cost=0.0)) == 0.0  # free is a price, not a missing one
    tokens = {"prompt_tokens": 100, "completion_tokens": 50}
    assert req.cost(completion(tok, provider="Mid", **tokens)) == pytest.approx((100 * 0.6 + 50 * 2.5) / 1e6)
    assert req.cost(completion(tok, provider="Cheap", **tokens)) == pytest.approx((100 * 0.5 + 50 * 2.0) / 1e6)
    for unknown in ("Unpriced", "Elsewhere"):  # no price listed, or not in the decision: the worst
        assert req.cost(completion(tok, provider=unknown, **tokens)) == pytest.approx((100 * 1.0 + 50 * 4.0) / 1e6)


def test_near_its_cut_a_dataset_sends_only_to_endpoints_that_stop_billing_and_its_streams_are_cuttable_at_once(parts):
    """Streamed with `at_target: cut`: an answer from an endpoint that bills whole answers finishes after the cut and
    passes the target, so near its cut a dataset leaves those endpoints out; its streams are then known to stop
    billing before their first chunk names the provider."""
    decision = routing(endpoint("Cancels", 0.5, 2.0, stream_cancellation=True), endpoint("Bills", 0.4, 1.8),
                       endpoint("Also", 0.6, 2.5, stream_cancellation=True), provider=PROVIDER)
    p = parts({"A": 2}, routing=decision, transport=Scripted(HOLD, HOLD), stream=True)
    req, work = p.requester, p.dispatcher.take(0.0)
    assert req.provider(work, 0.0) == PROVIDER
    work.lane.near_target = True
    assert req.provider(work, 0.0)["ignore"] == ["Bills", "bad/fp8"]
    req.at_target = "finish"  # whole answers wanted: every endpoint as before
    assert req.provider(work, 0.0) == PROVIDER
    req.at_target = "cut"

    async def main():
        await req.prepare(work)
        near = req.start(object(), work, 0.0)
        work.lane.near_target = False
        anywhere = req.start(object(), work, 0.0)
        await asyncio.sleep(0)
        assert req.streams.stops_billing(near) and not req.streams.stops_billing(anywhere)
        anywhere.state.provider = "Also"  # the first chunk named it
        assert req.streams.stops_billing(anywhere)
        near.cancel()
        anywhere.cancel()

    asyncio.run(main())
