"""The run report of generate.ipynb: tables and plots from the run's summary and the records."""
from __future__ import annotations

from typing import Any

from ..files import iter_jsonl
from ..paths import DatasetFiles
from ..records import output_tokens


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
        else:
            done_before = s["run"]["done_before"]
            ax.plot(t, [(done_before + row[cols.index("recorded")]) / max(s["prompts"], 1) for row in tl],
                    ls="--", label=f"{name} (prompts)")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(title="share of target over the run", xlabel="seconds", ylabel="output tokens / target")
    ax.legend(loc="lower right")
    rows = dataset_rows(summary)
    names = [r["dataset"] for r in rows]
    shares = [r["share_of_target"] if r["share_of_target"] is not None else 0.0 for r in rows]
    bars.bar(names, shares, color="tab:blue")
    bars.axhline(1.0, color="black", lw=0.8)
    bars.set(title="where each dataset ended", ylabel="output tokens / target")
    fig.tight_layout()
    return fig


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
