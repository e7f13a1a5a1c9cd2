"""The `eagledata` kernel (kernel/eagledata_kernel.py): shut down as papermill shuts it down, it logs no
KeyboardInterrupt; a running cell is still interrupted.

papermill's last request is `kernel_info`; jupyter_client then sends SIGINT and a shutdown request. The stock kernel
arms SIGINT for the whole `kernel_info` handler, so an interrupt that lands after its reply went out is logged as
an error (1 run in 10-25). The tests widen that window on purpose: `kernel_info` sleeps 1 s after replying."""
import json
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
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
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


def test_a_running_cell_is_still_interrupted(tmp_path):
    km, kc = _start("eagledata", tmp_path, tmp_path / "kernel.log")
    try:
        msg_id = kc.execute("import time; time.sleep(60)")
        while kc.get_iopub_msg(timeout=30)["msg_type"] != "execute_input":
            pass
        time.sleep(0.5)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)  # well before the cell would end
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert kc.execute_interactive("1 + 1", timeout=30)["content"]["status"] == "ok"  # and the kernel lives on
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


def test_papermills_shutdown_stops_a_run_in_a_cell_cleanly(tmp_path, tokenizer_dir):
    """papermill's Ctrl-C shuts the kernel down (SIGINT, a shutdown request, SIGTERM at 2.5 s, SIGKILL at 5 s): the
    run awaited in the cell stops as a second Ctrl-C stops it — its requests abandoned, summary.json written — and
    the kernel ends by itself before jupyter_client kills it. (The stock kernel stops its loop mid-drain: no
    summary.)"""
    from jupyter_client.manager import _ShutdownStatus

    from eagledata.emulator import run_emulator

    prompts = tmp_path / "C.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                               for i in range(200)))
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"C:\n  prompts: {prompts}\n")
    out = tmp_path / "out"
    # speed 0.5: an answer takes ~20 s, so the 16 in flight are mid-answer when the shutdown comes
    with run_emulator({"speed": 0.5, "balance": 100}) as emu:
        km, kc = _start("eagledata", tmp_path, tmp_path / "kernel.log")
        try:
            kc.execute(RUN_IN_A_CELL.format(datasets=str(datasets), base_url=emu.base_url, out=str(out),
                                            params=str(tmp_path / "params")))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and emu.stats()["in_flight"] < 16:
                time.sleep(0.1)
            assert emu.stats()["in_flight"] == 16, emu.stats()
            started = time.monotonic()
            kc.stop_channels()
            km.shutdown_kernel()
            took = time.monotonic() - started
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    summary = json.loads((out / "datasets" / "C" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["remaining"] == 200 - summary["records"]
    assert km._shutdown_status is not _ShutdownStatus.SigkillRequest and took < 5.0, (took, km._shutdown_status)
    assert "Traceback" not in (tmp_path / "kernel.log").read_text()
