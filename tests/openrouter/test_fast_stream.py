"""openrouter/fast_stream.py against the httpx path it replaces (`stream.stream_complete`): the same Outcome and the
same StreamState for every answer of a seeded emulator (every fault class), and for every way a small server can end a
response (keep-alive, `Connection: close`, a length, the connection's end, gzip, HTTP errors, drops, cuts, resets);
a cancel closes the connection, a silent stream is closed at the stall timeout, connections are reused."""
import asyncio
import dataclasses
import gzip
import json
import socket
import struct
import time

import httpx
import pytest

from eagledata.emulator import run_emulator
from eagledata.emulator.faults import FAULTS
from eagledata.generation import GenerateConfig
from eagledata.generation.run import run_generation
from eagledata.openrouter import Kind, build_request, classify_response
from eagledata.openrouter.client import LOCAL_KEY, make_client
from eagledata.openrouter.fast_stream import FastStreams
from eagledata.openrouter.stream import StreamState, stream_complete
from tests.openrouter.test_stream import USAGE, Chunks, _sse_server, chunk, sse

MODEL = "moonshotai/kimi-k2.5"
SMALL = {"reasoning_median": 60, "reasoning_sigma": 0.6, "content_median": 25, "content_sigma": 0.6, "max_total": 400}
QUIRKS = {"reasoning_details_only": 0.1, "inline_think": 0.08, "bare_close": 0.08, "special_spaces": 0.05,
          "literal_specials": 0.08, "reasoning_dropped": 0.15, "arguments_reserialized": 0.3}
