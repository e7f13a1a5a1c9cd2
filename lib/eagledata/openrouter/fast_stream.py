"""Streamed chat completions read straight off the socket (issue 42): httptools (llhttp) on an `asyncio.Protocol`.

The same request and the same `Outcome` as `stream.stream_complete`, without httpx/httpcore/anyio in the read path:
each read's body bytes (chunked transfer-encoding decoded by llhttp) go from the protocol's `data_received` straight
into the SSE decoder and the `StreamState`; the awaiting task wakes once, when the stream has said all it will
(`[DONE]`, an error chunk), when the response ends, or when it breaks. What differs from the httpx path is only how
the bytes are read:

- a keep-alive pool per (scheme, host, port), idle connections reused last-in first-out; a connection goes back to
  it only once its response was read to its end (after `[DONE]` the answer is returned at once and the response's
  last bytes are read after), and is closed on a cancel, an error, a timeout or a `Connection: close`;
- no limit on connections (the caller's concurrency is the limit), HTTP/1.1 only, no proxy: a client whose URL goes
  through a mounted transport (a proxy from the environment, a mock) or that has auth or event hooks is read over
  httpx (`stream_complete`), as it would be without this module;
- `Accept-Encoding: identity` (SSE is sent uncompressed); a server that compresses anyway is decoded by httpx's own
  decoders;
- timeouts: `stall_timeout_s` (else the client's read timeout) from the request's last write or last byte, one timer
  per request re-armed only when it fires; the client's connect timeout for connecting.

Errors are the Outcomes `classify_exception` gives for what httpx would raise: a refused connection
`ConnectError: All connection attempts failed`, a reset `ReadError: `, an end of the connection before the response
`RemoteProtocolError: Server disconnected without sending a response.` and in its body `RemoteProtocolError: peer
closed connection without sending complete message body (...)`.
"""
from __future__ import annotations

import asyncio
import json
import select
import socket
import ssl
from typing import Any

import httptools
import httpx
from httpx import _decoders

from .answers import Kind, Outcome, classify_response
from .client import _ssl_context
from .stream import SSEDecoder, StreamState, classify_stream, feed, stream_complete

Key = tuple[str, str, int]
_OWN = {b"host", b"accept", b"accept-encoding", b"content-type", b"content-length", b"connection",
        b"transfer-encoding"}
_GRACE_S = 0.05  # after the stream said all, how long its answer waits for the response's end
_DRAIN_LIMIT = 1 << 16  # bytes read after the stream said all, before giving up on the connection's reuse
_HEADERS, _SSE, _BODY, _DRAIN = range(4)  # what the response's bytes are for


def _outcome(name: str, message: str) -> Outcome:
    """The Outcome `classify_exception` gives for the httpx exception `name` with `message`."""
    if name.endswith("Timeout"):
        return Outcome(Kind.RETRY, "client_timeout", None, name)
    if name in ("ConnectError", "ReadError", "WriteError", "RemoteProtocolError"):
        return Outcome(Kind.RETRY, "connection", None, f"{name}: {message}"[:200])
    return Outcome(Kind.RETRY, "malformed", None, f"{name}: {message}"[:200])


def _decoder(encoding: str) -> Any:
    """httpx's decoder for a response's content codings (gzip, deflate, br, zstd as installed; others ignored, as
    httpx ignores them); None when there is nothing to decode."""
    found = [_decoders.SUPPORTED_DECODERS[v]() for v in (c.strip().lower() for c in encoding.split(","))
             if v in _decoders.SUPPORTED_DECODERS and v != "identity"]
    return None if not found else found[0] if len(found) == 1 else _decoders.MultiDecoder(found)


class _Exchange:
    """One request on a connection: where its response goes and the future its caller awaits."""

    __slots__ = ("body", "decoder", "fut", "headers", "said_all", "state", "status")

    def __init__(self, fut: asyncio.Future, decoder: SSEDecoder, state: StreamState):
        self.fut, self.decoder, self.state = fut, decoder, state
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.said_all = False


