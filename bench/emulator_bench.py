"""Emulator capacity: requests/s at zero latency, and p99 added latency with 2,000 requests in flight.

The client is a minimal HTTP/1.1 client on asyncio streams (uvloop), not httpx, so that on a small
machine the figures measure the server rather than the client's connection pool; the emulator runs
as a subprocess (`run_emulator`), exactly as tests and the demo run it.

    PYTHONPATH=lib python bench/emulator_bench.py
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from urllib.parse import urlsplit

import uvloop

from eagledata.emulator import run_emulator

MODEL = "moonshotai/kimi-k2.5"
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.2, "content_median": 15, "content_sigma": 0.2}


def solo(latency: float, content: dict | None = None) -> dict:
    """One endpoint with a fixed time to first token and no generation time: each request takes `latency` s."""
    return {"replace_endpoints": True, "balance": 1e6, "content": SMALL if content is None else content,
            "endpoints": [{"provider": "Solo", "slug": "solo", "quantization": "int4", "prompt_price": 0.5,
                           "completion_price": 2.2, "latency": latency, "throughput": 1e12, "capacity": 10**6}]}


class Conn:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read a Content-Length response."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer bench\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return int(status_line.split()[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _body(i: int, max_tokens: int = 200) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"bench prompt {i % 64}"}],
                       "max_tokens": max_tokens}).encode()


async def throughput(url: str, total: int, connections: int, max_tokens: int = 200) -> tuple[float, dict[int, int]]:
    """Requests/s served at speed 0 by `connections` keep-alive clients sending back to back."""
    u = urlsplit(url)
    path = u.path + "/chat/completions"
    codes: dict[int, int] = {}
    counter = iter(range(total))

    async def worker() -> None:
        conn = Conn(u.hostname, u.port)
        try:
            for i in counter:
                code = await conn.post(path, _body(i, max_tokens))
                codes[code] = codes.get(code, 0) + 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return total / (time.perf_counter() - t0), codes


async def in_flight(url: str, n: int, designed: float) -> tuple[list[float], dict[int, int], float]:
    """n requests opened at once, each designed to take `designed` s: per-request (observed − designed)."""
    u = urlsplit(url)
    path = u.path + "/chat/completions"
    added: list[float] = []
    codes: dict[int, int] = {}

    async def one(i: int) -> None:
        conn = Conn(u.hostname, u.port)
        t = time.perf_counter()
        try:
            code = await conn.post(path, _body(i))
        except (OSError, asyncio.IncompleteReadError):
            code = -1
        finally:
            conn.close()
        added.append(time.perf_counter() - t - designed)
        codes[code] = codes.get(code, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return sorted(added), codes, time.perf_counter() - t0


def pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="requests for the zero-latency run")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=1.0, help="designed seconds per request")
    args = ap.parse_args()
    uvloop.install()
    with run_emulator({**solo(0.0), "speed": 0}) as em:
        asyncio.run(throughput(em.base_url, 500, args.connections))  # warm-up
        rps, codes = asyncio.run(throughput(em.base_url, args.requests, args.connections))
    print(f"zero latency, short answers (~55 tokens): {rps:,.0f} requests/s over {args.requests} requests, "
          f"{args.connections} connections, status {codes}")
    with run_emulator({**solo(0.0, content={}), "speed": 0}) as em:
        rps, codes = asyncio.run(throughput(em.base_url, args.requests // 5, args.connections, 32_000))
        tokens = statistics.fmean(len(g["output_ids"]) for g in em.ground_truth())
    print(f"zero latency, default lengths (mean {tokens:,.0f} output tokens): {rps:,.0f} requests/s over "
          f"{args.requests // 5} requests, status {codes}")
    with run_emulator({**solo(args.latency), "speed": 1.0}) as em:
        added, codes, wall = asyncio.run(in_flight(em.base_url, args.in_flight, args.latency))
        peak = em.stats()["in_flight_peak"]
    print(f"{args.in_flight} in flight at {args.latency:.1f} s each: added latency p50 {pct(added, .5) * 1000:.0f} ms, "
          f"p99 {pct(added, .99) * 1000:.0f} ms, max {added[-1] * 1000:.0f} ms; wall {wall:.2f} s; "
          f"server in-flight peak {peak}; status {codes}")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"mean added {statistics.fmean(added) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
