"""The `eagledata` kernel: IPython's own, except that an interrupt stops running code and nothing else.

jupyter_client interrupts a kernel (SIGINT to its process group) just before it asks it to shut down, and papermill
asks for `kernel_info` just before that. ipykernel arms SIGINT around every shell request it handles, so now and then
the interrupt lands in the `kernel_info` handler after its reply went out, and the log of a run that succeeded ends
with `[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.` (1 run in 10-25 on a 2-core machine). Here SIGINT is
armed only for requests that run user code: cells, and comm messages (widget callbacks). Interrupting a cell, from
Lab or from papermill's timeout, works as before. And a shutdown request (papermill's Ctrl-C, Lab's "shut down
kernel") first stops the eagledata runs going in a cell, their summaries written, within `SHUTDOWN_GRACE_S`; so does
the death of the process that started the kernel (papermill killed by SIGTERM, as Slurm, Kubernetes and `timeout` stop
a job), where ipykernel's own poller would end the kernel at once.

An async cell (top-level `await`) is interrupted at once. ipykernel 7.4 cancels it from its SIGINT handler through
`io_loop.add_callback`, which on the loop's own thread is a plain `call_soon`: nothing wakes the loop, whose
`select()` Python resumes after running the handler, so `await asyncio.sleep(60)` gets its cancel when its timer
fires, a minute later. Here the handler wakes the loop (`call_soon_threadsafe`). A generation run in a cell hooks
SIGINT itself (`eagledata.aio.on_signals`) while it runs, and puts this handler back when it is done.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from signal import SIGINT, getsignal, signal

from ipykernel.ipkernel import IPythonKernel
from ipykernel.parentpoller import ParentPollerUnix

RUNS_USER_CODE = frozenset({"execute_request", "comm_open", "comm_msg", "comm_close"})
# jupyter_client follows its shutdown request with SIGTERM after 2.5 s and SIGKILL after 5 s: a run's clean stop
# (its requests in flight abandoned, its summaries written) gets this long before the kernel goes on stopping.
SHUTDOWN_GRACE_S = 4.0
# Once those runs have stopped, the cell that awaited them gets this long (within the grace) to send its reply before
# ipykernel closes its sockets: a reply sent after that is logged as a ZMQError traceback.
REPLY_GRACE_S = 1.0
PARENT_POLL_S = 0.5  # how often the kernel looks whether the process that started it is still there


class EagledataKernel(IPythonKernel):
    """IPythonKernel whose shell requests that run no user code leave SIGINT as the kernel set it (ignored)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._executing = 0  # execute requests not yet replied to (the main shell's, and any subshell's)
        self._replied = threading.Condition()

    async def execute_request(self, stream: object, ident: object, parent: dict) -> None:
        with self._replied:
            self._executing += 1
        try:
            await super().execute_request(stream, ident, parent)  # runs the cell and sends its reply
        finally:
            with self._replied:
                self._executing -= 1
                self._replied.notify_all()

    def _wait_for_replies(self, timeout_s: float) -> bool:
        with self._replied:
            return self._replied.wait_for(lambda: self._executing == 0, timeout=timeout_s)

    def pre_handler_hook(self) -> None:
        msg_type = self.get_parent("shell").get("header", {}).get("msg_type")
        if msg_type in RUNS_USER_CODE:
            super().pre_handler_hook()
        else:
            self.saved_sigint_handler = getsignal(SIGINT)  # post_handler_hook puts back what is already there

    @contextmanager
    def _cancel_on_sigint(self, future: asyncio.Future) -> Iterator[None]:
        """While an async cell runs: SIGINT cancels it (ipykernel's CancelledError), the loop woken to do it now.

        Replaces ipykernel's own (`IPythonKernel._cancel_on_sigint`, called by `do_execute` for cells with top-level
        `await`), whose cancel waits for the loop's next event. Runs on the loop's thread, as ipykernel's does."""
        loop = asyncio.get_running_loop()

        def cancel() -> None:
            if not future.done():
                future.cancel()

        def handle_sigint(signum: int, frame: object) -> None:
            loop.call_soon_threadsafe(cancel)  # writes to the loop's self-pipe: its select() returns

        saved = signal(SIGINT, handle_sigint)
        try:
            yield
        finally:
            signal(SIGINT, saved)

    async def do_shutdown(self, restart: bool) -> dict:
        """Before ipykernel stops its loop: the eagledata runs still going in a cell stop cleanly (`eagledata.aio.
        on_kernel_shutdown`), as a second Ctrl-C stops them, so papermill's Ctrl-C leaves their summaries written."""
        if "eagledata.aio" in sys.modules:
            loop, started = asyncio.get_running_loop(), time.monotonic()
            if await loop.run_in_executor(None, stop_runs):
                # the cell that awaited them ends now, on the main thread; ipykernel stops once this returns
                left = SHUTDOWN_GRACE_S - (time.monotonic() - started)
                await loop.run_in_executor(None, self._wait_for_replies, max(0.0, min(left, REPLY_GRACE_S)))
        content = super().do_shutdown(restart)  # IPythonKernel's is a plain function; Kernel's a coroutine
        return await content if inspect.isawaitable(content) else content


def stop_runs(grace_s: float = SHUTDOWN_GRACE_S) -> int:
    """The eagledata runs going in a cell stop as papermill's Ctrl-C stops them (their summaries written), from a
    thread that is not their loop's; how many stopped within `grace_s`."""
    aio = sys.modules.get("eagledata.aio")
    return aio.stop_for_shutdown(grace_s) if aio is not None else 0


class ParentGone(ParentPollerUnix):
    """ipykernel's poller exits the kernel at once (`os._exit`) when the process that started it is gone: papermill
    killed by SIGTERM (what Slurm, Kubernetes and `timeout` send) took every summary of the run in a cell with it.
    This one first stops those runs as papermill's Ctrl-C does, their summaries written, then exits."""

    def run(self) -> None:
        parent = self.parent_pid if os.getppid() == self.parent_pid else 0
        while True:
            ppid = os.getppid()
            if (not parent and ppid == 1) or (parent and ppid != parent):
                logging.getLogger("eagledata").warning("the kernel's parent (papermill?) is gone: stopping the runs "
                                                       "in progress, their summaries written, then exiting")
                stop_runs()
                os._exit(1)
            time.sleep(PARENT_POLL_S)


def main() -> None:
    """What `python -m ipykernel_launcher` does, with this kernel class (and a poller that lets runs stop cleanly
    when the parent process dies)."""
    if sys.path[0] == "" or Path(sys.path[0]) == Path.cwd():
        del sys.path[0]  # the notebook's folder is put back by IPython's own path setup, as with ipykernel_launcher
    from ipykernel.kernelapp import IPKernelApp

    class EagledataKernelApp(IPKernelApp):
        def init_poller(self) -> None:
            super().init_poller()
            if isinstance(self.poller, ParentPollerUnix):
                self.poller = ParentGone(parent_pid=self.poller.parent_pid)

    EagledataKernelApp.launch_instance(kernel_class=EagledataKernel)


if __name__ == "__main__":
    main()
