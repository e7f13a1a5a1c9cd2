"""Progress a person can watch wherever a run happens: a widget bar in JupyterLab, else one status line every
N seconds through `logging` (papermill, the commands, a log file), so `papermill --log-output` of a 30-minute
run shows what it is doing while it runs.

Which one is decided once per run by `widget_frontend()`. The status lines go to the `eagledata` logger;
`ensure_log_handler()` gives it a stderr handler when nothing else would print them.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("eagledata")

# A Jupyter server names the session of each kernel it starts (jupyter_server sets this); nbclient (papermill,
# the tests) does not. VS Code's notebooks render widgets too.
_FRONTEND_ENV = ("JPY_SESSION_NAME", "VSCODE_PID")


def widget_frontend() -> bool:
    """True when progress widgets will be seen: an IPython kernel started by a Jupyter server (JupyterLab,
    Notebook, VS Code). A papermill run, a plain script and the commands get status lines instead."""
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except Exception:
        ip = None
    if ip is None or type(ip).__name__ != "ZMQInteractiveShell":
        return False
    return any(os.environ.get(name) for name in _FRONTEND_ENV)


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is at the time (a kernel's cell output, pytest's capture)."""

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


def ensure_log_handler(level: int = logging.INFO) -> None:
    """Make status lines visible: when neither the `eagledata` logger nor the root logger has a handler (a
    notebook kernel, a bare script), give `eagledata` one that writes `HH:MM:SS message` to stderr. A program
    that set up logging itself is left alone."""
    if log.handlers or logging.getLogger().handlers:
        if log.level == logging.NOTSET or log.level > level:
            log.setLevel(level)
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(level)


def duration(seconds: float | None) -> str:
    """`42s`, `3m05s`, `2h07m`; `?` when not known."""
    if seconds is None or seconds != seconds or seconds == float("inf") or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_s(done: float, total: float | None, elapsed_s: float, done_at_start: float = 0.0) -> float | None:
    """Seconds left at this run's mean rate; None before there is a rate or without a total."""
    if total is None:
        return None
    progressed = done - done_at_start
    if done >= total:
        return 0.0
    if progressed <= 0 or elapsed_s <= 0:
        return None
    return (total - done) * elapsed_s / progressed


@dataclass
class StatusLog:
    """Logs a line at most once per `interval_s` on a fixed schedule (start + k·interval, so lines do not drift
    later by the caller's polling period), plus any `emit` the caller forces (the final line). The clock is
    injected so the cadence is testable without waiting."""

    interval_s: float
    name: str = "eagledata"
    clock: Callable[[], float] = time.monotonic
    lines: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.logger = logging.getLogger(self.name)
        self.next_at = self.clock() + self.interval_s

    def due(self) -> bool:
        return self.interval_s > 0 and self.clock() >= self.next_at

    def maybe(self, line: Callable[[], str]) -> bool:
        """Log `line()` when the next scheduled time has come; `line` is only built then."""
        if not self.due():
            return False
        now = self.clock()
        self.next_at += self.interval_s * (1 + int((now - self.next_at) // self.interval_s))  # skip missed slots
        self.emit(line())
        return True

    def emit(self, text: str) -> None:
        self.lines += 1
        self.logger.info(text)
