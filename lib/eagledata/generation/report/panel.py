"""The live panel a run shows in JupyterLab: the report's health figure and provider table (report.py), redrawn
in place from the run's snapshot while it goes, so the questions a person asks during a run (is throughput
holding, is spend on the plan's line, which provider serves and how, are the datasets advancing together, when
does it end and on what) are answered then, not afterwards.

ipywidgets (an `Image` and two `HTML`s in a `VBox`): JupyterLab updates a widget in place, with no flicker and no
growing output, where `display(..., update=True)` of a figure re-renders the whole output each time; and the
widgets are there wherever tqdm's bars were (the same frontend test, `status.widget_frontend`). The figure is
matplotlib's Agg without pyplot, drawn on a worker thread at most every `interval_s` (a frame is skipped while the
last is still drawing), so the event loop that serves 2,000 requests only copies the snapshot's figures.
`make_progress` picks what shows a run: this panel under a widget frontend, else status lines (progress.py).
"""
from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from ...status import widget_frontend
from .progress import ProgressView, RunSnapshot, StatusLines
from .run_report import RunHealth, figure_png, plot_health, provider_table

FRAME_INTERVAL_S = 2.0  # at most one frame this often (a frame takes ~0.5 s of one core at 2,000 in flight)
DPI = 72


def render(health: RunHealth) -> tuple[bytes, str, str]:
    """One frame: the health figure as PNG; the headline with each dataset's bar, and the provider table, as HTML
    (text a reader can select, and a test can read)."""
    png = figure_png(plot_health(health), DPI)
    bars = "".join(
        f'<span class="eagledata-dataset" style="margin-right:1.5em">{html.escape(d.name)} '
        f'<progress value="{min(d.share, 1.0):.4f}" max="1"></progress> {100 * d.share:.1f}% of {d.of}</span>'
        for d in health.datasets)
    head = f"<b>{html.escape(health.headline())}</b><br>{bars}"
    table = provider_table(health)
    providers = ("<b>providers</b>: share of answers, median latency of the last attempts, error and 429 rates, "
                 "fidelity verdict" + (table.to_html(classes="eagledata-providers", index_names=False,
                                                     float_format=lambda x: f"{x:,.3g}")
                                       if len(table) else "<p>no answers yet</p>"))
    return png, head, providers


class LivePanel:
    """A `ProgressView` that draws the run's health in place; `show` puts the widgets on screen (the notebook's
    display; tests and the bench pass their own, or None to draw without showing). `executor`: where frames are
    drawn (one worker thread of its own by default; a test passes clock.InlineExecutor to draw each frame at once)."""

    def __init__(self, snap: RunSnapshot, *, interval_s: float = FRAME_INTERVAL_S,
                 show: Callable[[Any], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 executor: Executor | None = None):
        import ipywidgets as widgets

        self.interval_s, self.clock = interval_s, clock
        self.headline = widgets.HTML(layout=widgets.Layout(margin="0 0 4px 0"))
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.table = widgets.HTML()
        self.box = widgets.VBox([self.headline, self.image, self.table])
        self.box.add_class("eagledata-live-panel")
        self.frames = 0                     # frames put on screen
        self.busy_s = 0.0                   # time spent drawing them (off the loop)
        self._pool = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagledata-panel")
        self._pending: Future | None = None
        self._last = -float("inf")
        self._closed = False
        if show is not None:
            show(self.box)
        self.update(snap)

    def update(self, snap: RunSnapshot) -> None:
        """Called on every tick: a new frame at most every `interval_s`, none while one is drawing."""
        now = self.clock()
        if now - self._last < self.interval_s or (self._pending is not None and not self._pending.done()):
            return
        self._last = now
        health = RunHealth.of_snapshot(snap)  # copied here, on the loop: the run goes on changing its counters
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._pending = self._pool.submit(self._draw, health, loop)

    def _draw(self, health: RunHealth, loop: asyncio.AbstractEventLoop | None) -> None:
        t0 = time.perf_counter()
        frame = render(health)
        self.busy_s += time.perf_counter() - t0  # this one drawing thread alone writes it
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._put, frame)  # widgets change on the kernel's thread
        else:
            self._put(frame)

    def _put(self, frame: tuple[bytes, str, str], final: bool = False) -> None:
        if self._closed and not final:
            return  # a frame drawn before the final one, arriving after it
        png, headline, table = frame
        self.headline.value = headline
        self.table.value = table
        self.image.value = png
        self.frames += 1

    def close(self, snap: RunSnapshot, summary: dict[str, Any] | None = None) -> None:
        """The final frame, drawn at once from the summary (the report's figure), else the last snapshot."""
        self._closed = True
        if self._pending is not None:
            self._pending.result()
        self._pool.shutdown(wait=True)
        health = RunHealth.of_summary(summary) if summary is not None else RunHealth.of_snapshot(snap)
        self._put(render(health), final=True)


def make_progress(snap: RunSnapshot, *, interval_s: float, widget: bool | None = None,
                  clock: Callable[[], float] = time.monotonic) -> ProgressView:
    """The live panel where a widget frontend shows it (JupyterLab), else status lines every `interval_s`. `clock`:
    the run's own (the engine passes its clock, so that under virtual time the lines keep virtual time too)."""
    if widget_frontend() if widget is None else widget:
        from IPython.display import display

        return LivePanel(snap, show=display, clock=clock)
    return StatusLines(interval_s=interval_s, clock=clock)


class BatchPanel:
    """The batch route's live panel: its headline (tokens per dataset against the target, $ answered and booked) and
    the table of rounds (each batch's status, lines answered and failed, $ and the wait), redrawn in place at each
    poll. `show` puts the widget on screen (the notebook's display; a test passes its own)."""

    def __init__(self, show: Callable[[Any], None] | None = None):
        import ipywidgets as widgets

        self.widget = widgets.HTML()
        self.widget.add_class("eagledata-batch-panel")
        if show is not None:
            show(self.widget)

    def update(self, headline: str, rounds: list[dict[str, Any]]) -> None:
        import pandas as pd

        cols = ["dataset", "round", "batch_id", "status", "lines", "answered", "failed", "usd", "waited_s"]
        table = pd.DataFrame([{c: r.get(c) for c in cols} for r in rounds], columns=cols)
        self.widget.value = (f"<b>{html.escape(headline)}</b>"
                             + (table.to_html(index=False, float_format=lambda x: f"{x:,.4g}") if rounds else
                                "<p>no batch submitted yet</p>"))


def make_batch_panel(widget: bool | None = None) -> BatchPanel | None:
    """The batch route's panel where a widget frontend shows it (JupyterLab); None elsewhere (status lines)."""
    if widget_frontend() if widget is None else widget:
        from IPython.display import display

        return BatchPanel(show=display)
    return None
