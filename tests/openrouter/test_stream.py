"""openrouter/stream.py on hand-written chunk sequences: the SSE framing, the assembly of deltas into the body a JSON
answer would hold (so the same Completion and Outcome), error chunks, cut streams, and the read over httpx."""
import asyncio
import json

import httpx
import pytest

from eagledata.openrouter import Kind, classify_response
from eagledata.openrouter.client import complete
from eagledata.openrouter.stream import SSEDecoder, StreamState, classify_stream, stream_complete

USAGE = {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
         "completion_tokens_details": {"reasoning_tokens": 3}, "cost": 2.5e-5}
ENVELOPE = {"id": "gen-7", "provider": "DeepInfra", "model": "moonshotai/kimi-k2.5-0127",
            "object": "chat.completion.chunk", "created": 1}


def chunk(delta=None, finish=None, **top):
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "native_finish_reason": finish}]
    return {**ENVELOPE, "choices": choices, **top}


def sse(*events, comments=1, end=b"\n"):
    """The bytes of a stream: comments, then each event as `data: <json>` and a blank line, then [DONE]."""
    out = b"".join(b": OPENROUTER PROCESSING" + end + end for _ in range(comments))
    for e in events:
        out += b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + end + end
    return out


def assemble(raw: bytes, step: int | None = None) -> StreamState:
    """Feed the bytes in reads of `step` bytes (None: one read) to a decoder and a state."""
    decoder, state = SSEDecoder(), StreamState()
    for i in range(0, len(raw), step or len(raw) or 1):
        for payload in decoder.feed(raw[i:i + (step or len(raw))]):
            state.add(payload)
    for payload in decoder.close():
        state.add(payload)
    state.keepalives = decoder.comments
    return state


def json_outcome(body):
    return classify_response(200, httpx.Headers({}), json.dumps(body).encode())


# -- framing ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("step", [None, 1, 7])
def test_framing_by_line_end_and_read_size(end, step):
    raw = sse({"a": 1}, {"b": "x\ny"}, b"[DONE]", comments=2, end=end)
    decoder = SSEDecoder()
    got = [p for i in range(0, len(raw), step or len(raw)) for p in decoder.feed(raw[i:i + (step or len(raw))])]
    got += decoder.close()  # a lone CR ending the stream is a line end
    assert got == [b'{"a": 1}', b'{"b": "x\\ny"}', b"[DONE]"] and decoder.comments == 2


def test_multi_line_data_other_fields_and_a_partial_last_event():
    raw = (b"event: message\nid: 3\nretry: 10\ndata:{\"a\":\ndata:  1}\n\n"  # no space after the colon; two spaces
           b"data\n\n"  # an empty data field: nothing to dispatch
           b":comment without a space\n\n"
           b"data: {\"cut\": tr")  # the stream ends inside an event: never dispatched
    decoder = SSEDecoder()
    assert decoder.feed(raw) == [b'{"a":\n 1}'] and decoder.comments == 1
    assert decoder.feed(b"") == []


def test_a_crlf_split_between_reads_is_one_line_end():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\r") == []
    assert decoder.feed(b"\n\r") == []  # CR LF was one line end; the next CR waits for what follows it
    assert decoder.feed(b"\ndata: 2\r\r") == [b"1"]  # it was CR LF: the blank line
    assert decoder.close() == [b"2"]


