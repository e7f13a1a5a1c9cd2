"""JupyterLab in a real browser (`make test-lab`): headless Chromium, driven by playwright, opens Lab on the
repository and does Run All on generate.ipynb against the emulator, first as a notebook beside the others in
notebooks/, then as a papermill report in outputs/runs/ (which must continue its own work where it lies).

Each time: the live panel shows while the run goes (with both datasets over a minute, it changes at least ten
times), the stop reason and the report's plots render, no traceback; screenshots go to outputs/lab-test/. Without playwright or a Chromium they fail and say how to get
them (`make test-lab` installs both): a browser test that skips would pass unseen. And the notebooks' Markdown as
Lab renders it: a `$` shows as a dollar, never as math. `make test` leaves them out
(marker `lab`).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from eagledata.notebooks import NOTEBOOK_DIR, PROJECT_ROOT_ENV, execute_notebook, notebook_path

pytestmark = pytest.mark.lab

ROOT = NOTEBOOK_DIR.parent
WORK = "outputs/lab-test"  # this test's datasets, params and screenshots, relative to the project root
REPORT = "lab-test-generate-demo-b.ipynb"  # the papermill report, in outputs/runs/
PROMPTS = 12
# Short answers at real latencies: a run lasts seconds, long enough to watch the widget move.
EMULATOR = {"speed": 1.0, "seed": 11, "balance": 100.0,
            "content": {"reasoning_median": 60, "reasoning_sigma": 0.5, "content_median": 20, "content_sigma": 0.5,
                        "max_total": 400}}
SETTINGS = {  # Lab user settings for the test: every cell in the DOM, no news or update checks
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def browser_executable() -> str:
    """$EAGLEDATA_LAB_BROWSER, else a Chromium on PATH; fails (saying how to get one) when there is none."""
    named = os.environ.get("EAGLEDATA_LAB_BROWSER")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no Chromium: `make test-lab` installs apt's chromium when run as root; or set EAGLEDATA_LAB_BROWSER")


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is not installed (`make test-lab` installs requirements-test-lab.txt)")
    executable = browser_executable()
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyter_lab(tmp: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab on the repository (token auth, a free port, private settings); yields (URL, token).

    Kernels start in the notebook's folder with this environment, minus any EAGLEDATA_PROJECT_ROOT: the
    notebooks must find the project root themselves."""
    token, port = secrets.token_hex(16), free_port()
    settings = tmp / "lab-settings"
    for plugin, values in SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {k: v for k, v in os.environ.items() if k != PROJECT_ROOT_ENV}
    env.update(JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"),
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
           f"--ServerApp.root_dir={ROOT}", f"--IdentityProvider.token={token}", "--allow-root"]
    log = (tmp / "jupyter-lab.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited:\n{(tmp / 'jupyter-lab.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/api/status", params={"token": token}, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab not up:\n{(tmp / 'jupyter-lab.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield url, token
    finally:
        proc.terminate()  # the server shuts its kernels down; whatever lingers goes with its process group
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("lab")
    with jupyter_lab(tmp) as url_token:
        yield url_token


@pytest.fixture(scope="module")
def emu():
    from eagledata.emulator import run_emulator

    with run_emulator(EMULATOR) as handle:
        yield handle


@pytest.fixture(scope="module")
def work() -> Path:
    """outputs/lab-test/: a datasets file naming the repository's demo prompts by project-relative paths."""
    work = ROOT / WORK
    shutil.rmtree(work, ignore_errors=True)
    (ROOT / "outputs" / "runs" / REPORT).unlink(missing_ok=True)
    (work / "params").mkdir(parents=True)
    (work / "params" / "datasets.yaml").write_text(
        "demo-a: {prompts: examples/prompts/demo-a.jsonl}\ndemo-b: {prompts: examples/prompts/demo-b.jsonl}\n")
    (work / "screenshots").mkdir()
    return work


def generate_parameters(emu, dataset: str | list[str], **more) -> dict:
    """Small parameters, every path relative to the project root (they must mean the same from any folder)."""
    return {**dict(dataset=dataset, datasets_file=f"{WORK}/params/datasets.yaml", params_dir=f"{WORK}/params",
                   output_dir=WORK, base_url=emu.base_url, concurrency=2, max_tokens=400, reserve_usd=0.0,
                   limit=PROMPTS), **more}


def records(dataset: str) -> int:
    """Prompts recorded: conversations, whose turns are a record each."""
    path = ROOT / WORK / "datasets" / dataset / "records.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return len({(r := json.loads(line)).get("conversation_id", r["id"]) for line in lines})


# -- driving Lab ------------------------------------------------------------------------------------------
PANEL = ".jp-OutputArea-output .eagledata-live-panel"  # the run's live panel (generation/report/panel.py)
WATCH = """els => els.map(p => ({
    frame: (p.querySelector('img') || {}).src || '',
    head: (p.querySelector('.widget-html') || p).innerText,
    datasets: [...p.querySelectorAll('.eagledata-dataset')].map(e => e.innerText),
    providers: [...p.querySelectorAll('table.eagledata-providers tbody tr th')].map(e => e.innerText)}))"""


def run_all_in_lab(browser, lab, path: str, screenshot: Path) -> dict:
    """Open `path` (relative to the repository) in Lab, Run All, wait for the kernel to finish, save.

    Returns what the browser showed: the live panel's frames in order (each with its headline, dataset bars and
    provider rows, while the run cell executed), the output text, how many images rendered and any error outputs."""
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    try:
        # `reset`: a fresh workspace, so an earlier test's notebook is not restored beside this one
        page.goto(f"{url}/lab/tree/{path}?reset&token={token}", wait_until="domcontentloaded")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
        page.wait_for_function("() => document.querySelector('.jp-NotebookPanel') && "
                               "[...document.querySelectorAll('.jp-StatusBar-TextItem, .jp-StatusBar-Component')]"
                               ".some(e => /Idle/.test(e.textContent))", timeout=120_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
        frames: list[dict] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            panels = page.eval_on_selector_all(PANEL, WATCH)
            if panels and panels[-1]["frame"] and (not frames or panels[-1]["frame"] != frames[-1]["frame"]):
                frames.append(panels[-1])
                if len(frames) == 3:  # the panel has changed twice: show it running
                    page.locator(PANEL).last.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-running.png")))
            prompts = page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.innerText)")
            if prompts and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts):
                break
            time.sleep(0.1)
        else:
            page.screenshot(path=str(screenshot))
            raise TimeoutError(f"Run All did not finish; prompts {prompts}")
        for _ in range(50):  # the final frame, put as the run cell ends: the browser may draw it a moment later
            panels = page.eval_on_selector_all(PANEL, WATCH)
            if panels and panels[-1]["frame"] and (not frames or panels[-1]["frame"] != frames[-1]["frame"]):
                frames.append(panels[-1])
            if not panels or panels[-1]["head"].startswith("ended"):
                break
            time.sleep(0.1)
        page.keyboard.press("Control+s")
        time.sleep(1.0)
        shown = {
            "frames": frames,
            "text": page.inner_text(".jp-NotebookPanel .jp-Notebook"),
            "images": page.locator(".jp-OutputArea-output img").count(),
            "errors": page.eval_on_selector_all('[data-mime-type="application/vnd.jupyter.error"], '
                                                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]',
                                                "els => els.map(e => e.innerText)"),
        }
        if page.locator(PANEL).count():
            page.locator(PANEL).last.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-panel.png")))
        page.locator(".jp-OutputArea-output img").last.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshot))
        return shown
    finally:
        page.close()


