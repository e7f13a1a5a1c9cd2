"""The run report of generate.ipynb: tables and plots from the run's summary and the records.

The run's health (throughput, spend, datasets, providers, errors, ETA) is one `RunHealth`, read from a summary
(the report) or from a live snapshot (the panel a run shows while it goes, panel.py): both draw the same figure and
table from it, so the panel's last frame is the report's figure."""
from __future__ import annotations

import bisect
import functools
import io
import math
from dataclasses import dataclass
from typing import Any

from ...files import iter_jsonl
from ...paths import DatasetFiles
from ...records import CUT, output_tokens
from ...status import duration
from ..conversations.turns import MISMATCHES
from .environments import environment_rows
from .progress import NO_PROVIDER, TIMELINE_COLUMNS, RunSnapshot, run_etas, sooner, thin

RATE_WINDOW_S = 5.0  # throughput is over at least this long (a sample right after the last is not a rate)
NO_PROVIDER_LABEL = "(no provider: connection or gateway error)"  # the provider table's row for NO_PROVIDER
AT_BOUND_LABEL = "booked at a bound, not yet read"  # unreadable answers: the account has not said what they cost


@functools.cache
def _figure_class():
    """A matplotlib Figure outside pyplot (the live panel draws it on a worker thread) that a notebook shows as a
    PNG by itself: without pyplot imported, IPython knows no formatter for a bare Figure and prints its repr."""
    from matplotlib.figure import Figure

    class ReportFigure(Figure):
        def _repr_png_(self) -> bytes:
            return figure_png(self)

    return ReportFigure


def figure_png(fig, dpi: int = 80) -> bytes:
    """A figure drawn as PNG by Agg (thread-safe: no pyplot, no GUI backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _figure(**kw: Any):
    return _figure_class()(**kw)


def dataset_summaries(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each dataset's summary: the run's `datasets`, or the one dataset's summary itself."""
    return summary["datasets"] if "datasets" in summary else {summary["dataset"]: summary}


