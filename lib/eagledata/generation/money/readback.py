"""What a closed stream cost, read back by its generation id.

A stream that ends without its usage chunk (the run cut or cancelled it, it stalled, its connection broke) may have
been billed anything up to its whole answer: it is booked at its bound (account.py). The service names every
generation from the stream's first bytes (the `X-Generation-Id` header), and `GET /generation?id=` tells what it
cost once the service has settled it: on a provider with stream cancellation the tokens generated until the stream
closed, elsewhere the whole answer, when it ends upstream. `Readback` reads each such id a moment after its stream
ended and books what it cost in place of the bound (`Books.resolve`): the money held at bounds frees up in seconds
instead of waiting for the account to settle it (a reading and its lag), and the books by dataset hold the truth.

An id the service does not know yet is asked again, at doubling intervals, for `GIVE_UP_S` (a stream closed on an
endpoint that bills whole answers ends upstream only when its answer would have); then it is left to the account's
readings, as an unreadable answer always was. The reading never stops the run: an error leaves the id to ask again.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from ...openrouter.client import APIError, GenerationStats, read_generation
from .account import Booking, Books

GenerationReader = Callable[[httpx.AsyncClient, str], Awaitable[GenerationStats | None]]  # the seam

FIRST_ASK_S = 1.0   # the generation endpoint lags a stream's end (OpenRouter: about a second; the emulator 0.5 s)
MAX_GAP_S = 15.0    # asks of one id are at most this far apart
GIVE_UP_S = 300.0   # after this long unknown, the id is the account readings' to settle
CONCURRENCY = 16    # generation-endpoint reads at once (a target cut closes hundreds of streams, a kill 2,000)


@dataclass(slots=True)
class Closed:
    """A stream booked at its bound, its cost still to read."""

    generation_id: str
    booking: Booking
    closed_at: float
    due: float
    tries: int = 0


@dataclass
class ReadbackFigures:
    """The summary's `run.read_back`: the streams booked at a bound whose cost was asked by id, how many the service
    told, how many of those it had cancelled, what they cost, and what they had been booked at; the rest (`unread`)
    are still held at their bound (the account's readings settle them)."""

    streams: int = 0
    read: int = 0
    cancelled: int = 0
    usd: float = 0.0
    bound_usd: float = 0.0

    def figures(self) -> dict:
        return {"streams": self.streams, "read": self.read, "cancelled": self.cancelled, "usd": round(self.usd, 8),
                "bound_usd": round(self.bound_usd, 8), "unread": self.streams - self.read}


async def read_generations(reader: GenerationReader, client: httpx.AsyncClient,
                           ids: list[str]) -> list[GenerationStats | None]:
    """Each id's stats, CONCURRENCY at a time; None where the service does not know it (yet) or the read failed
    (an error never stops the run: the caller asks again, or leaves it)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(gid: str) -> GenerationStats | None:
        async with gate:
            try:
                return await reader(client, gid)
            except (httpx.HTTPError, APIError, ValueError):
                return None

    return await asyncio.gather(*(one(gid) for gid in ids))


class Readback:
    def __init__(self, books: Books, reader: GenerationReader = read_generation):
        self.books, self.reader = books, reader
        self.pending: dict[str, Closed] = {}
        self.counts = ReadbackFigures()

    def add(self, generation_id: str, booking: Booking, now: float) -> None:
        """A stream booked at its bound (`booking`): read what it cost from `now + FIRST_ASK_S` on."""
        if not booking.provisional or generation_id in self.pending:
            return
        self.pending[generation_id] = Closed(generation_id, booking, now, now + FIRST_ASK_S)
        self.counts.streams += 1
        self.counts.bound_usd += booking.amount

    def holding(self) -> bool:
        """Some id still to read holds its bound in the books (no account reading has settled it yet)."""
        return any(c.booking.recent and c.booking.provisional for c in self.pending.values())

    def due(self, now: float) -> list[Closed]:
        return [c for c in self.pending.values() if c.due <= now]

    async def read(self, client: httpx.AsyncClient, now: float, *, every: bool = False) -> int:
        """Ask the service for every id that is due (`every`: all pending ones, the run is ending) and book what
        each cost; the others are asked again later, or dropped past GIVE_UP_S. Returns how many were read."""
        todo = list(self.pending.values()) if every else self.due(now)
        if not todo:
            return 0
        found = await read_generations(self.reader, client, [c.generation_id for c in todo])
        read = 0
        for c, stats in zip(todo, found):
            if self.pending.get(c.generation_id) is not c:
                continue
            if stats is not None:
                self._booked(c, stats)
                read += 1
                continue
            c.tries += 1
            if now - c.closed_at >= GIVE_UP_S:
                del self.pending[c.generation_id]
            else:
                c.due = now + min(FIRST_ASK_S * 2 ** c.tries, MAX_GAP_S)
        return read

    def _booked(self, c: Closed, stats: GenerationStats) -> None:
        del self.pending[c.generation_id]
        self.counts.read += 1
        self.counts.cancelled += stats.cancelled
        self.counts.usd += stats.total_cost
        self.books.resolve(c.booking, stats.total_cost)

    def figures(self) -> dict:
        return self.counts.figures()
