"""The on-policy arm's records stage reads generate.ipynb's outcome: a regeneration stopped early (Ctrl-C or SIGTERM to
its kernel: generation ends normally, its summary saying `interrupted`) is refused, never taken as an arm whose
unasked turns were "later turns after a cut" (found in the learning curve's run, where 2,562 of 2,862 asks went
missing that way)."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from eagledata.files import write_jsonl
from eagledata.quality.arms import Asks
from eagledata.quality.config import QualityConfig
from eagledata.quality.regenerate import through_generation
from eagledata.records import Record

ASKS = [Asks(f"c{i}", [[{"role": "user", "content": f"q{i}.{j}"}] for j in (1, 2)], ["a", "b"]) for i in range(3)]


@contextmanager
def serve(config, verifier, log):
    yield "http://127.0.0.1:9/v1"


def generation(stop_reason: str | None, answered: int):
    """generate.ipynb's stand-in: `answered` records and a summary as generation writes them (None: no summary)."""
    def run(params: dict, notebook: Path) -> None:
        folder = Path(params["output_dir"]) / "datasets" / "on_policy"
        folder.mkdir(parents=True)
        write_jsonl(folder / "records.jsonl", (
            Record(id=f"c{i}", dataset="on_policy", messages=ASKS[i].asks[0], reasoning="", content="x",
                   finish_reason="length").to_dict() for i in range(answered)))
        if stop_reason is not None:
            (folder / "summary.json").write_text(json.dumps({"stop_reason": stop_reason, "records": answered,
                                                             "remaining": 3 - answered}))
    return run


def regenerate(tmp_path: Path, stop_reason: str | None, answered: int):
    return through_generation(ASKS, QualityConfig(), tmp_path, tmp_path / "work", serve=serve,
                              generate=generation(stop_reason, answered), say=lambda _: None)


def test_a_completed_regeneration_counts_what_it_did_not_ask(tmp_path):
    made = regenerate(tmp_path, "completed", 3)  # each first answer cut: the second turns are not asked
    assert [r.id for r in made.records] == ["c0", "c1", "c2"]
    assert made.dropped == {"not asked: a later turn after a cut or failed one": 3}


@pytest.mark.parametrize("stop_reason", ["interrupted", "all_failed", "no_endpoints"])
def test_a_regeneration_stopped_early_is_refused(tmp_path, stop_reason):
    with pytest.raises(RuntimeError, match=f"stopped '{stop_reason}' with 2 prompts remaining .*summary.json"):
        regenerate(tmp_path, stop_reason, 1)


def test_a_regeneration_without_a_summary_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="left no .*summary.json"):
        regenerate(tmp_path, None, 3)