def without_timelines(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary to publish: the same, less the timelines (the report's plots have them)."""
    out = {k: v for k, v in summary.items() if not k.startswith("timeline")}
    if "datasets" in out:
        out["datasets"] = {n: without_timelines(s) for n, s in out["datasets"].items()}
    return out


def record_stats(*files: DatasetFiles):
    """One row per record (no ids or text): dataset, provider, finish reason, token counts, cost."""
    import pandas as pd

    rows = []
    for f in files:
        if not f.records.is_file():
            continue
        for _, r in iter_jsonl(f.records, tolerate_torn_tail=True):
            u = r.get("usage") or {}
            rows.append({"dataset": r.get("dataset"), "provider": r.get("provider") or "?",
                         "finish_reason": r.get("finish_reason"),
                         "output_tokens": output_tokens(u.get("completion_tokens"), r.get("output_ids")),
                         "prompt_tokens": len(r.get("prompt_ids") or []),
                         "reasoning_tokens": u.get("reasoning_tokens") or 0, "cost": u.get("cost")})
    return pd.DataFrame(rows, columns=["dataset", "provider", "finish_reason", "output_tokens", "prompt_tokens",
                                       "reasoning_tokens", "cost"])


def dataset_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per dataset: target, tokens, share of target, records, $ (its share of the account's delta), stop reason."""
    rows = []
    for name, s in dataset_summaries(summary).items():
        target = s["target_output_tokens"]
        rows.append({"dataset": name, "stop_reason": s["stop_reason"], "target_output_tokens": target,
                     "output_tokens": s["output_tokens"],
                     "share_of_target": None if not target else round(s["output_tokens"] / target, 4),
                     "records": s["records"], "failures": s["failures"], "remaining": s["remaining"],
                     "output_tokens_this_run": s["run"]["output_tokens"], "charged_usd": s["run"]["charged_usd"],
                     "target_met_s": s["run"].get("target_met_s")})
    return rows


def datasets_table(summary: dict[str, Any]):
    """`dataset_rows` as a table, one row per dataset."""
    import pandas as pd

    return pd.DataFrame(dataset_rows(summary)).set_index("dataset")


def _share(s: dict[str, Any]) -> tuple[float, str]:
    """Where a dataset ended: output tokens ÷ its target, else prompts answered ÷ its prompts (whole conversations:
    a dataset of 2-turn conversations has two records a prompt; a prompt failed for good is finished, not
    answered), and which of the two."""
    target = s["target_output_tokens"]
    if target:
        return s["output_tokens"] / target, "target"
    return max(s["prompts"] - s["remaining"] - s["failures"], 0) / max(s["prompts"], 1), "prompts"


def plot_datasets(summary: dict[str, Any]):
    """Each dataset's progress toward its target over the run (or its prompts, without a target), and where it ended."""
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(15, 4.5))
    per = dataset_summaries(summary)
    for name, s in per.items():
        cols, tl = s["timeline_columns"], s.get("timeline") or []
        target = s["target_output_tokens"]
        base = s["output_tokens"] - s["run"]["output_tokens"]  # recorded before this run
        t = [row[cols.index("t_s")] for row in tl]
        if target:
            ax.plot(t, [(base + row[cols.index("output_tokens")]) / target for row in tl], label=name)
        elif "prompts_answered" in cols:  # a timeline written before it counted prompts has no such line
            before = s["run"]["done_before"] - (s["failures"] - s["run"]["failed"])  # answered before this run
            ax.plot(t, [(before + row[cols.index("prompts_answered")]) / max(s["prompts"], 1) for row in tl],
                    ls="--", label=f"{name} (prompts answered / prompts)")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(title="share of target over the run", xlabel="seconds",
           ylabel="output tokens / target (dashed: prompts)")
    ax.legend(loc="lower right")
    ended = [(name, *_share(s)) for name, s in per.items()]
    drawn = bars.bar([n for n, _, _ in ended], [v for _, v, _ in ended],
                     color=["tab:blue" if of == "target" else "tab:cyan" for _, _, of in ended])
    bars.bar_label(drawn, labels=[f"{100 * v:.1f}% of {of}" for _, v, of in ended], fontsize="small")
    bars.axhline(1.0, color="black", lw=0.8)
    bars.set(title="where each dataset ended", ylabel="output tokens / target (or prompts answered / prompts)")
    fig.tight_layout()
    return fig


def summary_table(summary: dict[str, Any]):
    """The headline figures of one run as a two-column table."""
    import pandas as pd

    run = summary["run"]
    per_m, cheapest_per_m = run["usd_per_m_output"], run["cheapest_eligible_usd_per_m_output"]
    # labels within pandas' display.max_colwidth (50): longer ones are cut in a text view (papermill's log)
    rows = [
        ("stop reason", summary["stop_reason"]),
        ("records (dataset / this run)", f"{summary['records']:,} / {run['recorded']:,}"),
        ("failures (dataset / this run)", f"{summary['failures']:,} / {run['failed']:,}"),
        ("prompts remaining", f"{summary['remaining']:,} of {summary['prompts']:,}"),
        ("output tokens (dataset / target)", f"{summary['output_tokens']:,} / "
                                             f"{summary['target_output_tokens'] or '-'}"),
        ("output tokens this run", f"{run['output_tokens']:,}"),
        ("charged this run (lines settled, batch price)" if run.get("route") == "batch" else
         "charged this run (the account's usage delta)",
         _usd(run.get("charged_usd")) + (f" of ${run['max_spend_usd']:g} cap" if run['max_spend_usd'] else "")),
        ("recorded (what the kept answers cost)", _usd(run.get("recorded_usd"))),
        ("wasted (charged - recorded)", _usd(run.get("wasted_usd"))),
        ("wall time", f"{summary['wall_s']:,.1f} s"),
        ("throughput", f"{run['output_tokens_per_s']:,.0f} output tok/s"),
        ("$/M output charged (run / cheapest eligible)",
         f"{per_m if per_m is not None else '-'} / {cheapest_per_m if cheapest_per_m is not None else '-'}"),
        ("budget mode / concurrency cuts",
         f"{run.get('budget_mode', '-')} / {len(run.get('concurrency_changes', []))}"),
        ("retries", f"{run['retried']:,}"),
    ]
    if timing := run.get("timing"):  # where the wait went: the process before the run, the targets, the last answer
        rows.append(("time: before / last target / last answer", " / ".join(
            "-" if timing.get(k) is None else f"{timing[k]:,.1f} s"
            for k in ("before_start_s", "last_target_s", "slots_end_s"))))
    if killed := run.get("killed_before"):  # streams a killed run left in flight, read back from the service
        late = killed.get("late_usd") or 0.0
        rows.append(("wasted by the killed run before (streams)",
                     f"{_usd(killed['usd'])} over {killed['read']:,} of {killed['streams']:,} streams "
                     f"({killed['cancelled']:,} cancelled at the kill, {killed['unread']:,} not known yet"
                     + (f"; {_usd(late)} of it billed during this run" if late else "") + ")"))
    if run.get("killed_wasted_usd") is not None:  # the killed runs' charge beyond their records, by the account
        rows.append(("wasted by the killed runs before (account)", _usd(run["killed_wasted_usd"])))
    if run.get("account_delta_usd") is not None:  # route batch: the balance's own delta, beside what it charged
        rows.append(("the account's balance delta this run", _usd(run["account_delta_usd"])))
    if run.get("foreign_usd"):  # a killed run's answers ending upstream (named in a journal or not), another spender
        rows.append(("billed during this run, not booked by it", _usd(run["foreign_usd"])))
    if back := run.get("read_back"):  # streams closed without their usage: booked at a bound, then read by id
        rows += [("closed streams, cost read by id",
                  f"{_usd(back['usd'])} over {back['read']:,} of {back['streams']:,}"),
                 ("closed streams, booked at / left to the account",
                  f"{_usd(back['bound_usd'])} / {back['unread']:,} streams")]
    if (cut := run.get("cut_samples")) and cut["records"]:  # streams closed at a target or a Ctrl-C, kept as prefixes
        rows.append(("cut samples (share; median tokens, finished)",
                     f"{cut['records']:,} ({cut['share']:.1%}); {cut['tokens_p10_p50_p90'][1]:,}, "
                     + (f"{cut['finished_tokens_p10_p50_p90'][1]:,}" if cut["finished_tokens_p10_p50_p90"] else "-")))
    tools = run.get("tool_calls") or {}
    if tools.get("answers") or tools.get("mismatched"):  # an agent dataset: how the tool loops went
        rows += [("tool-call turns", f"{tools['answers']:,}"), ("tool calls", f"{tools['calls']:,}"),
                 ("tool-call ids served otherwise, rebuilt", f"{tools['ids_rebuilt']:,}"),
                 ("tool loops ended on a mismatch", f"{tools['mismatched']:,}")]
    return pd.DataFrame(rows, columns=["", "value"]).set_index("")


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x + 0.0:,.4f}"  # + 0.0: a rounded -0.0 prints as $0.0000


def plot_records(stats):
    """What the records say: how answers ended, and output lengths (the run's health is `plot_health`)."""
    fig = _figure(figsize=(14, 3.5))
    finish_ax, length_ax = fig.subplots(1, 2)
    finish = stats["finish_reason"].value_counts() if len(stats) else None
    if finish is not None:
        finish_ax.bar([str(k) for k in finish.index], list(finish.values), color="tab:orange")
        cut = stats["finish_reason"] == CUT  # cut samples stacked apart: how long the prefixes kept are
        length_ax.hist([stats["output_tokens"][~cut], stats["output_tokens"][cut]], bins=40, stacked=True,
                       color=["tab:blue", "tab:orange"], label=["finished", "cut samples"])
        if cut.any():
            length_ax.legend()
    finish_ax.set(title="finish reasons (dataset)", ylabel="records")
    length_ax.set(title="output length (dataset)", xlabel="tokens", ylabel="records")
    fig.tight_layout()
    return fig


# -- the run's health: the live panel's frames and the report's figure ------------------------------------------
@dataclass(frozen=True)
class DatasetShare:
    name: str
    share: float            # output tokens ÷ target, else prompts finished ÷ prompts
    of: str                 # "target" or "prompts"


@dataclass(frozen=True)
class RunHealth:
    """What a person watching a run asks of it: is throughput holding, is spend on the plan's line, which providers
    serve and how, are the datasets advancing together, when does it end and on what."""

    t: float                                  # seconds since the run started
    timeline: list[list[float]]               # samples, TIMELINE_COLUMNS (thinned)
    cap: float | None                         # max_spend_usd
    usable: float | None                      # balance − reserve, as this run counts money (None: unknown)
    planned_usd_per_m: float | None           # the budget plan's spend line
    datasets: list[DatasetShare]
    providers: dict[str, dict[str, Any]]      # name -> ProviderStats.figures() + verdict
    errors: dict[str, int]
    eta_work_s: float | None = None
    eta_money_s: float | None = None
    stop_reason: str | None = None            # None while the run goes
    charged: float = 0.0                      # the last spend point: what the account has charged
    at_bound: float = 0.0                     # the last at-bound point: booked at a bound, not yet read
    streams: int = 0                          # streamed answers in flight
    streamed_tokens: int | None = None        # what they delivered so far, in tokens (this run's tokens per character)

    @classmethod
    def of_snapshot(cls, snap: RunSnapshot) -> RunHealth:
        stats = snap.stats
        providers = {name: {**ps.figures(), "verdict": snap.verdicts.get(name, "")}
                     for name, ps in sorted(stats.by_provider.items())}
        work, money = (None, None) if snap.stop_reason else run_etas(snap)
        return cls(t=snap.t, timeline=thin(stats.timeline), cap=snap.cap,
                   usable=snap.usable if math.isfinite(snap.usable) else None,
                   planned_usd_per_m=snap.planned_usd_per_m,
                   datasets=[DatasetShare(d.name, d.tokens / d.target if d.target else d.share,
                                          "target" if d.target is not None else "prompts") for d in snap.datasets],
                   providers=providers, errors=dict(stats.errors), eta_work_s=work, eta_money_s=money,
                   stop_reason=snap.stop_reason, charged=snap.spent if snap.charged is None else snap.charged,
                   at_bound=snap.at_bound, streams=snap.streams,
                   streamed_tokens=snap.streamed_tokens())

    @classmethod
    def of_summary(cls, summary: dict[str, Any]) -> RunHealth:
        run = summary["run"]
        providers = (summary.get("fidelity") or {}).get("providers") or {}
        verdicts = {n: p.get("verdict", "") for n, p in providers.items()}
        balance = run.get("balance_start_usd")
        shares = [DatasetShare(name, *_share(s)) for name, s in dataset_summaries(summary).items()]
        timeline = _columns(summary.get("timeline") or [], summary.get("timeline_columns") or TIMELINE_COLUMNS)
        cols = TIMELINE_COLUMNS
        t = timeline[-1][cols.index("t_s")] if timeline else summary["wall_s"]  # an idle run: the one it carries
        return cls(t=t, timeline=thin(timeline), cap=run.get("max_spend_usd"),
                   usable=None if balance is None else balance - run["reserve_usd"],
                   planned_usd_per_m=run.get("planned_usd_per_m_output"), datasets=shares,
                   providers={n: {**h, "verdict": verdicts.get(n, "")}
                              for n, h in (run.get("provider_health") or {}).items()},
                   errors=dict(run.get("errors") or {}), stop_reason=summary["stop_reason"],
                   charged=timeline[-1][cols.index("spend_usd")] if timeline else 0.0,
                   at_bound=timeline[-1][cols.index("at_bound_usd")] if timeline else 0.0)

    def column(self, name: str) -> list[float]:
        i = TIMELINE_COLUMNS.index(name)
        return [row[i] for row in self.timeline]

    def headline(self) -> str:
        """One line: where the run stands and when it ends, and on what (targets or money)."""
        charged = f"charged ${self.charged:,.4f}" + (f" (+${self.at_bound:,.4f} {AT_BOUND_LABEL})"
                                                     if round(self.at_bound, 4) > 0 else "")
        if self.stop_reason:
            return f"ended: {self.stop_reason} after {duration(self.t)}, {charged}"
        work, money = self.eta_work_s, self.eta_money_s
        head = f"running {duration(self.t)}, {charged} | "
        if self.streams:  # answers in flight, as far as they have got (tokens: this run's tokens per character)
            head += (f"~{self.streamed_tokens:,} tokens streamed" if self.streamed_tokens is not None else
                     "streaming") + f" by {self.streams:,} in flight | "
        if work is None and money is None:
            return head + "ETA once answers come"
        first = "money" if sooner(work, money)[1] else "targets"
        return head + f"ETA targets {duration(work)}, money {duration(money)}: {first} first"


def _columns(timeline: list[list[float]], cols: list[str]) -> list[list[float]]:
    """A summary's timeline in TIMELINE_COLUMNS: one an earlier version wrote lacks the newer columns (0 there)."""
    if cols == TIMELINE_COLUMNS:
        return timeline
    at = [cols.index(c) if c in cols else None for c in TIMELINE_COLUMNS]
    return [[0 if i is None else row[i] for i in at] for row in timeline]


def rates(t: list[float], tokens: list[float], window_s: float = RATE_WINDOW_S) -> list[float]:
    """Output tokens/s at each sample, over the samples of at least the last `window_s` seconds (from the start
    while the run is younger): a sample taken just after another (the final one) makes no spike."""
    out = []
    for i, (ti, ki) in enumerate(zip(t, tokens)):
        j = bisect.bisect_right(t, ti - window_s, 0, i) - 1
        out.append((ki - tokens[j]) / (ti - t[j]) if j >= 0 else ki / max(ti, window_s))
    return out


def provider_table(health: RunHealth):
    """Per provider: share of answers, answers, median latency (recent), error and 429 rates, fidelity verdict."""
    import pandas as pd

    answers = sum(p["answers"] for p in health.providers.values()) or 1
    rows = [{"provider": NO_PROVIDER_LABEL if name == NO_PROVIDER else name,
             "share_of_answers": round(p["answers"] / answers, 3), "answers": p["answers"],
             "median_latency_s": p["median_latency_s"],
             "error_rate": round(p["errors"] / p["attempts"], 3) if p["attempts"] else None,
             "rate_limited": round(p["rate_limited"] / p["attempts"], 3) if p["attempts"] else None,
             "verdict": p.get("verdict") or ""} for name, p in health.providers.items()]
    return pd.DataFrame(rows, columns=["provider", "share_of_answers", "answers", "median_latency_s", "error_rate",
                                       "rate_limited", "verdict"]).set_index("provider")


def plot_health(health: RunHealth):
    """The run's health in four panels: throughput with requests in flight against the limit; $ charged against
    the cap, balance − reserve and the plan's line; each dataset's share of its target; errors by kind. A
    `matplotlib.figure.Figure` (no pyplot: the live panel draws it off the event loop's thread)."""
    fig = _figure(figsize=(14, 7))
    axes = fig.subplots(2, 2)
    t, tokens = health.column("t_s"), health.column("output_tokens")
    ax = axes[0, 0]
    ax.plot(t, rates(t, tokens), color="tab:blue")
    ax.set(title="throughput and requests in flight", xlabel="seconds", ylabel="output tokens / s")
    twin = ax.twinx()
    twin.plot(t, health.column("in_flight"), color="tab:gray", lw=0.8, label="in flight")
    twin.plot(t, health.column("limit"), color="tab:gray", ls=":", label="allowed")
    twin.set(ylabel="requests")
    twin.legend(loc="lower right")
    ax = axes[0, 1]
    charged, at_bound = health.column("spend_usd"), health.column("at_bound_usd")
    ax.plot(t, charged, color="tab:green", label="charged (the account's usage)")
    if any(at_bound):  # apart: the account has not said what these cost (at most their bound, maybe nothing)
        ax.fill_between(t, charged, [c + b for c, b in zip(charged, at_bound)], color="tab:green", alpha=0.2,
                        lw=0, label=AT_BOUND_LABEL)
    if health.planned_usd_per_m is not None:
        ax.plot(t, [k * health.planned_usd_per_m / 1e6 for k in tokens], color="tab:green", ls="--",
                label="the plan's line (its $ per output token)")
    if health.cap is not None:
        ax.axhline(health.cap, color="tab:red", ls="--", label=f"cap ${health.cap:g}")
    if health.usable is not None:
        shown = max([*ax.get_ylim(), health.cap or 0.0])
        if health.usable <= 5 * shown:  # drawn where it is in sight, else said (a $100 line flattens $0.01)
            ax.axhline(health.usable, color="tab:orange", ls=":", label=f"balance − reserve ${health.usable:,.2f}")
        else:
            ax.plot([], [], " ", label=f"balance − reserve ${health.usable:,.2f} (off the scale)")
    ax.set(title="spend (the account's charge)", xlabel="seconds", ylabel="USD")
    ax.legend(loc="upper left", fontsize="small")
    ax = axes[1, 0]
    names = [d.name for d in health.datasets] or ["none"]
    shares = [d.share for d in health.datasets] or [0.0]
    ax.barh(names, shares, color=["tab:blue" if d.of == "target" else "tab:cyan" for d in health.datasets] or None)
    ax.axvline(1.0, color="black", lw=0.8)
    for y, v in enumerate(shares):
        ax.text(v, y, f" {100 * v:.1f}%", va="center", fontsize="small")
    ax.set(title="datasets: share of target (or of prompts)", xlabel="share")
    ax.invert_yaxis()
    if health.errors:
        axes[1, 1].barh(list(health.errors), list(health.errors.values()), color="tab:red")
    else:  # an empty bar on a -0.04..0.04 axis said nothing: say it
        axes[1, 1].text(0.5, 0.5, "no errors", ha="center", va="center", transform=axes[1, 1].transAxes)
        axes[1, 1].set(xticks=[], yticks=[])
    axes[1, 1].set(title="errors by kind (retried or failed)", xlabel="responses")
    fig.suptitle(health.headline())
    fig.subplots_adjust(left=0.06, right=0.95, bottom=0.08, top=0.9, wspace=0.38, hspace=0.4)  # not tight_layout:
    return fig                                                  # it draws the figure twice, a frame's cost


def tool_loop_note(summary: dict[str, Any]) -> str | None:
    """How this run's tool loops went, in one plain sentence: how many conversations ended on a tool-call mismatch,
    how they missed, and why that ends them. None for a run without tool calls."""
    run = summary["run"]
    tools = run.get("tool_calls") or {}
    if not tools.get("answers") and not tools.get("mismatched"):
        return None
    started = (run.get("by_turn") or {}).get("1", 0)
    n = tools.get("mismatched", 0)
    of = f" of the {started:,} this run started" if started else ""
    if not n:
        return f"Tool loops: no conversation{of} ended on a tool-call mismatch."
    how = "; ".join(f"{k} {MISMATCHES[kind]}" for kind, k in (tools.get("mismatches") or {}).items() if k)
    return (f"Tool loops: {n:,} conversation{'s' if n != 1 else ''}{of} ended on a tool-call mismatch"
            + (f" ({how})" if how else "") + ": the dataset has tool results only for the calls it made, and none "
            "are invented, so such a conversation ends after that turn, which is kept as a sample.")


def environments_table(summary: dict[str, Any]):
    """The rollouts per environment (summary.json's `rollouts`, over every dataset of the run): tasks, how they
    ended, steps per task, calls per step, failed calls by kind, tokens and $; None for a run without tasks."""
    import pandas as pd

    rollouts = summary.get("rollouts")
    if not rollouts:
        return None
    return pd.DataFrame(environment_rows(rollouts)).set_index("environment")


def batches_table(summary: dict[str, Any]):
    """The batch route's rounds (`route: batch`): per batch its dataset, round, status, lines answered and failed,
    what its answers cost and how long it was waited for; None for a realtime run."""
    import pandas as pd

    rows = summary["run"].get("batches")
    if rows is None:
        return None
    cols = ["dataset", "round", "batch_id", "status", "lines", "answered", "failed", "usd", "booked_usd", "waited_s"]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)
