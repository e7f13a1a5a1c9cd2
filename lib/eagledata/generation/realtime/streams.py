"""The streams in flight: how far each has got (pacing's view), whether closing it stops its billing, and closing
them — a provider's when it is judged suspect, a dataset's at its cut, those that stop billing on a Ctrl-C.

A stream whose endpoint has stream cancellation (the routing decision's `stream_cancellation`) stops generating and
billing when closed; any other is billed its whole answer whatever the client does, so it is left to finish.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...openrouter import RoutingDecision
from .attempt import Attempt
from .pacing import Streamed


class Streams:
    """The streamed attempts in flight, in the order they went out; `on_named` / `on_end`: the service named an
    attempt's generation, or it ended (the streams journal hears both, journals.py)."""

    def __init__(self, routing: RoutingDecision):
        self.routing = routing
        self.streaming: dict[Attempt, None] = {}
        self.on_named: Callable[[Attempt], None] | None = None
        self.on_end: Callable[[Attempt], None] | None = None
        self._cancels = {e.provider: e.stream_cancellation for e in routing.eligible}

    def __bool__(self) -> bool:
        return bool(self.streaming)

    def add(self, attempt: Attempt) -> None:
        """A streamed attempt went out (its `state` is its stream's)."""
        assert attempt.state is not None
        self.streaming[attempt] = None
        if self.on_named is not None:
            named = self.on_named
            attempt.state.on_named = lambda _: named(attempt)
        attempt.when_done(lambda: self._ended(attempt))

    def cancels(self, provider: str) -> bool:
        """Closing a stream `provider` serves stops its billing."""
        return self._cancels.get(provider, False)

    def _ended(self, attempt: Attempt) -> None:
        self.streaming.pop(attempt, None)
        if self.on_end is not None:
            self.on_end(attempt)

    def streamed(self) -> tuple[int, int]:
        """The streams in flight, and the reasoning and content characters they have delivered so far."""
        return len(self.streaming), sum(a.state.chars for a in self.streaming if a.state is not None)

    def progress(self, tokens_per_char: float) -> dict[int, Streamed]:
        """How far each stream in flight has got (pacing's view), by its flight's ticket: its characters so far at
        `tokens_per_char`, and whether closing it stops its billing."""
        return {a.work.ticket: Streamed(a.state.chars * tokens_per_char, self.stops_billing(a))
                for a in self.streaming if a.state is not None and a.work is not None and a.work.ticket is not None}

    def all_cancel(self, provider: dict[str, Any] | None) -> bool:
        """Every endpoint a request with this provider object may reach stops billing on a closed stream."""
        allowed = set(self.routing.eligible_providers)
        if provider:
            allowed -= set(provider.get("ignore") or ())
            if provider.get("only"):
                allowed &= set(provider["only"])
        return bool(allowed) and all(self.cancels(p) for p in allowed)

    def cancel_streams_of(self, provider: str) -> int:
        """Cancel every stream in flight that `provider` is serving (known from its first chunk): the run has just
        left it out, so what it would still send would not be kept; on an endpoint with stream cancellation closing
        it stops the billing too. Each is booked and retried as any cancelled attempt. Returns how many."""
        return self._cancel(lambda a: a.state is not None and a.state.provider == provider)

    def stops_billing(self, attempt: Attempt) -> bool:
        """Closing this stream stops its billing: its endpoint has stream cancellation (the routing decision's
        `stream_cancellation`; before its first chunk names the provider: when every endpoint its provider filter
        allows has)."""
        if attempt.state is not None and attempt.state.provider:
            return self.cancels(attempt.state.provider)
        return attempt.cancels

    def cancel_streams_that_stop_billing(self, cut: str | None = None) -> int:
        """Close every stream in flight whose endpoint stops billing when it is closed: what they would still send
        is not paid for (`cut`: what they delivered is kept as a cut sample, with this reason). The others bill
        their whole answer whatever the client does, so they are left to finish and be kept. Returns how many."""
        return self._cancel(self.stops_billing, cut=cut)

    def cut_every_stream(self, reason: str) -> int:
        """Close every stream in flight, each kept as a cut sample (after a Ctrl-C: those on endpoints that bill
        whole answers are billed the rest anyway, and keeping what they delivered beats abandoning it)."""
        return self._cancel(lambda a: True, cut=reason)

    def cut_streams_of(self, lane: Any, reason: str) -> int:
        """A dataset reached its target: close its streams whose endpoint stops billing, each kept as a cut sample
        (`at_target: cut`; the others are paid in full anyway, so they finish and count). Returns how many."""
        return self._cancel(self.stops_billing, cut=reason, lane=lane)

    def _cancel(self, which: Callable[[Attempt], bool], *, cut: str | None = None, lane: Any = None) -> int:
        hit = [a for a in self.streaming if a.state is not None and which(a)
               and (lane is None or (a.work is not None and a.work.lane is lane))]
        for attempt in hit:
            attempt.cut(cut) if cut else attempt.cancel()
        return len(hit)

