"""Streamed chat completions: SSE read incrementally, deltas assembled into the answer the JSON body would hold.

A streamed answer is classified by the same code as a JSON one (`answers.classify_body`): the chunks are assembled
into the body they add up to (`StreamState.body`), so both ways of asking give the same `Completion` (hence the same
record) and the same error classes. What only a stream can say is decided here first: a mid-stream error chunk (the
error of the choice it ends, as a JSON body's `choices[0].error`; one without choices as a top-level error), and a
stream that stopped before `data: [DONE]` or without its usage chunk (`malformed`, as a cut JSON body: generated,
maybe billed, the bytes lost).

The parts, each small enough to be measured on its own (bench/README.md, issue 42):
- `SSEDecoder`: bytes → the data payloads of complete events (LF, CRLF or CR line ends, comments, multi-line data);
- `StreamState`: what the stream delivered so far, updated chunk by chunk. A caller that passes one in can read it
  while the request runs (how far an answer has got) and keeps it when the request is cancelled (what streamed
  until then): cancelling the awaiting task closes the response, which is what stops generation and billing on
  providers with stream cancellation;
- `stream_complete`: one POST read to its end.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..records import CUT, Answer
from .answers import Completion, Kind, Outcome, classify_body, classify_exception, classify_response, parse_completion

DONE = b"[DONE]"
_STRING_PARTS = ("text", "summary", "data")  # reasoning_details fields that arrive in pieces
DELIVERED = ("reasoning", "reasoning_content", "content")  # the delta fields `delivered_since` gives
# ... and the reasoning a stream serves only in `reasoning_details` (no `reasoning` field), as one string
DETAILS_TEXT = "reasoning_details_text"
NO_MARK = (0, 0, 0, 0)  # `delivered_since`'s mark before anything was journaled


class SSEDecoder:
    """Incremental server-sent-events framing, as the WHATWG rules have it for what the service sends: a line ends
    in LF, CRLF or CR (a CR that ends one read waits for the next, which may start with its LF); a line starting
    with `:` is a comment (OpenRouter's `: OPENROUTER PROCESSING` keepalives: counted); `data:` lines (one optional
    space after the colon) of one event are joined by LF; a blank line dispatches the event; other fields (`event`,
    `id`, `retry`) are ignored. An event not ended by a blank line when the stream ends is never dispatched (a cut
    stream's last, partial chunk)."""

    __slots__ = ("_buf", "_data", "comments")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self.comments = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data payloads of the events this chunk completes, in order."""
        if self._buf:
            chunk = self._buf + chunk
        if b"\r" in chunk:  # rare: the service ends lines in LF
            held = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:  # the LF of a CRLF may come with the next read: keep the CR, undecided
                chunk = chunk[:-1]
        else:
            held = False
        lines = chunk.split(b"\n")
        self._buf = lines.pop() + (b"\r" if held else b"")
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    data.clear()
                    if payload:
                        out.append(payload)
            elif line[0] == 58:  # b":"
                self.comments += 1
            elif line.startswith(b"data"):
                name, _, value = line.partition(b":")
                if name == b"data":
                    data.append(value[1:] if value[:1] == b" " else value)
        return out

    def close(self) -> list[bytes]:
        """The stream ended: a CR held at the end of the last read was a line end after all."""
        if not self._buf.endswith(b"\r"):
            return []
        self._buf = self._buf[:-1]
        return self.feed(b"\n")


@dataclass(eq=False)
class StreamState:
    """What one stream has delivered so far, assembled: readable while the request runs, kept when it is cut.

    `chunks` counts data events, `keepalives` comments, `chars` the reasoning and content characters so far (a
    measure of how far the answer has got before the service's token count arrives with the usage chunk)."""

    generation_id: str = ""  # the chunks' `id` (before the first chunk: the X-Generation-Id header)
    provider: str = ""
    model: str = ""
    chunks: int = 0
    keepalives: int = 0
    chars: int = 0
    done: bool = False  # `data: [DONE]` came
    error: dict[str, Any] | None = None  # the first error chunk's `error`
    error_ends_choice: bool = False  # it came with `finish_reason: "error"` on a choice (the documented shape)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    malformed: str = ""  # why a data event could not be read ("" when every one could)
    _reasoning: list[str] = field(default_factory=list)
    _reasoning_seen: bool = False  # a delta carried `reasoning` as a string (else the body's `reasoning` is null)
    _reasoning_content: list[str] = field(default_factory=list)  # vLLM / SGLang naming
    _content: list[str] = field(default_factory=list)
    _details: dict[Any, dict[str, Any]] = field(default_factory=dict)
    _calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    on_named: Callable[[str], None] | None = field(default=None, repr=False)  # hears the generation id, once

    def name(self, generation_id: str) -> None:
        """The service named the generation (the X-Generation-Id header, else the first chunk's `id`): what its cost
        is read by, should the stream never see its usage chunk. `on_named` hears it as it comes."""
        if generation_id and not self.generation_id:
            self.generation_id = generation_id
            if self.on_named is not None:
                self.on_named(generation_id)

    def add(self, payload: bytes) -> bool:
        """One event's data; True once it is `[DONE]`."""
        if payload == DONE:
            self.done = True
            return True
        try:
            obj = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            self.malformed = self.malformed or f"a stream chunk is not JSON: {payload[:80]!r}"
            return False
        if not isinstance(obj, dict):
            self.malformed = self.malformed or "a stream chunk is not a JSON object"
            return False
        self.chunk(obj)
        return False

    def chunk(self, obj: Mapping[str, Any]) -> None:
        """One parsed chunk: its envelope, error, usage and its first choice's delta."""
        self.chunks += 1
        if not self.generation_id:
            gid = obj.get("id")
            if isinstance(gid, str):
                self.name(gid)
        if not self.provider and isinstance(obj.get("provider"), str):
            self.provider = obj["provider"]
        if not self.model and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        err = obj.get("error")
        if err is not None and self.error is None:
            self.error = err if isinstance(err, dict) else {"message": str(err)}
            self.error_ends_choice = choice is not None
        if choice is None:
            return
        if choice.get("error") is not None and self.error is None:  # an error inside the choice, as a body has it
            err = choice["error"]
            self.error, self.error_ends_choice = (err if isinstance(err, dict) else {"message": str(err)}), True
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if choice.get("native_finish_reason") is not None:
            self.native_finish_reason = choice["native_finish_reason"]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta)

    def _delta(self, delta: Mapping[str, Any]) -> None:
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._content.append(text)
            self.chars += len(text)
        reasoning = delta.get("reasoning")
        if isinstance(reasoning, str):
            self._reasoning_seen = True
            if reasoning:
                self._reasoning.append(reasoning)
        alias = delta.get("reasoning_content")
        if isinstance(alias, str) and alias:
            self._reasoning_content.append(alias)
        details = delta.get("reasoning_details")
        shown = 0  # the reasoning text this delta carries, counted once whichever fields carry it
        if isinstance(details, list):
            for d in details:
                if isinstance(d, dict):
                    shown += self._detail(d)
        self.chars += len(reasoning) if isinstance(reasoning, str) else shown or (len(alias) if alias else 0)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for part in calls:
                if isinstance(part, dict):
                    self._call(part)

    def _detail(self, d: Mapping[str, Any]) -> int:
        """A reasoning_details piece: pieces of one index (else of the same type in a row) are one detail. Returns
        the reasoning characters it adds."""
        key = d.get("index")
        if key is None:
            last = next(reversed(self._details), None)
            same = last is not None and self._details[last].get("type") == d.get("type")
            key = last if same else ("unindexed", len(self._details))
        text = d.get("text") if d.get("type") in (None, "reasoning.text") else None
        have = self._details.get(key)
        if have is None:
            self._details[key] = dict(d)
        else:
            for name, value in d.items():
                if name in _STRING_PARTS and isinstance(value, str):
                    have[name] = (have.get(name) or "") + value
                elif have.get(name) is None:
                    have[name] = value
        return len(text) if isinstance(text, str) else 0

    def _call(self, part: Mapping[str, Any]) -> None:
        """A tool-call piece (OpenAI's shape): the first of an index brings its id, type and name, the others pieces
        of its arguments, joined as they came (never re-serialized: they are the model's text)."""
        index = part.get("index")
        if not isinstance(index, int):
            new = isinstance(part.get("id"), str) and part["id"] not in {c.get("id") for c in self._calls.values()}
            index = len(self._calls) if new or not self._calls else next(reversed(self._calls))
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
        if isinstance(part.get("id"), str) and part["id"] and not call["id"]:
            call["id"] = part["id"]
        if isinstance(part.get("type"), str):
            call["type"] = part["type"]
        fn = part.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str) and fn["name"] and not call["function"]["name"]:
                call["function"]["name"] = fn["name"]
            args = fn.get("arguments")
            if isinstance(args, str):
                call["function"]["arguments"] += args
            elif args is not None:  # an object, whole (some servers): as a JSON body would hold it
                call["function"]["arguments"] = args

    def delivered_since(self, mark: tuple[int, int, int, int]) -> tuple[dict[str, str], tuple[int, int, int, int]]:
        """The text delivered since `mark` (what an earlier call returned; NO_MARK at first) as a delta with
        `reasoning`, `reasoning_content` and `content` pieces, and DETAILS_TEXT for reasoning served only in
        `reasoning_details` (a provider that leaves `reasoning` null; empty pieces left out), and the new mark: what
        the streams journal keeps of a stream as it arrives, so that a kill loses at most what came since the last
        call."""
        parts = (self._reasoning, self._reasoning_content, self._content)
        delta = {name: "".join(got[m:]) for name, got, m in zip(DELIVERED, parts, mark) if len(got) > m}
        details = "" if self._reasoning_seen or self._reasoning_content else self._details_reasoning()
        if len(details) > mark[3]:
            delta[DETAILS_TEXT] = details[mark[3]:]
        return delta, (len(parts[0]), len(parts[1]), len(parts[2]), len(details))

    def _details_reasoning(self) -> str:
        """The reasoning text `reasoning_details` holds (its `reasoning.text` entries), as a body's reader joins it."""
        return "".join(d["text"] for d in self._details.values()
                       if d.get("type") in (None, "reasoning.text") and isinstance(d.get("text"), str))

    def body(self) -> dict[str, Any]:
        """The non-streaming body these chunks add up to (what `answers.classify_body` reads)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content),
                                   "reasoning": "".join(self._reasoning) if self._reasoning_seen else None}
        if self._reasoning_content:
            message["reasoning_content"] = "".join(self._reasoning_content)
        if self._details:
            message["reasoning_details"] = list(self._details.values())
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls, key=_order)]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.finish_reason,
                                  "native_finish_reason": self.native_finish_reason}
        out: dict[str, Any] = {"id": self.generation_id, "provider": self.provider, "model": self.model,
                               "choices": [choice]}
        if self.error is not None:
            if self.error_ends_choice:
                choice["error"] = self.error
            else:
                out = {"error": self.error, "id": self.generation_id, "provider": self.provider}
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def _order(index: Any) -> tuple[int, Any]:
    return (0, index) if isinstance(index, int) else (1, str(index))


def classify_stream(state: StreamState, headers: Mapping[str, str] | None = None) -> Outcome:
    """A finished (or ended) stream → Outcome: an error chunk as the JSON body's error would be; a stream without
    `[DONE]`, with an unreadable chunk or without usage as a cut body (`malformed`: it may have been billed);
    otherwise the assembled body, classified as a JSON one."""
    headers = headers or {}
    if state.error is not None:
        return classify_body(200, headers, state.body())
    if state.malformed:
        return Outcome(Kind.RETRY, "malformed", 200, state.malformed)
    if not state.done:
        return Outcome(Kind.RETRY, "malformed", 200, f"stream ended before [DONE] after {state.chunks} chunks (cut?)")
    if state.usage is None:
        return Outcome(Kind.RETRY, "malformed", 200, "stream ended without its usage chunk")
    return classify_body(200, headers, state.body())


def feed(decoder: SSEDecoder, state: StreamState, raw: bytes) -> bool:
    """One read's bytes into the state; True once the stream has said all it will (`[DONE]`, or an error)."""
    for payload in decoder.feed(raw):
        if state.add(payload) or state.error is not None:
            state.keepalives = decoder.comments
            return True
    state.keepalives = decoder.comments
    return False