# -- assembly: the body a JSON answer would hold --------------------------------------------------------------
def test_reasoning_content_and_split_tool_call_arguments_assemble_to_the_json_answer():
    args = json.dumps({"city": "Zürich", "days": 3}, ensure_ascii=False)
    call = {"id": "functions.weather:0", "type": "function", "function": {"name": "weather", "arguments": args}}
    body = {**{k: ENVELOPE[k] for k in ("id", "provider", "model")},
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me look.", "reasoning": "Think. Then call.",
                "reasoning_details": [{"type": "reasoning.text", "text": "Think. Then call.", "index": 0}],
                "tool_calls": [call]}}], "usage": USAGE}
    events = [chunk({"role": "assistant", "content": "", "reasoning": p,
                     "reasoning_details": [{"type": "reasoning.text", "text": p, "index": 0}]})
              for p in ("Think.", " Then", " call.")]
    events += [chunk({"content": "Let me"}), chunk({"content": " look."}),
               chunk({"content": None, "tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                                        "function": {"name": "weather", "arguments": ""}}]})]
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 5]}}]})
               for i in range(0, len(args), 5)]
    events += [chunk({"content": ""}, "tool_calls"), chunk(usage=USAGE), b"[DONE]"]
    for step in (None, 3):
        state = assemble(sse(*events), step)
        streamed, whole = classify_stream(state), json_outcome(body)
        assert streamed.kind is Kind.OK and streamed == whole
        assert streamed.completion.answer.tool_calls[0].arguments == args  # the pieces, joined as served
        assert (state.chunks, state.keepalives, state.done) == (len(events) - 1, 1, True)
        assert state.chars == len("Think. Then call.") + len("Let me look.")  # reasoning counted once


def test_reasoning_only_in_reasoning_details():
    events = [chunk({"content": "", "reasoning": None, "reasoning_details": [{"type": "reasoning.text", "text": p,
                                                                                "format": "unknown", "index": 0}]})
              for p in ("Step 1. ", "Step 2.")]
    events += [chunk({"content": "Answer."}), chunk({"content": ""}, "stop"), chunk(usage=USAGE), b"[DONE]"]
    state = assemble(sse(*events))
    out = classify_stream(state)
    assert (out.completion.answer.reasoning, out.completion.answer.content) == ("Step 1. Step 2.", "Answer.")
    assert state.body()["choices"][0]["message"]["reasoning"] is None  # as a details-only JSON body has it
    assert state.chars == len("Step 1. Step 2.Answer.")


def test_inline_think_in_streamed_content_is_split_as_in_a_body():
    events = [chunk({"content": "<think>inl"}), chunk({"content": "ine</think>\nAnswer."}), chunk({}, "stop"),
              chunk(usage=USAGE), b"[DONE]"]
    c = classify_stream(assemble(sse(*events))).completion
    assert (c.answer.reasoning, c.answer.content, c.reasoning_inline) == ("inline", "\nAnswer.", True)


# -- errors and cut streams -----------------------------------------------------------------------------------
def test_the_documented_mid_stream_error_chunk_is_a_retried_choice_error():
    events = [chunk({"content": "Half an ans"}),
              {**chunk({"content": ""}, "error"), "error": {"code": "server_error",
                                                           "message": "Provider disconnected unexpectedly"}}]
    out = classify_stream(assemble(sse(*events)))
    assert (out.kind, out.error_class, out.provider) == (Kind.RETRY, "error_in_choice", "DeepInfra")
    assert out.message == "Provider disconnected unexpectedly"


def test_an_error_chunk_classifies_as_the_json_body_carrying_that_error():
    err = {"code": 502, "message": "Provider returned error", "metadata": {"raw": "x", "provider_name": "Chutes"}}
    streamed = classify_stream(assemble(sse(chunk({"content": "a"}), {**chunk({"content": ""}, "error"),
                                                                      "error": err})))
    body = {**{k: ENVELOPE[k] for k in ("id", "provider", "model")},
            "choices": [{"index": 0, "finish_reason": "error", "message": {"content": ""}, "error": err}]}
    assert streamed == json_outcome(body) and streamed.error_class == "error_in_choice"
    # an error with no choice beside it: the body's top-level error, its own kind kept (no credits: stop issuing)
    top = classify_stream(assemble(sse({"error": {"code": 402, "message": "no credits"}})))
    assert (top.kind, top.error_class) == (Kind.OUT_OF_MONEY, "no_credits")
    top = classify_stream(assemble(sse(chunk({"content": "a"}), {"error": {"code": 502, "message": "bad"}})))
    assert (top.kind, top.error_class) == (Kind.RETRY, "error_in_body")


