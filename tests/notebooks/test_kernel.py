"""The `eagledata` kernel (kernel/eagledata_kernel.py): shut down as papermill shuts it down, it logs no
KeyboardInterrupt; a running cell is still interrupted.

papermill's last request is `kernel_info`; jupyter_client then sends SIGINT and a shutdown request. The stock kernel
arms SIGINT for the whole `kernel_info` handler, so an interrupt that lands after its reply went out is logged as
an error (1 run in 10-25). The tests widen that window on purpose: `kernel_info` sleeps 1 s after replying."""
import json
import signal
import subprocess
import queue
import sys
import time
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

WIDEN_KERNEL_INFO = """
import time
_kernel = get_ipython().kernel
_reply = _kernel.shell_handlers["kernel_info_request"]
async def _reply_then_linger(*args):
    await _reply(*args)
    time.sleep(1.0)  # the window papermill's shutdown interrupt can land in, made wide
_kernel.shell_handlers["kernel_info_request"] = _reply_then_linger
"""
LOGGED = "KeyboardInterrupt caught in kernel"


def _specs(tmp_path: Path) -> KernelSpecManager:
    """The installed `eagledata` kernel, and `stock`: ipykernel's own launcher in the same interpreter."""
    stock = tmp_path / "kernels" / "stock"
    stock.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (stock / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "stock", "language": "python"}))
    installed = Path(sys.prefix) / "share/jupyter/kernels"
    assert (installed / "eagledata" / "kernel.json").is_file(), "run `make setup` (registers the eagledata kernel)"
    return KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels"), str(installed)])


