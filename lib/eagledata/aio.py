"""Sync wrappers for the library's async entry points, without touching a running loop."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
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


async def in_executor(executor: concurrent.futures.Executor, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on `executor`, awaited (tokenizing off the loop)."""
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args, **kwargs))


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


# -- a kernel shutting down ---------------------------------------------------------------------------------------
# papermill's Ctrl-C (and JupyterLab's "shut down kernel") ends a kernel through jupyter_client: SIGINT, then a
# shutdown request, SIGTERM 2.5 s later and SIGKILL at 5 s. ipykernel stops its loop as soon as it has answered the
# request, so a run awaited in a cell would die mid-drain, its summaries unwritten. The eagledata kernel
# (kernel/eagledata_kernel.py) awaits what is registered here first.
_ON_SHUTDOWN: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], Coroutine[Any, Any, None]]]] = {}


def on_kernel_shutdown(stop: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Register `stop`, a coroutine function run on the calling loop when the kernel shuts down (it should end the
    run as a second Ctrl-C does and return once the summaries are written); returns the undo."""
    key = id(stop)
    _ON_SHUTDOWN[key] = (asyncio.get_running_loop(), stop)
    return lambda: _ON_SHUTDOWN.pop(key, None) and None


def stop_for_shutdown(timeout_s: float) -> int:
    """Run every registered stop on its own loop and wait up to `timeout_s` for them (from a thread that is not
    those loops': the kernel's shutdown handler); returns how many finished in time."""
    futures = [asyncio.run_coroutine_threadsafe(stop(), loop) for loop, stop in list(_ON_SHUTDOWN.values())
               if loop.is_running()]
    done, _ = concurrent.futures.wait(futures, timeout=timeout_s)
    return len(done)
