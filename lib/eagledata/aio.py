"""Sync wrappers for the library's async entry points, without touching a running loop."""
from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T], async_name: str) -> T:
    """`asyncio.run` when no loop runs; inside Jupyter (a loop runs) ask for top-level `await` instead.

    We never nest loops (`nest_asyncio`): it breaks httpx pools and hides ordering bugs.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop: run it here (outside the except, so its errors do not carry this one as their context)
    else:
        coro.close()
        raise RuntimeError(f"an event loop is running (Jupyter?): use `await {async_name}(...)` instead")
    return asyncio.run(coro)


def on_signals(callback: Callable[[], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM → callback on the loop (main thread only); returns the undo."""
    loop = asyncio.get_running_loop()
    installed, previous = [], {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, callback)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)
            if previous.get(sig) is not None:
                signal.signal(sig, previous[sig])

    return restore