def check_run(shown: dict, saved: Path, datasets: list[str]) -> str:
    """The live panel showed and ended on the run's end, with a bar per dataset and the provider table; a stop
    reason and the report's plots showed; nothing failed; the saved notebook agrees."""
    assert not shown["errors"], shown["errors"]
    assert "Traceback" not in shown["text"]
    stop = re.search(r"stop reason: (\w+)", shown["text"])
    assert stop, shown["text"][-2000:]
    assert shown["images"] >= 3, "the panel and the report's plots did not render"
    frames = shown["frames"]
    assert frames, "the live panel never showed"
    last = frames[-1]
    assert f"ended: {stop.group(1)}" in last["head"], last
    assert [d.split()[0] for d in last["datasets"]] == datasets and all("%" in d for d in last["datasets"]), last
    assert last["providers"], f"no provider rows in the panel's table: {last}"
    nb = json.loads(saved.read_text())
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs)
    return stop.group(1)


# -- the tests --------------------------------------------------------------------------------------------
def test_generate_notebook_runs_in_lab(browser, lab, emu, work):
    """A copy of generate.ipynb beside the others in notebooks/ (papermill --prepare-only: its parameters
    injected, nothing run), Run All in Lab: the whole dataset."""
    copy = NOTEBOOK_DIR / "lab-test-generate.ipynb"
    import papermill

    papermill.execute_notebook(str(notebook_path("generate")), str(copy), generate_parameters(emu, "demo-a"),
                               prepare_only=True, progress_bar=False)
    try:
        shown = run_all_in_lab(browser, lab, "notebooks/lab-test-generate.ipynb",
                               work / "screenshots" / "generate-in-notebooks.png")
        assert check_run(shown, copy, ["demo-a"]) == "completed"
        assert records("demo-a") == PROMPTS
        assert not (NOTEBOOK_DIR / "outputs").exists() and not (NOTEBOOK_DIR / "params").exists()
    finally:
        copy.unlink(missing_ok=True)
        (NOTEBOOK_DIR / ".ipynb_checkpoints" / "lab-test-generate-checkpoint.ipynb").unlink(missing_ok=True)