async def stream_complete(client: httpx.AsyncClient, body: dict[str, Any], state: StreamState | None = None, *,
                          stall_timeout_s: float | None = None) -> Outcome:
    """POST chat/completions with `stream: true` and read the SSE to its end. An HTTP error before the stream (or a
    server that answered with one JSON body) is classified as `answers.classify_response` classifies it; a
    connection that breaks mid-stream as `classify_exception` does. `state` (optional) is updated as chunks
    arrive: see the module's docstring. `stall_timeout_s`: a stream that sends no byte for this long (OpenRouter's
    keepalive comments count: they come while a request waits) is closed and answered `client_timeout`, however long
    it has run; None: the client's timeouts."""
    state = state if state is not None else StreamState()
    timeout: Any = httpx.USE_CLIENT_DEFAULT
    if stall_timeout_s is not None:
        timeout = httpx.Timeout(stall_timeout_s, connect=client.timeout.connect)
    try:
        async with client.stream("POST", "chat/completions", json={**body, "stream": True}, timeout=timeout) as resp:
            state.name(resp.headers.get("x-generation-id", ""))
            if resp.status_code != 200 or "event-stream" not in resp.headers.get("content-type", ""):
                return classify_response(resp.status_code, resp.headers, await resp.aread())
            decoder = SSEDecoder()
            # no content coding (the usual case for SSE): the raw bytes, without httpx's decoder chain
            chunks = resp.aiter_bytes() if resp.headers.get("content-encoding") else resp.aiter_raw()
            async for raw in chunks:
                if feed(decoder, state, raw):
                    break
            else:
                for payload in decoder.close():
                    state.add(payload)
            headers = resp.headers
    except httpx.ReadTimeout as exc:
        if stall_timeout_s is None:
            return classify_exception(exc)
        return Outcome(Kind.RETRY, "client_timeout", None, f"stalled: no bytes for {stall_timeout_s:g} s")
    except httpx.HTTPError as exc:
        return classify_exception(exc)
    return classify_stream(state, headers)


