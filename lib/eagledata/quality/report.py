"""quality.ipynb's views of the experiment's `summary.json`: the table per drafter, τ per MT-Bench category, vLLM's
count beside ours, τ per turn beside what each arm trained on, the losses per epoch, the plot of τ with its interval
and per-position acceptance, and the conclusion in words, stated from the numbers whichever way they point (the free
baselines' verdict and vLLM's agreement included)."""
from __future__ import annotations

from typing import Any

from .arms import ARMS


def table_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm then per reference drafter: samples, supervised tokens, train seconds, τ and its interval."""
    out = []
    for r in summary["rows"]:
        lo, hi = r["tau_ci95"]
        out.append({"drafter": r["drafter"], "samples": r["samples"], "supervised_tokens": r["supervised_tokens"],
                    "train_s": r["train_seconds"], "questions": r["questions"], "turns": r["turns"], "k": r["k"],
                    "tau_mean": round(r["tau_mean"], 3), "tau_ci95": f"[{lo:.3f}, {hi:.3f}]",
                    "tau_pooled": None if r["tau_pooled"] is None else round(r["tau_pooled"], 3),
                    **{f"accept@{i + 1}": round(a, 3) for i, a in enumerate(r["per_position_acceptance"])}})
    return out


def conclusion(summary: dict[str, Any]) -> str:
    """What was measured, in one paragraph: both arms' τ with intervals, their paired difference (question by
    question, `tau.paired_difference`) and whether its interval excludes zero, and the bounds (the hypothesis,
    on-policy above off-policy, is reported, not assumed)."""
    rows = {r["drafter"]: r for r in summary["rows"]}
    on, off = rows["on_policy"], rows["off_policy"]
    (on_lo, on_hi), (off_lo, off_hi) = on["tau_ci95"], off["tau_ci95"]
    d = summary["difference"]
    lo, hi = d["ci95"]
    if lo > 0:
        verdict = "on-policy is higher: the paired 95 % interval excludes zero"
    elif hi < 0:
        verdict = "off-policy is higher: the paired 95 % interval excludes zero"
    else:
        verdict = "the paired 95 % interval includes zero: at this size no difference between the arms is resolved"
    text = (f"At {summary['supervised_tokens']:,} supervised tokens per arm, τ on {on['questions']} MT-Bench questions "
            f"({on['turns']} turns, k = {on['k']}, greedy): on-policy {on['tau_mean']:.3f} "
            f"[{on_lo:.3f}, {on_hi:.3f}], off-policy {off['tau_mean']:.3f} [{off_lo:.3f}, {off_hi:.3f}]. "
            f"Question by question, on-policy minus off-policy is {d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
            f"(higher on {d['higher']} of {d['questions']} questions, lower on {d['lower']}): {verdict}.")
    bounds = [f"{b} {rows[b]['tau_mean']:.3f}" for b in ("self", "random") if b in rows]
    if bounds:
        text += f" Bounds on {rows[next(b for b in ('self', 'random') if b in rows)]['questions']} questions: " \
                + ", ".join(bounds) + f" (k + 1 = {on['k'] + 1} and ≈ 1 expected)."
    baselines = [f"{b} {rows[b]['tau_mean']:.3f} [{rows[b]['tau_ci95'][0]:.3f}, {rows[b]['tau_ci95'][1]:.3f}]"
                 for b in ("ngram", "eagle3-random") if b in rows]
    if baselines:
        text += " Free baselines on the arms' questions: " + ", ".join(baselines) + "."
    if verdict_said := baseline_verdict(summary):
        text += " " + verdict_said[0].upper() + verdict_said[1:]
    if agreement := vllm_agreement(summary):
        text += " " + agreement
    return text


def vllm_agreement(summary: dict[str, Any]) -> str:
    """vLLM's own count of each arm's checkpoint beside ours, in words ("" when the run did not check it: the
    run fails before a summary when they disagree, so a summary's figures are within the tolerance)."""
    vllm = summary.get("vllm")
    if not vllm:
        return ""
    said = [f"{arm} {row['tau_pooled']['ours']:.4f} ours, {row['tau_pooled']['vllm']:.4f} vLLM's"
            + (f" on {row['questions']} questions" if row.get("questions") else "") for arm, row in vllm.items()]
    return "vLLM's own speculative decoding counts the same pooled acceptance length (within 0.02): " \
        + "; ".join(said) + "."


def vllm_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm: the questions vLLM was asked, pooled τ, verifying steps and output tokens on them, ours and
    vLLM's (empty when not checked)."""
    return [{"arm": arm, "questions": row.get("questions"), "tau_pooled_ours": row["tau_pooled"]["ours"],
             "tau_pooled_vllm": row["tau_pooled"]["vllm"],
             "difference": row["tau_pooled"].get("difference"), "steps_ours": row["verifying_steps"]["ours"],
             "steps_vllm": row["verifying_steps"]["vllm"], "tokens_ours": row["output_tokens"]["ours"],
             "tokens_vllm": row["output_tokens"]["vllm"]} for arm, row in (summary.get("vllm") or {}).items()]


def category_rows(docs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per MT-Bench category, one column per drafter: its questions and τ [95 % interval] there (each
    tau.json's `per_category`, `docs` by drafter name). Where a drafter helps, not only how much overall."""
    cats = sorted({c for doc in docs.values() for c in doc.get("per_category", {})})
    out = []
    for cat in cats:
        row: dict[str, Any] = {"category": cat}
        for name, doc in docs.items():
            got = doc.get("per_category", {}).get(cat)
            if got is None:
                row[name] = None
                continue
            lo, hi = got["tau_ci95"]
            row["questions"] = got["questions"]
            row[name] = f"{got['tau_mean']:.3f} [{lo:.3f}, {hi:.3f}]"
        out.append(row)
    return out


def category_table(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """`category_rows` over summary.json's `per_category` (the drafters measured on the arms' questions)."""
    return category_rows({name: {"per_category": cats} for name, cats in summary.get("per_category", {}).items()})


def baseline_verdict(summary: dict[str, Any], baseline: str = "ngram") -> str:
    """Each trained arm against a drafter any user has for free (prompt lookup): beats it where its τ interval lies
    above the baseline's mean, does not beat it otherwise; "" when the baseline was not measured."""
    rows = {r["drafter"]: r for r in summary["rows"]}
    if baseline not in rows:
        return ""
    base = rows[baseline]["tau_mean"]
    said = []
    for arm in ARMS:
        if arm in rows:
            lo = rows[arm]["tau_ci95"][0]
            said.append(f"{arm} {rows[arm]['tau_mean']:.3f} " + ("beats" if lo > base else "does not beat")
                        + f" {baseline} ({base:.3f})")
    return "; ".join(said) + "."


def _trained_shares(arm: dict[str, Any]) -> dict[str, float]:
    """Each turn's share of the samples the arm trained on (all its samples unless it trained on some)."""
    counts = arm.get("trained_turn_samples")
    if not counts:
        return arm.get("turn_shares", {})
    total = sum(counts.values())
    return {turn: round(n / total, 4) for turn, n in counts.items()}


def turn_table(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """τ pooled per turn number for every drafter measured on the arms' questions, beside each arm's share of turn-1
    and turn-2 training samples (`turn_shares`; of the samples it trained on, `trained_turn_samples`, where a curve's
    size or an ablation trained on some): what a drafter was trained on against what it is measured on. An
    experiment summarized before `per_turn` reached its rows has no row here."""
    arms = {a["arm"]: a for a in summary.get("arms", [])}
    shares_of = {arm: _trained_shares(a) for arm, a in arms.items()}
    questions = next((r["questions"] for r in summary["rows"] if r["drafter"] in ARMS), None)
    out = []
    for r in summary["rows"]:
        if r.get("per_turn") is None or r["questions"] != questions:
            continue
        shares = shares_of.get(r["drafter"], {})
        for turn, t in sorted(r["per_turn"].items(), key=lambda kv: int(kv[0])):
            out.append({"drafter": r["drafter"], "turn": int(turn), "verify_forwards": t["verify_forwards"],
                        "tau_pooled": None if t["tau_pooled"] is None else round(t["tau_pooled"], 3),
                        "trained_share": shares.get(turn)})
    return out


def plot_losses(summary: dict[str, Any], ax: Any = None) -> Any:
    """Training and validation loss per epoch for each arm (validation: the held-out conversations, the same ids in
    both arms, never trained on): the epochs are picked by this curve, not by τ."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    for arm, epochs in summary["epoch_losses"].items():
        xs = [e["epoch"] + 1 for e in epochs or []]
        ax.plot(xs, [e["train_loss"] for e in epochs or []], "-o", label=f"{arm} train")
        ax.plot(xs, [e["validation_loss"] for e in epochs or []], "--o", label=f"{arm} validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.legend()
    return ax


def plot_summary(summary: dict[str, Any], axes: Any = None) -> Any:
    """Left: τ per drafter with its 95 % interval; right: acceptance at each draft position for both arms."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    rows = summary["rows"]
    left, right = axes
    for i, r in enumerate(rows):
        lo, hi = r["tau_ci95"]
        left.errorbar([i], [r["tau_mean"]], yerr=[[r["tau_mean"] - lo], [hi - r["tau_mean"]]], fmt="o", capsize=5)
    left.set_xticks(range(len(rows)), [r["drafter"] for r in rows])
    left.set_ylabel("τ (tokens per verifier forward)")
    left.set_title("τ on MT-Bench, 95 % bootstrap interval over questions")
    for r in rows:
        if r["drafter"] in ARMS:
            acc = r["per_position_acceptance"]
            right.plot(range(1, len(acc) + 1), acc, marker="o", label=r["drafter"])
    right.set_xlabel("draft position")
    right.set_ylabel("share of verifying forwards accepting it")
    right.set_ylim(0, 1)
    right.legend()
    right.set_title("per-position acceptance")
    return axes