# every fault class the emulator has, each about one request in twenty-five; `slow` without its delay (the number of
# keepalive comments while a request waits depends on the clock; every other byte of a stream is seeded)
EMULATOR = {"seed": 7, "speed": 0, "content": SMALL, "balance": 1000,
            "faults": {**{name: 0.04 for name in FAULTS}, "retry_after": 0, "slow_seconds": 0},
            "endpoints": [{"provider": "Chutes", "quirks": QUIRKS, "tool_call_ids": "call", "error_rate": 0.1},
                          {"provider": "DeepInfra", "quirks": {"reasoning_details_only": 0.5, "inline_think": 0.2}}]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
EVENTS = [chunk({"content": "", "reasoning": "Think."}), chunk({"content": "Answer."}), chunk({}, "stop"),
          chunk(usage=USAGE), b"[DONE]"]


@pytest.fixture(scope="module")
def emulator(tokenizer_dir):
    with run_emulator(EMULATOR) as emu:
        yield emu
        assert "Traceback" not in emu.log(), emu.log()[-3000:]


def body(i: int, **kw) -> dict:
    messages = [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]
    provider = kw.pop("provider", {"order": ["Chutes", "DeepInfra"]})  # the quirky endpoint, its fallback
    return build_request(MODEL, messages, max_tokens=400, temperature=1.0, provider=provider,
                         tools=TOOLS if i % 3 == 0 else None, stream=True, **kw)


async def _both(base_url: str, how, n: int) -> list[tuple]:
    async with make_client(base_url, LOCAL_KEY) as client, FastStreams() as fast:
        out = []
        for i in range(n):  # one at a time: the emulator draws each request's fault and content in arrival order
            state = StreamState()
            outcome = await (fast.complete(client, body(i), state) if how == "fast" else
                             stream_complete(client, body(i), state))
            out.append((outcome, state))
        return out


def seen(outcome, state, truth: dict[str, dict]) -> tuple:
    """An outcome and its final state, each generation id (the emulator draws them at random) named as the answer it
    is, the prompt's hash and attempt (an id the emulator did not bill: whether there was one)."""
    def name(gid: str) -> str:
        g = truth.get(gid)
        return f"{g['prompt_hash']}#{g['attempt']}" if g else bool(gid)

    c = outcome.completion
    c = None if c is None else dataclasses.replace(c, generation_id=name(c.generation_id))
    return (dataclasses.replace(outcome, completion=c), state.chunks, state.keepalives, state.done, state.chars,
            name(state.generation_id), state.provider, state.usage, state.error, state.finish_reason)


def run_seeded(emu, how: str, n: int = 300) -> tuple[list[tuple], dict]:
    emu.reset(EMULATOR)
    got = asyncio.run(_both(emu.base_url, how, n))
    truth = {g["generation_id"]: g for g in emu.ground_truth()}
    return [seen(o, s, truth) for o, s in got], emu.stats()


def test_every_seeded_answer_is_read_as_the_httpx_path_reads_it(emulator):
    slow, slow_stats = run_seeded(emulator, "httpx")
    fast, fast_stats = run_seeded(emulator, "fast")
    assert fast == slow
    assert fast_stats["outcomes"] == slow_stats["outcomes"] and fast_stats["faults"] == slow_stats["faults"]
    assert all(slow_stats["faults"][name] > 0 for name in FAULTS), slow_stats["faults"]  # every class drawn
    classes = {o.error_class for o, *_ in fast}
    assert {"ok", "error_in_choice", "error_in_body", "malformed", "empty", "bad_gateway", "rate_limit",
            "upstream_rate_limit", "budget_inflight", "unavailable", "timeout", "connection",
            "reasoning_missing"} <= classes, classes
    assert any(o.completion and o.completion.answer.tool_calls for o, *_ in fast)
    assert sum(o.kind is Kind.OK for o, *_ in fast) > 100


def test_the_seeded_comparison_catches_a_lost_byte(emulator, monkeypatch):
    """It can fail: a read path that loses one byte of each 5th read gives other outcomes."""
    from eagledata.openrouter import fast_stream

    reads = 0
    real = fast_stream.feed

    def lossy(decoder, state, raw):
        nonlocal reads
        reads += 1
        return real(decoder, state, raw[1:] if reads % 5 == 0 else raw)

    slow, _ = run_seeded(emulator, "httpx", 60)
    monkeypatch.setattr(fast_stream, "feed", lossy)
    fast, _ = run_seeded(emulator, "fast", 60)
    assert reads > 12 and fast != slow


def test_sequential_requests_reuse_one_connection(emulator):
    emulator.reset({"seed": 1, "speed": 0, "content": SMALL, "balance": 1000})

    async def main():
        async with make_client(emulator.base_url, LOCAL_KEY) as client, FastStreams() as fast:
            outs = [await fast.complete(client, body(i)) for i in range(20)]
            return outs, fast.opened, fast.idle()

    outs, opened, idle = asyncio.run(main())
    assert all(o.kind is Kind.OK for o in outs)
    assert (opened, idle) == (1, 1)


def test_a_cancelled_stream_closes_its_connection_and_keeps_what_streamed(emulator):
    """Cancelling the awaiting task closes the connection: the emulator's endpoint with stream cancellation stops
    and bills the tokens so far (`cancelled`), and the state holds what streamed until then."""
    emulator.reset({"seed": 1, "speed": 1, "balance": 1000, "content": {"reasoning_median": 400, "content_median": 50},
                    "endpoints": [{"provider": "Fireworks", "latency": 0.05, "throughput": 100}]})

    async def main():
        async with make_client(emulator.base_url, LOCAL_KEY) as client, FastStreams() as fast:
            state = StreamState()
            task = asyncio.ensure_future(fast.complete(client, body(1, provider={"only": ["Fireworks"]}), state))
            while state.chunks < 3:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0)
            return state, fast.idle(), len(fast._live)

    state, idle, live = asyncio.run(main())
    deadline = time.monotonic() + 60  # a hang guard: the service settles the closed stream at once
    while (stats := emulator.stats())["outcomes"].get("cancelled") != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stats["outcomes"].get("cancelled") == 1 and stats["in_flight"] == 0
    assert (idle, live) == (0, 0)  # closed, not pooled
    assert not state.done and state.chunks >= 3 and state.chars > 0 and state.generation_id.startswith("gen-")
    assert state.provider == "Fireworks"


# -- a small server: every way a response can end ---------------------------------------------------------------
def _chunked(data: bytes, step: int = 40) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + step]), data[i:i + step]) for i in range(0, len(data), step))


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-generation-id: gen-7\r\n"
RAW = sse(*EVENTS)


def _abort(writer) -> None:
    writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _json(status: int, obj: dict, extra: bytes = b"") -> bytes:
    data = json.dumps(obj).encode()
    return b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status, len(data), extra, data)