def cut_completion(state: StreamState) -> tuple[Completion | None, str]:
    """What a stream the run closed itself had delivered, as an answer cut there (`finish_reason` "cut"): its
    reasoning and content so far, a prefix of the model's output. Tool calls that had begun are left out (their
    arguments may be partial; the ids then stop before the section, still a prefix). (None, why) when it is no such
    prefix for sure: nothing served, an error chunk, a shape repaired from content (`bare_close`: without the count a
    stream's last chunk brings, the split cannot be confirmed), no reasoning served in a reasoning field (a provider
    without a reasoning parser serves reasoning as content: its cut could not be told apart), or no whole word yet."""
    if state.error is not None:
        return None, "an error chunk"
    if not state.chunks:
        return None, "nothing streamed yet"
    body = state.body()
    choice = body["choices"][0]
    choice["message"].pop("tool_calls", None)
    choice["finish_reason"], choice["native_finish_reason"] = CUT, None
    body.pop("usage", None)
    parsed = parse_completion(body)
    if not isinstance(parsed, Completion):
        return None, "not an answer"
    if parsed.repaired or (not parsed.answer.reasoning and parsed.answer.content):
        return None, "reasoning served as content"
    if not parsed.answer.reasoning:
        return None, "nothing streamed yet"
    a = parsed.answer
    if a.content:  # the last text ends at a word boundary: its last word may be a token the stream had only begun
        parsed.answer = Answer(a.reasoning, word_boundary(a.content), CUT)
    else:
        parsed.answer = Answer(word_boundary(a.reasoning), "", CUT)
    return (parsed, "") if parsed.answer.reasoning else (None, "no whole word yet")


def word_boundary(text: str) -> str:
    """`text` up to the last place where the tokenizer splits whatever follows: a stream's last piece of text may
    stop inside a token (a provider sends text, not ids), so the ids of a cut sample stop where the next piece surely
    starts a new one. Kimi's pre-tokenizer starts a new piece at a space after a non-space, and at a line end after a
    letter or digit; a line end after punctuation joins it (`。\n` and `.\n` are one token each)."""
    for i in range(len(text) - 1, 0, -1):
        if (text[i] == " " and not text[i - 1].isspace()) or (text[i] == "\n" and text[i - 1].isalnum()):
            return text[:i]
    return ""
