"""By hand (bench/README.md, "Ctrl-C in a notebook at 2,000 in flight"): Lab's stop button on generate.ipynb's run
cell, measured. Starts an emulator and the `eagledata` kernel, runs a streamed generation in a cell, waits until
~all `--concurrency` requests are in flight, interrupts the kernel (`--interrupts` times, 0.5 s apart) and prints
the seconds to the cell's reply and summary.json's stop reason.

  .venv/bin/python -m tests.notebooks.interrupt_probe --concurrency 2000 --prompts 4000 [--all-cancel]

`--all-cancel`: every endpoint stops billing a closed stream (the first Ctrl-C closes them all); without it, the
emulator's default catalog, where a quarter of the answers are billed whole and finish first (up to 60 s).
`--kernel stock`: ipykernel's own kernel. `--sleep`: a plain `await asyncio.sleep(60)` cell instead of a run.
`--shutdown`: papermill's Ctrl-C instead of Lab's stop: jupyter_client's shutdown (SIGINT, a shutdown request, SIGTERM
at 2.5 s, SIGKILL at 5 s); prints the seconds it took and whether a signal was needed (test_kernel.py checks the same
stop with those waits stretched, so that its verdict does not depend on the machine's load).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from eagledata.emulator import run_emulator
from eagledata.emulator.catalog import default_endpoints
from tests.notebooks.test_kernel import CTRL_C_RUN, _reply_to, _start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default="eagledata")
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--prompts", type=int, default=4000)
    p.add_argument("--speed", type=float, default=1.0, help="emulator speed: answers take ~40 s at 1.0")
    p.add_argument("--interrupts", type=int, default=1)
    p.add_argument("--all-cancel", action="store_true")
    p.add_argument("--sleep", action="store_true")
    p.add_argument("--shutdown", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if a.sleep:
            km, kc = _start(a.kernel, tmp, tmp / "kernel.log")
            try:
                msg_id = kc.execute("import asyncio\nawait asyncio.sleep(60)")
                time.sleep(2)
                km.interrupt_kernel()
                reply, took = _reply_to(kc, msg_id, within_s=70)
                print(f"{a.kernel}: reply {reply and reply['content'].get('ename')} after {took:.2f} s")
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
            return
        prompts = tmp / "C.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"}]})
                                   + "\n" for i in range(a.prompts)))
        (tmp / "datasets.yaml").write_text(f"C:\n  prompts: {prompts}\n")
        emu_cfg: dict = {"speed": a.speed, "balance": 1000}
        if a.all_cancel:
            emu_cfg |= {"replace_endpoints": True, "endpoints": [
                {"provider": e.provider, "slug": e.slug, "quantization": e.quantization,
                 "prompt_price": e.prompt_price, "completion_price": e.completion_price, "latency": e.latency,
                 "throughput": e.throughput, "stream_cancellation": True}
                for e in default_endpoints() if e.stream_cancellation]}
        out = tmp / "out"
        with run_emulator(emu_cfg) as emu:
            km, kc = _start(a.kernel, tmp, tmp / "kernel.log")
            try:
                started = time.monotonic()
                msg_id = kc.execute(CTRL_C_RUN.format(datasets=str(tmp / "datasets.yaml"), base_url=emu.base_url,
                                                      out=str(out), params=str(tmp / "params"),
                                                      concurrency=a.concurrency))
                while time.monotonic() - started < 120 and emu.stats()["in_flight"] < a.concurrency * 0.97:
                    time.sleep(0.2)
                print(f"{emu.stats()['in_flight']} in flight {time.monotonic() - started:.1f} s after the cell began")
                if a.shutdown:
                    kc.stop_channels()
                    started = time.monotonic()
                    km.shutdown_kernel()  # jupyter_client's default waits, as papermill's
                    took = time.monotonic() - started
                    status = km._shutdown_status.value  # ShutdownRequest: no signal after the request
                    summary = out / "datasets" / "C" / "summary.json"
                    s = json.loads(summary.read_text()) if summary.exists() else {}
                    print(f"{a.kernel}: shut down in {took:.2f} s ({status}); summary.json: {s.get('stop_reason')}, "
                          f"{s.get('records')} records, {s.get('remaining')} to do")
                    sys.exit(0 if took < 5.0 and status == "ShutdownRequest" and s.get("stop_reason") == "interrupted"
                             else 1)
                for i in range(a.interrupts):
                    km.interrupt_kernel()
                    if i + 1 < a.interrupts:
                        time.sleep(0.5)
                reply, took = _reply_to(kc, msg_id, within_s=120 - 0.5 * (a.interrupts - 1))
                took += 0.5 * (a.interrupts - 1)
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
        summary = out / "datasets" / "C" / "summary.json"
        s = json.loads(summary.read_text()) if summary.exists() else {}
        print(f"{a.kernel}: reply {reply and reply['content']['status']} {took:.2f} s after the first interrupt; "
              f"summary.json: {s.get('stop_reason')}, {s.get('records')} records, {s.get('remaining')} to do")
        sys.exit(0 if reply is not None and s.get("stop_reason") == "interrupted" else 1)


if __name__ == "__main__":
    main()