@pytest.mark.parametrize("raw, why", [
    (sse(chunk({"content": "an answer"}), chunk({}, "stop"), chunk(usage=USAGE)), "before [DONE]"),  # no [DONE]
    (sse(chunk({"content": "an answer"}))[:-1] + b'data: {"id": "gen-7", "choi', "before [DONE]"),  # a cut line
    (sse(chunk({"content": "an answer"}), chunk({}, "stop"), b"[DONE]"), "usage"),  # no usage chunk
    (sse(chunk({"content": "a"}), b"{not json", chunk({}, "stop"), chunk(usage=USAGE), b"[DONE]"), "not JSON"),
])
def test_a_cut_or_incomplete_stream_is_malformed_as_a_cut_body(raw, why):
    out = classify_stream(assemble(raw))
    assert (out.kind, out.error_class) == (Kind.RETRY, "malformed") and why in out.message


# -- over httpx ----------------------------------------------------------------------------------------------
class Chunks(httpx.AsyncByteStream):
    def __init__(self, parts, hang=False):
        self.parts, self.hang = parts, hang

    async def __aiter__(self):
        for p in self.parts:
            yield p
            await asyncio.sleep(0)
        if self.hang:
            await asyncio.Event().wait()  # a stream still generating


def client(handler):
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x/api/v1/")


