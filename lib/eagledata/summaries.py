"""Generation's `summary.json` as the other stages read it: the one parser of its schema (docs/FORMATS.md,
`summary.json`), pure but for `read_summary`.

Generation writes the file (a dataset's and the run's; the `fidelity` section by
`generation/conversations/fidelity.py`);
generation reads its suspects back (`fidelity.suspects_in`, for the routing file) and training's assembly reads
them to leave the suspects' records out. Kept free of every stage (json and `InputError` only), as `records.py` is
for records, so that either can import it cheaply.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import InputError

CONSISTENT, SUSPECT = "consistent", "suspect"
VERDICTS = (CONSISTENT, SUSPECT)  # the verdicts `fidelity.providers.<provider>.verdict` may hold


def read_summary(path: str | Path) -> dict[str, Any]:
    """A summary.json as a dict: not JSON, or not a JSON object, is an `InputError` naming the file (and line)."""
    path = Path(path)
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"not JSON: {e.msg}", path, e.lineno) from None
    if not isinstance(summary, dict):
        raise InputError("expected a JSON object", path)
    return summary


def fidelity_suspects(summary: Any, path: str | Path = "summary.json") -> dict[str, str]:
    """{provider: evidence} for the providers a summary's `fidelity` section calls `suspect`, in its order (pure;
    `path` only names the file in errors). The evidence is the text generation wrote, "" when it gave none. No
    `fidelity` (an older run) or no providers judged yet: none. A verdict that is neither of `VERDICTS`, or a
    section that is not shaped as generation writes it, is an `InputError` naming the field."""
    if not isinstance(summary, Mapping):
        raise InputError("expected a JSON object", path)
    fidelity = summary.get("fidelity")
    if fidelity is None:
        return {}
    providers = fidelity.get("providers", {}) if isinstance(fidelity, Mapping) else None  # {}: nothing judged yet
    if not isinstance(providers, Mapping):
        raise InputError("expected an object of providers", path, field="fidelity.providers")
    out = {}
    for name, doc in providers.items():
        verdict = doc.get("verdict") if isinstance(doc, Mapping) else None
        if verdict not in VERDICTS:
            raise InputError(f"verdict {verdict!r}, expected one of {VERDICTS}", path,
                             field=f"fidelity.providers.{name}.verdict")
        if verdict == SUSPECT:
            out[str(name)] = str(doc.get("evidence") or "")
    return out