def test_report_in_outputs_runs_continues_in_lab(browser, lab, emu, work):
    """A papermill report in outputs/runs/ that stopped at its spend cap: Run All where it lies continues the
    same dataset in the same folder, with the widget, the stop reason and the plots."""
    report = ROOT / "outputs" / "runs" / REPORT
    execute_notebook(notebook_path("generate"), report, generate_parameters(
        emu, "demo-b", max_spend_usd=0.002, prior_output_median_tokens=80.0), cwd=ROOT)
    before = records("demo-b")
    assert 0 < before < PROMPTS
    requests = emu.stats()["requests"]
    shown = run_all_in_lab(browser, lab, f"outputs/runs/{REPORT}",
                           work / "screenshots" / "report-in-outputs-runs.png")
    assert check_run(shown, report, ["demo-b"]) in ("max_spend_reached", "completed")
    assert records("demo-b") > before and emu.stats()["requests"] > requests
    runs = ROOT / "outputs" / "runs"
    assert not (runs / "outputs").exists() and not (runs / "params").exists()


def test_live_panel_changes_while_two_datasets_run_in_lab(browser, lab, emu, work):
    """Run All on generate.ipynb over two datasets (12 prompts each, 2 in flight: about a minute): the live panel
    appears and changes at least ten times while the run cell executes, always with both datasets' bars and, once
    answers came, the provider table; its last frame says how the run ended."""
    copy = NOTEBOOK_DIR / "lab-test-generate-live.ipynb"
    import papermill

    papermill.execute_notebook(str(notebook_path("generate")), str(copy), generate_parameters(
        emu, ["demo-a", "demo-b"], output_dir=f"{WORK}/live"), prepare_only=True, progress_bar=False)
    try:
        t0 = time.monotonic()
        shown = run_all_in_lab(browser, lab, f"notebooks/{copy.name}", work / "screenshots" / "live-panel.png")
        took = time.monotonic() - t0
        assert check_run(shown, copy, ["demo-a", "demo-b"]) == "completed"
        frames = [f for f in shown["frames"] if f["datasets"]]  # the image can show before its HTML beside it
        assert len(frames) >= 11, f"the panel changed {len(frames) - 1} times in {took:.0f} s"
        assert all([d.split()[0] for d in f["datasets"]] == ["demo-a", "demo-b"] for f in frames), frames
        running = [f for f in frames if f["head"].startswith("running")]
        assert len(running) >= 10 and any(f["providers"] for f in running), frames[-3:]
        assert all(re.search(r"ETA (targets .+ first|once answers come)", f["head"]) for f in running)
    finally:
        copy.unlink(missing_ok=True)
        (NOTEBOOK_DIR / ".ipynb_checkpoints" / f"{copy.stem}-checkpoint.ipynb").unlink(missing_ok=True)


