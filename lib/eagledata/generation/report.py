"""The run report of generate.ipynb: tables and plots from summary.json and records.jsonl."""
from __future__ import annotations

from typing import Any

from ..files import iter_jsonl
from ..layout import DatasetFiles
from ..records import output_tokens


def record_stats(files: DatasetFiles):
    """One row per record (no ids or text): provider, finish reason, token counts, cost."""
    import pandas as pd

    rows = []
    if files.records.is_file():
        for _, r in iter_jsonl(files.records, tolerate_torn_tail=True):
            u = r.get("usage") or {}
            rows.append({"provider": r.get("provider") or "?", "finish_reason": r.get("finish_reason"),
                         "output_tokens": output_tokens(u.get("completion_tokens"), r.get("output_ids")),
                         "prompt_tokens": len(r.get("prompt_ids") or []),
                         "reasoning_tokens": u.get("reasoning_tokens") or 0, "cost": u.get("cost")})
    return pd.DataFrame(rows, columns=["provider", "finish_reason", "output_tokens", "prompt_tokens",
                                       "reasoning_tokens", "cost"])


def summary_table(summary: dict[str, Any]):
    """The headline figures of one run as a two-column table."""
    import pandas as pd

    run = summary["run"]
    rows = [
        ("stop reason", summary["stop_reason"]),
        ("records (dataset / this run)", f"{summary['records']:,} / {run['recorded']:,}"),
        ("failures (dataset / this run)", f"{summary['failures']:,} / {run['failed']:,}"),
        ("prompts remaining", f"{summary['remaining']:,} of {summary['prompts']:,}"),
        ("output tokens (dataset / target)", f"{summary['output_tokens']:,} / "
                                             f"{summary['target_output_tokens'] or '-'}"),
        ("output tokens this run", f"{run['output_tokens']:,}"),
        ("charged this run (the account's usage delta)",
         _usd(run.get("charged_usd")) + (f" of ${run['max_spend_usd']:g} cap" if run['max_spend_usd'] else "")),
        ("recorded (cost of the kept answers) / wasted (charged - recorded)",
         f"{_usd(run.get('recorded_usd'))} / {_usd(run.get('wasted_usd'))}"),
        ("wall time", f"{summary['wall_s']:,.1f} s"),
        ("throughput", f"{run['output_tokens_per_s']:,.0f} output tok/s"),
        ("$ per M output on charged (run / cheapest eligible)",
         f"{run['usd_per_m_output'] if run['usd_per_m_output'] is not None else '-'} / "
         f"{run['cheapest_eligible_usd_per_m_output'] if run['cheapest_eligible_usd_per_m_output'] is not None else '-'}"),
        ("budget mode / concurrency cuts", f"{run.get('budget_mode', '-')} / {len(run.get('concurrency_changes', []))}"),
        ("retries", f"{run['retried']:,}"),
    ]
    return pd.DataFrame(rows, columns=["", "value"]).set_index("")


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.4f}"


def plot_run(summary: dict[str, Any], stats):
    """Throughput and spend over time, provider mix, finish reasons, output lengths, error classes."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    cols = summary["timeline_columns"]
    tl = summary["timeline"]
    t = [row[cols.index("t_s")] for row in tl]
    tokens = [row[cols.index("output_tokens")] for row in tl]
    spend = [row[cols.index("spend_usd")] for row in tl]
    rate = [0.0] + [(b - a) / max(tb - ta, 1e-9) for a, b, ta, tb in zip(tokens, tokens[1:], t, t[1:])]
    ax = axes[0, 0]
    ax.plot(t, rate, color="tab:blue")
    ax.set(title="throughput and requests in flight", xlabel="seconds", ylabel="output tokens / s")
    if "limit" in cols:
        twin = ax.twinx()
        twin.plot(t, [row[cols.index("in_flight")] for row in tl], color="tab:gray", lw=0.8, label="in flight")
        twin.plot(t, [row[cols.index("limit")] for row in tl], color="tab:gray", ls=":", label="allowed")
        twin.set(ylabel="requests")
        twin.legend(loc="lower right")
    ax = axes[0, 1]
    ax.plot(t, spend, color="tab:green")
    cap = summary["run"]["max_spend_usd"]
    if cap:
        ax.axhline(cap, color="tab:red", ls="--", label=f"cap ${cap:g}")
        ax.legend()
    ax.set(title="spend (the books, reconciled with the account)", xlabel="seconds", ylabel="USD")
    providers = summary["run"]["providers"] or {"none": 0}
    axes[0, 2].barh(list(providers), list(providers.values()), color="tab:purple")
    axes[0, 2].set(title="provider mix (this run)", xlabel="records")
    finish = summary["run"]["finish_reasons"] or {"none": 0}
    axes[1, 0].bar(list(finish), list(finish.values()), color="tab:orange")
    axes[1, 0].set(title="finish reasons (this run)", ylabel="records")
    if len(stats):
        axes[1, 1].hist(stats["output_tokens"], bins=40, color="tab:blue")
    axes[1, 1].set(title="output length (dataset)", xlabel="tokens", ylabel="records")
    errors = summary["run"]["errors"] or {"none": 0}
    axes[1, 2].barh(list(errors), list(errors.values()), color="tab:red")
    axes[1, 2].set(title="error classes (retried or failed)", xlabel="responses")
    fig.tight_layout()
    return fig