def _start(name: str, tmp_path: Path, log: Path):
    km = KernelManager(kernel_name=name, kernel_spec_manager=_specs(tmp_path))
    with log.open("wb") as out:
        km.start_kernel(stdout=out, stderr=out, cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def _shut_down_as_papermill_does(name: str, tmp_path: Path) -> str:
    """Run a cell, ask for kernel_info, then shut down (interrupt first, as jupyter_client does); the kernel's log."""
    log = tmp_path / f"{name}.log"
    km, kc = _start(name, tmp_path, log)
    try:
        assert kc.execute_interactive(WIDEN_KERNEL_INFO, timeout=30)["content"]["status"] == "ok"
        msg_id = kc.kernel_info()
        reply, _ = _reply_to(kc, msg_id, within_s=30)
        assert reply is not None and reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    return log.read_text()


def test_papermills_shutdown_logs_no_keyboard_interrupt(tmp_path):
    assert LOGGED not in _shut_down_as_papermill_does("eagledata", tmp_path)


def test_the_window_is_real_in_the_stock_kernel(tmp_path):
    """The same shutdown of ipykernel's own kernel logs the error: the test above can fail. Should ipykernel stop
    arming SIGINT outside user code, this fails, and eagledata_kernel.py can go."""
    assert LOGGED in _shut_down_as_papermill_does("stock", tmp_path)


def _runs(code: str, kc) -> str:
    """The status of `code` run as a cell. ipykernel aborts the requests that reach it just after a cell's error
    (stop_on_error: Run All stops at an interrupted cell), and one sent the moment the error reply comes may."""
    for _ in range(20):
        status = kc.execute_interactive(code, timeout=30)["content"]["status"]
        if status != "aborted":
            return status
        time.sleep(0.1)
    return status


def _interrupt_once_running(code: str, km, kc) -> str:
    """Run `code` as a cell and interrupt the kernel half a second after it starts (Lab's stop button); its msg id."""
    msg_id = kc.execute(code)
    while kc.get_iopub_msg(timeout=30)["msg_type"] != "execute_input":
        pass
    time.sleep(0.5)
    km.interrupt_kernel()
    return msg_id


def test_a_running_cell_is_still_interrupted(tmp_path):
    km, kc = _start("eagledata", tmp_path, tmp_path / "kernel.log")
    try:
        msg_id = _interrupt_once_running("import time; time.sleep(60)", km, kc)
        reply, _ = _reply_to(kc, msg_id, within_s=30)  # well before the cell would end
        assert reply is not None
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert _runs("1 + 1", kc) == "ok"  # and the kernel lives on
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


RUN_IN_A_CELL = """
from eagledata.generation import GenerateConfig, run_generation
cfg = GenerateConfig(dataset="C", datasets_file={datasets!r}, base_url={base_url!r}, output_dir={out!r},
                     params_dir={params!r}, concurrency=16, max_tokens=4000, progress=False, reserve_usd=0.0,
                     drain_timeout_s=600)
summary = await run_generation(cfg)
"""


def _dataset(tmp_path: Path, n: int) -> Path:
    """A datasets file naming C: `n` one-turn prompts."""
    prompts = tmp_path / "C.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                               for i in range(n)))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"C:\n  prompts: {prompts}\n")
    return datasets


def test_papermills_shutdown_stops_a_run_in_a_cell_cleanly(tmp_path, tokenizer_dir):
    """papermill's Ctrl-C shuts the kernel down (SIGINT, a shutdown request, SIGTERM at 2.5 s, SIGKILL at 5 s): the
    run awaited in the cell stops as a second Ctrl-C stops it — its requests abandoned, summary.json written — and
    the kernel ends by itself on the shutdown request, with no signal after it. (The stock kernel stops its loop
    mid-drain: no summary.) jupyter_client's waits are stretched (SIGTERM at 30 s, SIGKILL at 60 s) so that a loaded
    machine cannot turn a slow stop into a kill; that it comes within papermill's 5 s is a timing goal:
    `interrupt_probe --shutdown` (bench/README.md)."""
    from jupyter_client.manager import _ShutdownStatus

    from eagledata.emulator import run_emulator

    datasets = _dataset(tmp_path, 200)
    out = tmp_path / "out"
    # speed 0.5: an answer takes ~20 s, so the 16 in flight are mid-answer when the shutdown comes
    with run_emulator({"speed": 0.5, "balance": 100}) as emu:
        km, kc = _start("eagledata", tmp_path, tmp_path / "kernel.log")
        km.shutdown_wait_time = 60.0
        try:
            kc.execute(RUN_IN_A_CELL.format(datasets=str(datasets), base_url=emu.base_url, out=str(out),
                                            params=str(tmp_path / "params")))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and emu.stats()["in_flight"] < 16:
                time.sleep(0.1)
            assert emu.stats()["in_flight"] == 16, emu.stats()
            kc.stop_channels()
            km.shutdown_kernel()
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["remaining"] == 200 - summary["records"]
    assert km._shutdown_status is _ShutdownStatus.ShutdownRequest, km._shutdown_status  # ended by itself
    assert "Traceback" not in (tmp_path / "kernel.log").read_text()


def _reply_to(kc, msg_id: str, within_s: float) -> tuple[dict | None, float]:
    """The reply to `msg_id` and the seconds it took, or (None, within_s) if none came that soon. Replies to other
    requests are passed over: on a loaded machine `wait_for_ready` may have asked for kernel_info twice, and the
    second reply comes after it returned."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        try:
            msg = kc.get_shell_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg, time.monotonic() - started
    return None, within_s


# Jupyter's interrupt (Lab's stop button, Ctrl-C in a console) should return control within 5 s: a timing goal,
# measured by interrupt_probe.py (bench/README.md, "Ctrl-C in a notebook"). The tests tell an interrupt acted on now
# from one acted on at the cell's end by cells that would run for an hour, and wait for the reply this long at most.
REPLY_WITHIN_S = 120.0


def test_an_async_cell_is_interrupted_at_once(tmp_path):
    """A cell with top-level `await` (generate.ipynb's run cell is one): the interrupt cancels it now. ipykernel
    7.4's own handler queues the cancel without waking the loop, so this cell got it when its sleep ended (the stock
    kernel still does): here an hour on, so a reply at all, with CancelledError, is the interrupt acting now."""
    km, kc = _start("eagledata", tmp_path, tmp_path / "kernel.log")
    try:
        msg_id = _interrupt_once_running("import asyncio\nawait asyncio.sleep(3600)", km, kc)
        reply, took = _reply_to(kc, msg_id, within_s=REPLY_WITHIN_S)
        # measured 0.01 s (the stock kernel: at the sleep's end)
        assert reply is not None, f"no reply {took:.1f} s after the interrupt"
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "CancelledError"
        assert _runs("1 + 1", kc) == "ok"  # and the kernel lives on
        msg_id = _interrupt_once_running("await asyncio.sleep(3600)", km, kc)  # the next async cell alike
        reply, took = _reply_to(kc, msg_id, within_s=REPLY_WITHIN_S)
        assert reply is not None and reply["content"]["ename"] == "CancelledError", f"no reply after {took:.1f} s"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


CTRL_C_RUN = """
from eagledata.generation import GenerateConfig, run_generation
cfg = GenerateConfig(dataset="C", datasets_file={datasets!r}, base_url={base_url!r}, output_dir={out!r},
                     params_dir={params!r}, concurrency={concurrency}, max_tokens=4000, progress=False,
                     reserve_usd=0.0, stream=True)
summary = await run_generation(cfg)
print("stop reason:", summary["stop_reason"])
"""


def test_ctrl_c_stops_a_run_in_a_cell_closing_its_streams(tmp_path, tokenizer_dir):
    """Lab's stop button on generate.ipynb's run cell mid-run: the run's first Ctrl-C closes its streams (every
    endpoint here stops billing a closed stream, so none is left to finish): the service sees every one of the 300
    in flight cancelled, none answered, summary.json is written with `interrupted`, and the cell returns, printing its
    last line. Answers take 12-47 s (speed 1.0), so the run could not have ended by itself. That the cell returns
    within 5 s is a timing goal: bench/README.md, "Ctrl-C in a notebook" (0.5-1 s at 2,000 in flight)."""
    from eagledata.emulator import run_emulator
    from eagledata.emulator.catalog import default_endpoints

    concurrency, n = 300, 600
    prompts = tmp_path / "C.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                               for i in range(n)))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"C:\n  prompts: {prompts}\n")
    out = tmp_path / "out"
    cancelling = [{"provider": e.provider, "slug": e.slug, "quantization": e.quantization,
                   "prompt_price": e.prompt_price, "completion_price": e.completion_price, "latency": e.latency,
                   "throughput": e.throughput, "stream_cancellation": True}
                  for e in default_endpoints() if e.stream_cancellation]
    # every answer 1,350-1,750 tokens at 38-110 tok/s: 12-47 s, so none ends while the interrupt is handled, however
    # slowly, and all would within the drain's 60 s: an answer counted after the interrupt is one the run waited for
    long = {"reasoning_median": 1500, "reasoning_sigma": 0.1, "content_median": 100, "content_sigma": 0.1}
    with run_emulator({"speed": 1.0, "balance": 100, "replace_endpoints": True, "endpoints": cancelling,
                       "content": long}) as emu:
        km, kc = _start("eagledata", tmp_path, tmp_path / "kernel.log")
        try:
            msg_id = kc.execute(CTRL_C_RUN.format(datasets=str(datasets), base_url=emu.base_url, out=str(out),
                                                  params=str(tmp_path / "params"), concurrency=concurrency))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and emu.stats()["in_flight"] < concurrency:
                time.sleep(0.1)
            assert emu.stats()["in_flight"] == concurrency, emu.stats()
            answered = emu.stats()["outcomes"].get("ok", 0)
            km.interrupt_kernel()
            reply, took = _reply_to(kc, msg_id, within_s=REPLY_WITHIN_S)
            printed = []
            while True:
                try:
                    msg = kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    break
                if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
                    printed.append(msg["content"]["text"])
            outcomes = emu.stats()["outcomes"]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    # measured 0.5-0.6 s here (0.9 s at 2,000 in flight); a run that let its streams run to their end would reply
    # up to 47 s on, with them answered
    assert reply is not None, f"no reply {took:.1f} s after the interrupt"
    assert outcomes.get("ok", 0) == answered and outcomes.get("cancelled", 0) >= concurrency, outcomes
    assert reply["content"]["status"] == "ok", reply["content"]
    assert "stop reason: interrupted" in "".join(printed)
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and 0 < summary["remaining"] == n - summary["records"]


def test_sigterm_to_papermill_stops_the_run_with_its_summary(tmp_path, tokenizer_dir):
    """Issue 53: Slurm, Kubernetes and `timeout` stop a job with SIGTERM. papermill dies of it at once, and
    ipykernel's poller then ended the kernel with `os._exit`: the run in generate.ipynb left no summary.json. The
    eagledata kernel's poller stops the run as papermill's Ctrl-C does first: summary.json says `interrupted` and
    every prompt not recorded is still to do."""
    from eagledata.emulator import run_emulator
    from tests.helpers import ROOT

    datasets = _dataset(tmp_path, 200)
    out = tmp_path / "out"
    with run_emulator({"speed": 0.5, "balance": 100}) as emu:  # an answer takes ~20 s: mid-answer at the SIGTERM
        command = [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "generate.ipynb"),
                   str(tmp_path / "run.ipynb"), "-p", "dataset", "C", "-p", "datasets_file", str(datasets),
                   "-p", "base_url", emu.base_url, "-p", "output_dir", str(out), "-p", "params_dir",
                   str(tmp_path / "params"), "-p", "concurrency", "16", "-p", "reserve_usd", "0.0"]
        papermill = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and emu.stats()["in_flight"] < 16:
                time.sleep(0.1)
            assert emu.stats()["in_flight"] == 16, emu.stats()
            papermill.send_signal(signal.SIGTERM)
            papermill.wait(timeout=30)
            summary_file = out / "datasets" / "C" / "summary.json"
            deadline = time.monotonic() + 20  # the kernel sees its parent gone within a second, then stops the run
            while time.monotonic() < deadline and not summary_file.exists():
                time.sleep(0.2)
        finally:
            papermill.kill()
    summary = json.loads(summary_file.read_text())
    assert summary["stop_reason"] == "interrupted" and summary["remaining"] == 200 - summary["records"]