class _Conn(asyncio.Protocol):
    """One keep-alive connection and its response parser; the parser's callbacks feed the current exchange."""

    def __init__(self, pool: FastStreams, key: Key, loop: asyncio.AbstractEventLoop):
        self.pool, self.key, self.loop = pool, key, loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.ex: _Exchange | None = None
        self.mode = _HEADERS
        self.timeout: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.grace: asyncio.TimerHandle | None = None  # after the stream said all: when the answer is given anyway
        self.last = 0.0
        self.stalled = ""  # the timeout's message (the stall's, or httpx's ReadTimeout)
        self.framed = False  # chunked or content-length (else the body ends with the connection)
        self.length: int | None = None
        self.received = 0
        self.keep_alive = True
        self.inflate: Any = None
        self.drained = 0

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pool._live.add(self)

    def data_received(self, data: bytes) -> None:
        if self.ex is None or self.closed:  # bytes nobody asked for: the connection cannot be trusted
            self.abort()
            return
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # a bug in a callback: raised to the caller as it is
            self._fail(e.__context__ or e)
        except httptools.HttpParserError as e:
            self._fail(_outcome("RemoteProtocolError", str(e)))

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost says what the end meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._live.discard(self)
        self.pool._idle.get(self.key, {}).pop(self, None)
        self._stop_timers()
        if self.ex is None:
            return
        if self.mode == _HEADERS:
            # anyio reports a reset as BrokenResourceError (no message); an EOF before any response is httpcore's own
            self._fail(_outcome("ReadError", "") if exc is not None else
                       _outcome("RemoteProtocolError", "Server disconnected without sending a response."))
        elif exc is not None or self.mode == _DRAIN:
            self._fail(_outcome("ReadError", ""))  # (a stream that said all keeps its answer)
        elif not self.framed:  # a body without a length ends with the connection
            self.on_message_complete()
        elif self.length is not None:
            self._fail(_outcome("RemoteProtocolError", "peer closed connection without sending complete message "
                                f"body (received {self.received} bytes, expected {self.length})"))
        else:
            self._fail(_outcome("RemoteProtocolError", "peer closed connection without sending complete message "
                                "body (incomplete chunked read)"))

    # -- one exchange -------------------------------------------------------------------------------------------
    def send(self, ex: _Exchange, data: bytes, timeout: float | None, stalled: str) -> None:
        assert self.transport is not None
        self.ex, self.mode = ex, _HEADERS
        self.framed, self.length, self.received, self.keep_alive = False, None, 0, True
        self.inflate, self.drained = None, 0
        self.timeout, self.stalled = timeout, stalled
        self.transport.write(data)
        self.last = self.loop.time()
        if timeout is not None:
            self.timer = self.loop.call_at(self.last + timeout, self._on_timer)

    def _on_timer(self) -> None:
        """No byte for `timeout` s: the exchange ends (a stream that said all keeps its answer) and the connection is
        closed; else the timer waits for what is left of the timeout since the last byte."""
        self.timer = None
        if self.ex is None or self.timeout is None:
            return
        due = self.last + self.timeout
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._on_timer)
            return
        self._fail(Outcome(Kind.RETRY, "client_timeout", None, self.stalled))

    def _fail(self, why: Outcome | BaseException) -> None:
        """The exchange ends and the connection is closed: with its answer when the stream said all, else with `why`
        (an Outcome, or an exception to raise)."""
        ex, self.ex = self.ex, None
        self.abort()
        if ex is None or ex.fut.done():
            return
        if ex.said_all:
            ex.fut.set_result(ex)
        elif isinstance(why, BaseException):
            ex.fut.set_exception(why)
        else:
            ex.fut.set_result(why)

    def _give(self, ex: _Exchange) -> None:
        """The stream said all and its response has not ended yet: the answer is given now (its last bytes are
        still read, for the connection's reuse)."""
        self.grace = None
        if not ex.fut.done():
            ex.fut.set_result(ex)

    def _stop_timers(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.grace is not None:
            self.grace.cancel()
            self.grace = None

    def abort(self) -> None:
        """Close the connection now (its exchange, if any, ends in connection_lost)."""
        self.closed = True
        self._stop_timers()
        if self.transport is not None:
            self.transport.abort()

    # -- httptools callbacks ------------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.ex
        if ex is None:  # a response nobody asked for (or after a failure): never reused
            self.abort()
            return
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        ex.headers[key] = f"{ex.headers[key]}, {text}" if key in ex.headers else text

    def on_headers_complete(self) -> None:
        ex = self.ex
        if ex is None:
            self.abort()
            return
        ex.status = status = self.parser.get_status_code()
        headers = ex.headers
        self.keep_alive = self.parser.should_keep_alive()
        length = headers.get("content-length")
        self.length = int(length) if length is not None and length.strip().isdigit() else None
        self.framed = self.length is not None or "chunked" in headers.get("transfer-encoding", "").lower()
        if status < 200:  # an interim answer (100 Continue): the real one follows
            ex.headers = {}
            return
        ex.state.name(headers.get("x-generation-id", ""))
        self.inflate = _decoder(headers.get("content-encoding", ""))
        self.mode = _SSE if status == 200 and "event-stream" in headers.get("content-type", "") else _BODY

    def on_body(self, body: bytes) -> None:
        self.received += len(body)
        mode = self.mode
        ex = self.ex
        if ex is None:
            self.abort()
            return
        if self.inflate is not None and mode != _DRAIN:
            try:
                body = self.inflate.decode(body)
            except httpx.DecodingError as e:
                self._fail(_outcome("DecodingError", str(e)))
                return
        if mode == _SSE:
            if feed(ex.decoder, ex.state, body):  # the answer is whole: given at the response's end, or soon
                ex.said_all = True
                self.mode = _DRAIN
                self.grace = self.loop.call_later(_GRACE_S, self._give, ex)
        elif mode == _BODY:
            ex.body.append(body)
        else:
            self.drained += len(body)
            if self.drained > _DRAIN_LIMIT:  # the stream goes on after [DONE]: not worth waiting for its end
                self._fail(_outcome("ReadError", ""))

    def on_message_complete(self) -> None:
        ex = self.ex
        if ex is None or self.mode == _HEADERS:  # an interim answer's end
            return
        if self.inflate is not None and self.mode != _DRAIN:
            try:
                rest = self.inflate.flush()
            except httpx.DecodingError as e:
                self._fail(_outcome("DecodingError", str(e)))
                return
            if rest and self.mode == _SSE:
                ex.said_all = feed(ex.decoder, ex.state, rest)
            elif rest:
                ex.body.append(rest)
        self.ex = None
        self._stop_timers()
        if not ex.fut.done():
            ex.fut.set_result(ex)
        if self.keep_alive and not self.closed:
            self.pool._release(self)
        else:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class FastStreams:
    """Streamed chat completions over pooled keep-alive connections: `await complete(client, body, state)` as
    `stream.stream_complete`; `aclose()` (or `async with`) closes every connection."""

    def __init__(self) -> None:
        self._idle: dict[Key, dict[_Conn, None]] = {}  # insertion-ordered: popitem() takes the newest
        self._live: set[_Conn] = set()
        self.opened = 0  # connections made, over the pool's life

    async def __aenter__(self) -> FastStreams:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in list(self._live):
            conn._fail(_outcome("ReadError", ""))  # a request still reading ends as a closed connection's
        self._idle.clear()
        await asyncio.sleep(0)  # connection_lost runs

    def idle(self) -> int:
        """Connections waiting in the pool."""
        return sum(len(v) for v in self._idle.values())

    def _release(self, conn: _Conn) -> None:
        self._idle.setdefault(conn.key, {})[conn] = None

    def _reuse(self, key: Key) -> _Conn | None:
        """The newest idle connection to `key` still open: not closed, and nothing to read on its socket (the end
        of a connection the server closed that the loop has not read yet, as httpcore checks before a reuse)."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.popitem()[0]
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                continue
            sock = transport.get_extra_info("socket")
            poll = select.poll()
            poll.register(sock.fileno(), select.POLLIN)
            if not poll.poll(0):
                return conn
            conn.abort()
        return None

    async def _connect(self, key: Key, client: httpx.AsyncClient) -> _Conn | Outcome:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            pool = getattr(client._transport, "_pool", None)
            context = getattr(pool, "_ssl_context", None) or _ssl_context()
        try:
            async with asyncio.timeout(client.timeout.connect):
                _, conn = await loop.create_connection(lambda: _Conn(self, key, loop), host, port, ssl=context,
                                                       server_hostname=host if context is not None else None)
        except TimeoutError:
            return _outcome("ConnectTimeout", "")
        except (ssl.SSLError, ssl.CertificateError, socket.gaierror) as e:
            return _outcome("ConnectError", str(e))
        except OSError:
            return _outcome("ConnectError", "All connection attempts failed")
        self.opened += 1
        return conn

    async def complete(self, client: httpx.AsyncClient, body: dict[str, Any], state: StreamState | None = None, *,
                       stall_timeout_s: float | None = None) -> Outcome:
        """POST chat/completions with `stream: true` and read the SSE to its end: `stream.stream_complete`'s
        contract (the same Outcome, `state` kept up to date chunk by chunk, a cancelled call closes the
        connection), read as the module's docstring says."""
        state = state if state is not None else StreamState()
        url = client.base_url
        transport = client._transport_for_url(url)
        if (transport is not client._transport or type(transport) is not httpx.AsyncHTTPTransport
                or client.auth is not None or any(client.event_hooks.values()) or url.scheme not in ("http", "https")):
            return await stream_complete(client, body, state, stall_timeout_s=stall_timeout_s)
        content = json.dumps({**body, "stream": True}, ensure_ascii=False, separators=(",", ":"),
                             allow_nan=False).encode("utf-8")  # as httpx encodes `json=`
        lines = [b"POST %s HTTP/1.1" % (url.raw_path + b"chat/completions"), b"Host: " + url.netloc]
        lines += [b"%s: %s" % (k, v) for k, v in client.headers.raw if k.lower() not in _OWN]
        lines += [b"Accept: text/event-stream", b"Accept-Encoding: identity", b"Connection: keep-alive",
                  b"Content-Type: application/json", b"Content-Length: %d" % len(content), b"", b""]
        request = b"\r\n".join(lines) + content
        if stall_timeout_s is not None:
            timeout: float | None = stall_timeout_s
            stalled = f"stalled: no bytes for {stall_timeout_s:g} s"
        else:
            timeout, stalled = client.timeout.read, "ReadTimeout"
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        conn = self._reuse(key) or await self._connect(key, client)
        if isinstance(conn, Outcome):
            return conn
        ex = _Exchange(asyncio.get_running_loop().create_future(), SSEDecoder(), state)
        conn.send(ex, request, timeout, stalled)
        try:
            result = await ex.fut
        except asyncio.CancelledError:
            if conn.ex is ex:  # still reading it: closing the connection is what stops the generation
                conn.ex = None
                conn.abort()
            raise
        if isinstance(result, Outcome):
            return result
        if result.status != 200 or "event-stream" not in result.headers.get("content-type", ""):
            return classify_response(result.status, result.headers, b"".join(result.body))
        if not result.said_all:
            for payload in result.decoder.close():
                state.add(payload)
        return classify_stream(state, result.headers)
