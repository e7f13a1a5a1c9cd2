"""Streamed against JSON answers through the library (`openrouter.complete`), issue 42: N requests in flight against
the emulator at the seed bench's time scale for SECS seconds after a warm-up, the modes in turn (json, stream, fast,
json, stream, fast): answers/s, the client's CPU (per answer, per SSE chunk) and the emulator's. `stream` reads the SSE
over httpx (openrouter/stream.py), `fast` over FastStreams' connections (openrouter/fast_stream.py).

  PYTHONPATH=lib .venv/bin/python bench/stream_bench.py [N=500] [SECS=40]
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput_bench import process_cpu_s, scaled_emulator  # noqa: E402

from eagledata.emulator import run_emulator  # noqa: E402
from eagledata.openrouter import ClientPool, Kind, build_request, complete  # noqa: E402
from eagledata.openrouter.client import LOCAL_KEY  # noqa: E402
from eagledata.openrouter.fast_stream import FastStreams  # noqa: E402
from eagledata.openrouter.stream import StreamState  # noqa: E402

WARM_S = 10.0


async def run(base_url: str, emulator_pid: int, n: int, secs: float, mode: str) -> None:
    ok = chunks = 0
    stream = mode != "json"
    fast = FastStreams() if mode == "fast" else None

    async def worker(client, i: int) -> None:
        nonlocal ok, chunks
        while True:
            i += n
            msgs = [{"role": "user", "content": f"Question {i}: prove that {i} + {i} is even, then explain."}]
            body = build_request("moonshotai/kimi-k2.5", msgs, max_tokens=8192, temperature=1.0, provider=None,
                                 stream=stream)
            state = StreamState()
            out = await (fast.complete(client, body, state) if fast is not None else complete(client, body, state))
            ok += out.kind is Kind.OK
            chunks += state.chunks

    pool = ClientPool(base_url, LOCAL_KEY, concurrency=n, timeout=900)
    workers = [asyncio.ensure_future(worker(pool[i], i)) for i in range(n)]
    await asyncio.sleep(WARM_S)
    a0, c0, t0, e0 = ok, chunks, time.process_time(), process_cpu_s(emulator_pid)
    await asyncio.sleep(secs)
    a1, c1, t1, e1 = ok, chunks, time.process_time(), process_cpu_s(emulator_pid)
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    await pool.__aexit__()
    if fast is not None:
        await fast.aclose()
    cpu, emu, answers, got = t1 - t0, e1 - e0, a1 - a0, c1 - c0
    print(f"{mode:6}: {answers / secs:.1f} answers/s ({answers} in {secs:g} s, {n} in "
          f"flight); client CPU {cpu / secs:.2f} cores, {1e3 * cpu / max(answers, 1):.2f} ms/answer"
          + (f", {got / max(answers, 1):.0f} chunks/answer, {1e6 * cpu / max(got, 1):.0f} us/chunk" if stream else "")
          + (f", {fast.opened} connections opened" if fast is not None else "")
          + f"; emulator {emu / secs:.2f} cores; load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
    with run_emulator(scaled_emulator(4, 1.5, balance=1e6, seed=1)) as emu:
        for mode in ("json", "stream", "fast", "json", "stream", "fast"):
            asyncio.run(run(emu.base_url, emu.process.pid, n, secs, mode))


if __name__ == "__main__":
    main()