# -- Markdown as Lab renders it ---------------------------------------------------------------------------
MATH = "mjx-container, .MathJax, .katex, math"  # what MathJax (Lab's default) or KaTeX leave where they typeset
PLANTED = {  # appended to the copy: the check must see math where Lab typesets it
    "bare": ("Planted: costs $ and $ more.", True),
    "escaped_one_run": ("Planted: costs \\$ and \\$ more.", True),  # why test_markdown.py refuses two in one run
    "escaped_split": ("Planted: costs \\$ and `x` then \\$ more.", False),
}
RENDERED = "(els, math) => els.map(e => ({text: e.innerText, math: e.querySelectorAll(math).length}))"


def test_dollars_in_markdown_render_as_text_in_lab(browser, lab, work):
    """generate.ipynb as committed, opened in Lab (a copy with three planted Markdown cells at the end): no Markdown
    cell of it renders a math element, and the Run and Conclusion cells read "in flight, $", "share of its target, $
    and stop reason" and "failed, $ and the wait" with no backslash showing (issue 53 item 16: the Conclusion was
    one italic run of LaTeX). The planted cells show the check sees math: a bare pair is typeset; so is a pair
    written `\\$` with only text between them (Lab's Markdown drops the backslash and MathJax typesets the pair,
    hence test_markdown.py's rule of one `$` per run; should a Lab update stop that, this fails and the rule can
    go); a code span between them ends the run."""
    url, token = lab
    committed = json.loads(notebook_path("generate").read_text())
    copy = NOTEBOOK_DIR / "lab-test-markdown.ipynb"
    planted = [{"cell_type": "markdown", "metadata": {}, "source": text} for text, _ in PLANTED.values()]
    copy.write_text(json.dumps({**committed, "cells": committed["cells"] + planted}, indent=1))
    expected = [c for c in committed["cells"] if c["cell_type"] == "markdown"]
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    try:
        page.goto(f"{url}/lab/tree/notebooks/{copy.name}?reset&token={token}", wait_until="domcontentloaded")
        page.wait_for_selector(".jp-NotebookPanel .jp-MarkdownCell .jp-RenderedMarkdown", timeout=120_000)
        cells = ".jp-NotebookPanel .jp-MarkdownCell .jp-RenderedMarkdown"
        deadline = time.monotonic() + 60  # MathJax loads on first use: wait for the planted bare pair's math
        while (shown := page.eval_on_selector_all(cells, RENDERED, MATH)) and not shown[-len(PLANTED)]["math"]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # the other cells were typeset before it; let any late one land
        shown = page.eval_on_selector_all(cells, RENDERED, MATH)
        conclusion = page.locator(".jp-MarkdownCell", has_text="share of its target").last
        conclusion.scroll_into_view_if_needed()
        conclusion.screenshot(path=str(work / "screenshots" / "markdown-dollars.png"))
    finally:
        page.close()
        copy.unlink(missing_ok=True)
        (NOTEBOOK_DIR / ".ipynb_checkpoints" / f"{copy.stem}-checkpoint.ipynb").unlink(missing_ok=True)

    assert len(shown) == len(expected) + len(PLANTED), [s["text"][:60] for s in shown]
    for (name, (_, typeset)), cell in zip(PLANTED.items(), shown[len(expected):]):
        assert bool(cell["math"]) == typeset, (name, cell)
    assert shown[-1]["text"].strip() == "Planted: costs $ and x then $ more."
    notebook = shown[:len(expected)]
    assert [c["text"][:40] for c in notebook if c["math"]] == [], "math in generate.ipynb's Markdown"
    text = "\n".join(c["text"] for c in notebook)
    for phrase in ("requests in flight, $", "share of its target, $ and stop reason", "failed, $ and the wait"):
        assert phrase in " ".join(text.split()), phrase
    assert "\\$" not in text
