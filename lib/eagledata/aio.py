"""Sync wrappers for the library's async entry points, without touching a running loop."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

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