async def _answer(what: str, writer) -> bool:
    """Write the answer `what` names; False: the connection ends after it."""
    w = writer.write
    if what in ("sse", "json-sse"):
        w(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n")
        for i in range(0, len(RAW), 40):  # in separate reads
            w(_chunked(RAW[i:i + 40]))
            await writer.drain()
            await asyncio.sleep(0.001)
        w(b"0\r\n\r\n")
    elif what == "close":
        w(SSE_HEAD + b"connection: close\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(RAW) + b"0\r\n\r\n")
        return False
    elif what == "length":
        w(SSE_HEAD + b"content-length: %d\r\n\r\n%s" % (len(RAW), RAW))
    elif what == "eof":  # no length: the body ends with the connection
        w(SSE_HEAD + b"\r\n" + RAW)
        return False
    elif what == "gzip":
        w(SSE_HEAD + b"content-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(gzip.compress(RAW))
          + b"0\r\n\r\n")
    elif what == "crlf":
        w(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(sse(*EVENTS, end=b"\r\n"), 7) + b"0\r\n\r\n")
    elif what == "429":
        w(_json(429, {"error": {"code": 429, "message": "Rate limit exceeded"}}, b"retry-after: 3\r\n"))
    elif what == "402":
        w(_json(402, {"error": {"code": 402, "message": "Insufficient credits"}}))
    elif what == "402-retry":
        w(_json(402, {"error": {"code": 402, "message": "in-flight"}}, b"retry-after: 1\r\n"))
    elif what == "500-text":
        w(b"HTTP/1.1 500 Oops\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
          + _chunked(b"upstream exploded") + b"0\r\n\r\n")
    elif what == "json":  # a server that ignores `stream`
        w(_json(200, {**{k: EVENTS[0][k] for k in ("id", "provider", "model")}, "usage": USAGE, "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"content": "Answer.", "reasoning": "Think."}}]}))
    elif what == "done-early":  # an error chunk, then more bytes: the stream has said all at the error
        err = {**chunk({"content": ""}, "error"), "error": {"code": 502, "message": "gone"}}
        w(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(sse(chunk({"content": "Half"}), err))
          + _chunked(sse(chunk({"content": "more"}))) + b"0\r\n\r\n")
    elif what == "drop":  # closed before any answer
        return False
    elif what == "cut":  # the connection ends inside the chunked body
        w(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(RAW[:100]))
        return False
    elif what == "cut-length":
        w(SSE_HEAD + b"content-length: %d\r\n\r\n%s" % (len(RAW), RAW[:100]))
        return False
    elif what == "reset":  # reset inside the body
        w(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(RAW[:100]))
        await writer.drain()
        await asyncio.sleep(0.05)
        _abort(writer)
        return False
    elif what == "reset-early":
        _abort(writer)
        return False
    else:
        raise AssertionError(what)
    await writer.drain()
    return True


class Server:
    """HTTP/1.1 on 127.0.0.1 with keep-alive: each request's first message says how to answer it; counts accepted
    connections and keeps the requests' heads."""

    def __init__(self):
        self.accepted, self.heads, self.bodies = 0, [], []

    async def serve(self, reader, writer):
        self.accepted += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                raw = await reader.readexactly(length)
                self.heads.append(head)
                self.bodies.append(raw)
                if not await _answer(json.loads(raw)["messages"][0]["content"], writer):
                    return
        finally:
            if not writer.transport.is_closing():
                writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/api/v1"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


def ask(what: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": what}]}


def state_of(s: StreamState) -> tuple:
    return s.chunks, s.keepalives, s.done, s.chars, s.generation_id, s.body()


SCENARIOS = ["sse", "close", "length", "eof", "gzip", "crlf", "429", "402", "402-retry", "500-text", "json",
             "done-early", "drop", "cut", "cut-length", "reset", "reset-early"]


@pytest.mark.parametrize("what", SCENARIOS)
def test_each_way_a_response_ends_reads_as_over_httpx(what):
    async def main():
        async with Server() as server, make_client(server.url, LOCAL_KEY) as client, FastStreams() as fast:
            a, b = StreamState(), StreamState()
            slow = await stream_complete(client, ask(what), a)
            quick = await fast.complete(client, ask(what), b)
            return slow, a, quick, b

    slow, a, quick, b = asyncio.run(main())
    assert quick == slow
    assert state_of(b) == state_of(a)


def test_the_scenarios_end_as_they_say():
    """What the comparison above compares: each scenario's own outcome (so a scenario that answered nothing, or the
    same for all, would show here)."""
    async def main():
        async with Server() as server, make_client(server.url, LOCAL_KEY) as client, FastStreams() as fast:
            return {what: await fast.complete(client, ask(what)) for what in SCENARIOS}

    got = asyncio.run(main())
    ok = {w for w, o in got.items() if o.kind is Kind.OK}
    assert ok == {"sse", "close", "length", "eof", "gzip", "crlf", "json"}
    assert got["sse"].completion.answer.content == "Answer." and got["sse"].completion.generation_id == "gen-7"
    assert (got["429"].error_class, got["429"].retry_after) == ("rate_limit", 3.0)
    assert (got["402"].kind, got["402"].error_class) == (Kind.OUT_OF_MONEY, "no_credits")
    assert got["402-retry"].error_class == "budget_inflight" and got["500-text"].error_class == "server_error"
    assert got["done-early"].error_class == "error_in_choice"
    assert {w: got[w].message for w in ("drop", "cut", "cut-length", "reset", "reset-early")} == {
        "drop": "RemoteProtocolError: Server disconnected without sending a response.",
        "cut": "RemoteProtocolError: peer closed connection without sending complete message body (incomplete "
               "chunked read)",
        "cut-length": "RemoteProtocolError: peer closed connection without sending complete message body (received "
                      f"100 bytes, expected {len(RAW)})",
        "reset": "ReadError: ", "reset-early": "ReadError: "}
    assert all(got[w].error_class == "connection" for w in ("drop", "cut", "cut-length", "reset", "reset-early"))


def test_http_errors_are_classified_as_classify_response_classifies_them():
    async def main():
        async with Server() as server, make_client(server.url, LOCAL_KEY) as client, FastStreams() as fast:
            return [await fast.complete(client, ask(what)) for what in ("429", "402")]

    busy, broke = asyncio.run(main())
    raw429 = json.dumps({"error": {"code": 429, "message": "Rate limit exceeded"}}).encode()
    raw402 = json.dumps({"error": {"code": 402, "message": "Insufficient credits"}}).encode()
    assert busy == classify_response(429, {"retry-after": "3"}, raw429) and busy.retry_after == 3.0
    assert broke == classify_response(402, {}, raw402) and broke.kind is Kind.OUT_OF_MONEY


def test_keep_alive_reuses_one_connection_and_connection_close_is_not_reused():
    async def main():
        async with Server() as server, make_client(server.url, LOCAL_KEY) as client, FastStreams() as fast:
            outs = [await fast.complete(client, ask(w)) for w in ("sse", "429", "length", "done-early", "sse", "gzip")]
            kept = server.accepted, fast.opened, fast.idle()
            closing = await fast.complete(client, ask("close"))
            after_close = server.accepted, fast.idle()
            again = await fast.complete(client, ask("sse"))
            return outs, kept, closing, after_close, again, server.accepted, server.heads

    outs, kept, closing, after_close, again, accepted, heads = asyncio.run(main())
    assert [o.kind for o in outs] == [Kind.OK, Kind.RETRY, Kind.OK, Kind.RETRY, Kind.OK, Kind.OK]
    assert kept == (1, 1, 1)  # six answers (one said all before its end) over one connection
    assert closing.kind is Kind.OK and after_close == (1, 0)  # answered, then closed: not pooled
    assert again.kind is Kind.OK and accepted == 2
    head = heads[0].decode().lower()
    assert head.startswith("post /api/v1/chat/completions http/1.1\r\n")
    for line in ("accept: text/event-stream", "accept-encoding: identity", "content-type: application/json",
                 f"authorization: bearer {LOCAL_KEY}", "x-title: eagledata"):
        assert f"\r\n{line}\r\n" in head, head


def test_the_body_is_encoded_as_httpx_encodes_it():
    payload = {**ask("sse"), "messages": [{"role": "user", "content": "sse"}], "note": "Zürich ✓"}

    async def main():
        async with Server() as server, make_client(server.url, LOCAL_KEY) as client, FastStreams() as fast:
            await stream_complete(client, payload)
            await fast.complete(client, payload)
            return server.bodies

    slow, quick = asyncio.run(main())
    assert quick == slow and b'"stream":true' in quick and "Zürich ✓".encode() in quick


def test_a_refused_connection_is_a_connection_error_as_over_httpx():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there

    async def main():
        async with make_client(f"http://127.0.0.1:{port}/api/v1", LOCAL_KEY) as client, FastStreams() as fast:
            return await stream_complete(client, ask("sse")), await fast.complete(client, ask("sse"))

    slow, quick = asyncio.run(main())
    assert quick == slow and quick.message == "ConnectError: All connection attempts failed"


def test_a_stream_silent_past_the_stall_timeout_is_closed_as_over_httpx():
    """As tests/openrouter/test_stream.py's stall test, both ways: closed at the stall (its state keeps what came),
    keepalive comments keep a stream alive, the client's read timeout without a stall timeout."""
    async def script(what, send):
        if what == "stall":
            await send(sse(*EVENTS[:2], comments=0))
            await asyncio.sleep(5)
        else:  # keepalive comments every 0.1 s for 1 s, then the answer
            for _ in range(10):
                await send(b": OPENROUTER PROCESSING\n\n")
                await asyncio.sleep(0.1)
            await send(sse(*EVENTS, comments=0))

    async def one(how, client, fast, what, state=None, **kw):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if how == "fast":
            out = await fast.complete(client, ask(what), state, **kw)
        else:
            out = await stream_complete(client, ask(what), state, **kw)
        return out, loop.time() - t0

    async def main(how):
        server = await _sse_server(script)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        async with server, httpx.AsyncClient(base_url=url, timeout=30) as c, FastStreams() as fast:
            state = StreamState()
            stalled = await one(how, c, fast, "stall", state, stall_timeout_s=0.5)
            closed = fast.idle() == 0 and not fast._live
            kept = await one(how, c, fast, "keepalive", stall_timeout_s=0.5)
            async with httpx.AsyncClient(base_url=url, timeout=0.5) as short:
                by_client = await one(how, short, fast, "stall")
            return stalled, state, closed, kept, by_client

    for how in ("httpx", "fast"):
        (stalled, waited), state, closed, (kept, _), (by_client, waited_client) = asyncio.run(main(how))
        assert (stalled.kind, stalled.error_class, stalled.message) == (Kind.RETRY, "client_timeout",
                                                                       "stalled: no bytes for 0.5 s"), how
        # closed at the stall, not when the server ends its stream 5 s on (an incomplete stream, not "stalled"); how
        # soon after 0.5 s is the loop's, whatever the machine's load: only its lower bound is the timer's
        assert waited >= 0.5 and closed
        assert state.chunks == 2 and state.body()["choices"][0]["message"]["reasoning"] == "Think."
        assert kept.kind is Kind.OK and kept.completion.answer.content == "Answer."
        assert (by_client.error_class, by_client.message) == ("client_timeout", "ReadTimeout") and waited_client >= 0.5


def test_a_client_through_another_transport_is_read_over_httpx():
    """A mounted or mock transport (a proxy from the environment, a test's) keeps the httpx path: never bypassed."""
    def handler(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks([RAW]))

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x/api/v1/") as c, \
                FastStreams() as fast:
            return await fast.complete(c, ask("hi")), fast.opened

    out, opened = asyncio.run(main())
    assert out.kind is Kind.OK and opened == 0


def test_the_engine_streams_through_fast_streams_and_closes_them(tmp_path, emulator, monkeypatch):
    emulator.reset({"seed": 2, "speed": 0, "content": SMALL, "balance": 1000})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Q{i}"}]}) + "\n"
                               for i in range(6)))
    (tmp_path / "datasets.yaml").write_text(f"P:\n  prompts: {prompts}\n")
    calls, closed = [], []
    complete, aclose = FastStreams.complete, FastStreams.aclose

    async def spy(self, *a, **kw):
        calls.append(1)
        return await complete(self, *a, **kw)

    async def spy_close(self):
        closed.append(self.opened)
        await aclose(self)

    monkeypatch.setattr(FastStreams, "complete", spy)
    monkeypatch.setattr(FastStreams, "aclose", spy_close)
    cfg = GenerateConfig(dataset="P", datasets_file=str(tmp_path / "datasets.yaml"), base_url=emulator.base_url,
                         output_dir=str(tmp_path / "out"), params_dir=str(tmp_path / "params"), concurrency=2,
                         max_tokens=400, progress=False, reserve_usd=0.0, stream=True)
    summary = asyncio.run(run_generation(cfg))
    assert summary["records"] == 6 and len(calls) >= 6
    assert len(closed) == 1 and 1 <= closed[0] <= 2  # one pool, closed with the run; its connections reused
