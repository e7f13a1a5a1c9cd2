"""The text stage's notebook settings: tokenizer.ipynb's (`TokenizerReportConfig`).

The rule (lib/eagledata/README.md): a notebook's settings class lives in `config.py` of the package that owns its
stage; its parameters cell is made from these fields, and the domain modules (`roundtrip.validate`, `load_truth`)
take the values they need as arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..defaults import shared
from ..settings import Settings, setting


@dataclass(kw_only=True)
class TokenizerReportConfig(Settings):
    """Every setting of tokenizer.ipynb (its parameters cell is made from these fields)."""

    tokenizer: str | None = shared("tokenizer")
    records: str | None = setting(None, "a records.jsonl to validate; None -> the built-in sample set")
    truth: str | None = setting(None, "optional JSONL of true output ids ({id or generation_id, output_ids})")
    limit: int | None = shared("limit", "validate at most this many records")
    fail_on_mismatch: bool = setting(True, "raise in the verdict cell when a reconstruction defect is found")
