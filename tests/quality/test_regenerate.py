"""The on-policy arm's records stage reads generate.ipynb's outcome: a regeneration stopped early (Ctrl-C or SIGTERM to
its kernel: generation ends normally, its summary saying `interrupted`) is refused, never taken as an arm whose
unasked turns were "later turns after a cut" (found in the learning curve's run, where 2,562 of 2,862 asks went
missing that way)."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from eagledata.files import write_jsonl
from eagledata.quality.arms import Asks
from eagledata.quality.config import QualityConfig
from eagledata.quality.regenerate import RegenerationProgress, through_generation
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
                   finish_reason="length", output_ids=[5]).to_dict() for i in range(answered)))
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


def append_records(path: Path, ids: range, tokens: int, *, torn: bool = False) -> None:
    with open(path, "a") as f:
        for i in ids:
            f.write(json.dumps({"id": f"r{i}", "output_ids": [7] * tokens}) + "\n")
        if torn:
            f.write('{"id": "half')  # a line still being written


def test_regeneration_progress_counts_whole_lines_and_rates_only_this_run(tmp_path):
    """Resumed with 4 records there: 6 more in 10 s is 0.6 asks/s and 60 tok/s, the ETA over the 30 asks left of
    the 40 at most; a torn last line waits for the next poll; a line that is no record counts, without tokens."""
    records = tmp_path / "records.jsonl"
    append_records(records, range(4), 100)
    now = [1000.0]
    progress = RegenerationProgress(records, 40, clock=lambda: now[0])
    append_records(records, range(4, 10), 100, torn=True)
    now[0] += 10
    assert progress.line() == ("  on_policy regeneration 10s: 10/40 asks at most, 1,000 output tokens, 60 tok/s, "
                               "ETA ≤ 50s")
    with open(records, "a") as f:
        f.write('", "output_ids": [1, 2]}\nnot a record\n[]\n')
    now[0] += 10
    assert progress.line().startswith("  on_policy regeneration 20s: 13/40 asks at most, 1,002 output tokens, 30 tok/s")


def test_the_regeneration_says_its_progress_while_it_runs_and_at_its_end(tmp_path):
    said: list[str] = []

    def slow(params: dict, notebook: Path) -> None:
        generation("completed", 3)(params, notebook)
        time.sleep(0.5)

    through_generation(ASKS, QualityConfig(), tmp_path, tmp_path / "work", serve=serve, generate=slow,
                       say=said.append, progress_s=0.1)
    progress = [line for line in said if line.startswith("  on_policy regeneration ")]
    assert len(progress) >= 3  # every 0.1 s over 0.5 s, and the last
    assert progress[-1].split(": ", 1)[1].startswith("3/6 asks at most, 3 output tokens")