def test_stream_complete_reads_sse_and_http_errors_before_it():
    sent = []
    events = [chunk({"content": "", "reasoning": "Think."}), chunk({"content": "Answer."}), chunk({}, "stop"),
              chunk(usage=USAGE), b"[DONE]"]

    def handler(request):
        body = json.loads(request.content)
        sent.append(body)
        if body["messages"][0]["content"] == "busy":
            return httpx.Response(429, json={"error": {"code": 429, "message": "Rate limit exceeded"}},
                                  headers={"Retry-After": "3"})
        if body["messages"][0]["content"] == "json":  # a server that ignores `stream`
            return httpx.Response(200, json={**ENVELOPE, "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "content": "Answer.", "reasoning": "Think."}}], "usage": USAGE})
        raw = sse(*events)
        return httpx.Response(200, headers={"content-type": "text/event-stream", "x-generation-id": "gen-7"},
                              stream=Chunks([raw[i:i + 40] for i in range(0, len(raw), 40)]))

    async def main():
        async with client(handler) as c:
            state = StreamState()
            ok = await complete(c, {"messages": [{"role": "user", "content": "hi"}], "stream": True}, state)
            busy = await complete(c, {"messages": [{"role": "user", "content": "busy"}], "stream": True})
            plain = await complete(c, {"messages": [{"role": "user", "content": "json"}], "stream": True})
            return ok, state, busy, plain

    ok, state, busy, plain = asyncio.run(main())
    assert sent[0]["stream"] is True
    assert ok.kind is Kind.OK and ok.completion.answer.content == "Answer." and ok.completion.generation_id == "gen-7"
    assert (state.chunks, state.keepalives, state.chars) == (4, 1, len("Think.Answer."))
    assert (busy.error_class, busy.retry_after) == ("rate_limit", 3.0)
    assert plain.kind is Kind.OK and plain.completion == ok.completion


def test_a_cancelled_stream_keeps_what_it_delivered():
    """The seam for cancelling mid-stream: the awaiting task is cancelled, the response is closed, and the caller's
    state holds what streamed until then (what a cut sample will be made from)."""
    closed = asyncio.Event()

    class Held(Chunks):
        async def aclose(self):
            closed.set()

    def handler(request):
        raw = sse(chunk({"content": "", "reasoning": "Long thought"}), chunk({"content": "Half"}))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Held([raw], hang=True))

    async def main():
        async with client(handler) as c:
            state = StreamState()
            task = asyncio.ensure_future(stream_complete(c, {"messages": []}, state))
            while state.chunks < 2:
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return state, closed.is_set()

    state, was_closed = asyncio.run(main())
    assert was_closed and not state.done and state.generation_id == "gen-7"
    message = state.body()["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("Long thought", "Half")


async def _sse_server(script):
    """A real HTTP server on 127.0.0.1 (httpx's read timeouts live in its network layer, which a mock transport
    skips): each request's body is handed to `script(messages, send)`, which writes the SSE with pauses."""
    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        body = json.loads(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        async def send(data: bytes):
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        try:
            await script(body["messages"][0]["content"], send)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def test_a_stream_silent_past_the_stall_timeout_is_closed_and_retried_one_kept_alive_is_not():
    """A stream that stops sending is closed after stall_timeout_s, however long it has run (client_timeout, a
    retry; its state keeps what came); one that sends only keepalive comments for longer than that is waited for,
    as OpenRouter sends them while a request waits; without a stall timeout the client's read timeout applies."""
    events = [chunk({"content": "", "reasoning": "Think."}), chunk({"content": "Answer."}), chunk({}, "stop"),
              chunk(usage=USAGE), b"[DONE]"]

    async def script(what, send):
        if what == "stall":
            await send(sse(*events[:2], comments=0))
            await asyncio.sleep(5)
        else:  # keepalive comments every 0.1 s for 1 s, then the answer
            for _ in range(10):
                await send(b": OPENROUTER PROCESSING\n\n")
                await asyncio.sleep(0.1)
            await send(sse(*events, comments=0))

    async def main():
        server = await _sse_server(script)
        port = server.sockets[0].getsockname()[1]
        async with server, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/", timeout=30) as c:
            state = StreamState()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            stalled = await complete(c, {"messages": [{"role": "user", "content": "stall"}], "stream": True}, state,
                                     stall_timeout_s=0.5)
            waited = loop.time() - t0
            kept = await complete(c, {"messages": [{"role": "user", "content": "keepalive"}], "stream": True},
                                  stall_timeout_s=0.5)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/", timeout=0.5) as short:
                by_client = await complete(short, {"messages": [{"role": "user", "content": "stall"}],
                                                   "stream": True})
            return stalled, waited, state, kept, by_client

    stalled, waited, state, kept, by_client = asyncio.run(main())
    assert (stalled.kind, stalled.error_class, stalled.message) == (Kind.RETRY, "client_timeout",
                                                                   "stalled: no bytes for 0.5 s")
    # closed at the stall, not when the server ends its stream 5 s on (that would be an incomplete stream, not
    # "stalled"); how soon after 0.5 s is the loop's, whatever the machine's load: only its lower bound is the timer's
    assert waited >= 0.5
    assert state.chunks == 2 and state.body()["choices"][0]["message"]["reasoning"] == "Think."
    assert kept.kind is Kind.OK and kept.completion.answer.content == "Answer."  # 1 s of keepalives, each < 0.5 s
    assert (by_client.error_class, by_client.message) == ("client_timeout", "ReadTimeout")


@pytest.mark.parametrize("text", [
    "思考。\n下一步：先算 2+2=4。\n然后 check it.\nDone: yes!\n\nNext line,\tand (more) words here's it",
    "First, x = 1.\nThen y.\n\n- item one\n- item two:\n  12345 apples\nend",
])
def test_a_cut_stream_keeps_a_prefix_of_the_full_texts_ids_wherever_it_is_cut(tok, text):
    """A cut sample's text ends where the tokenizer is sure to split, whatever followed: its ids are the first ids of
    the whole answer's. A newline after punctuation is no such place: `。\\n` and `.\\n` are one token each."""
    from eagledata.openrouter.stream import word_boundary

    whole = tok.encode_ordinary(text)
    for k in range(1, len(text) + 1):
        cut = tok.encode_ordinary(word_boundary(text[:k]))
        assert cut == whole[:len(cut)], (k, text[:k])
