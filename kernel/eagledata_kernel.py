"""The `eagledata` kernel: IPython's own, except that an interrupt stops running code and nothing else.

jupyter_client interrupts a kernel (SIGINT to its process group) just before it asks it to shut down, and papermill
asks for `kernel_info` just before that. ipykernel arms SIGINT around every shell request it handles, so now and then
the interrupt lands in the `kernel_info` handler after its reply went out, and the log of a run that succeeded ends
with `[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.` (1 run in 10-25 on a 2-core machine). Here SIGINT is
armed only for requests that run user code: cells, and comm messages (widget callbacks). Interrupting a cell, from
Lab or from papermill's timeout, works as before. And a shutdown request (papermill's Ctrl-C, Lab's "shut down
kernel") first stops the eagledata runs going in a cell, their summaries written, within `SHUTDOWN_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path
from signal import SIGINT, getsignal

from ipykernel.ipkernel import IPythonKernel

RUNS_USER_CODE = frozenset({"execute_request", "comm_open", "comm_msg", "comm_close"})
# jupyter_client follows its shutdown request with SIGTERM after 2.5 s and SIGKILL after 5 s: a run's clean stop
# (its requests in flight abandoned, its summaries written) gets this long before the kernel goes on stopping.
SHUTDOWN_GRACE_S = 4.0


class EagledataKernel(IPythonKernel):
    """IPythonKernel whose shell requests that run no user code leave SIGINT as the kernel set it (ignored)."""

    def pre_handler_hook(self) -> None:
        msg_type = self.get_parent("shell").get("header", {}).get("msg_type")
        if msg_type in RUNS_USER_CODE:
            super().pre_handler_hook()
        else:
            self.saved_sigint_handler = getsignal(SIGINT)  # post_handler_hook puts back what is already there


    async def do_shutdown(self, restart: bool) -> dict:
        """Before ipykernel stops its loop: the eagledata runs still going in a cell stop cleanly (`eagledata.aio.
        on_kernel_shutdown`), as a second Ctrl-C stops them, so papermill's Ctrl-C leaves their summaries written."""
        aio = sys.modules.get("eagledata.aio")
        if aio is not None:
            await asyncio.get_running_loop().run_in_executor(None, aio.stop_for_shutdown, SHUTDOWN_GRACE_S)
        content = super().do_shutdown(restart)  # IPythonKernel's is a plain function; Kernel's a coroutine
        return await content if inspect.isawaitable(content) else content


def main() -> None:
    """What `python -m ipykernel_launcher` does, with this kernel class."""
    if sys.path[0] == "" or Path(sys.path[0]) == Path.cwd():
        del sys.path[0]  # the notebook's folder is put back by IPython's own path setup, as with ipykernel_launcher
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=EagledataKernel)


if __name__ == "__main__":
    main()
