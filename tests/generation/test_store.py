import json
import signal
import subprocess
import sys

import pytest

from eagledata.generation.conversations.store import Store, StoreLocked
from eagledata.paths import DatasetFiles
from eagledata.records import Record, load_records


def rec(i: int) -> Record:
    return Record(id=f"p{i}", dataset="B1", messages=[{"role": "user", "content": "q"}], reasoning="r",
                  content=f"c{i}", finish_reason="stop",
                  prompt_ids=[1, 2], output_ids=[3, 163607, 4, 163586])


def test_append_resume_and_failures(tmp_path):
    with Store.open(tmp_path) as s:
        for i in range(5):
            s.add_record(rec(i))
        s.add_failure("p9", {"status": 400, "message": "context too long"}, attempts=1)
        with pytest.raises(ValueError, match="already finished"):
            s.add_record(rec(2))
    with Store.open(tmp_path) as s:
        assert s.done == {"p0", "p1", "p2", "p3", "p4", "p9"} and (s.recorded, s.failed) == (5, 1)
    assert [r.id for r in load_records(DatasetFiles(tmp_path).records)] == [f"p{i}" for i in range(5)]


def test_torn_tail_is_cut_and_kept_aside(tmp_path):
    with Store.open(tmp_path) as s:
        s.add_record(rec(0))
        s.add_record(rec(1))
    whole = (DatasetFiles(tmp_path).records).read_bytes()
    (DatasetFiles(tmp_path).records).write_bytes(whole + rec(2).to_json().encode()[:25])  # killed mid-write
    with Store.open(tmp_path) as s:
        assert s.done == {"p0", "p1"} and s.torn_bytes == 25
        s.add_record(rec(2))
    assert [r.id for r in load_records(DatasetFiles(tmp_path).records)] == ["p0", "p1", "p2"]
    assert (tmp_path / "records.jsonl.torn").read_bytes().startswith(b'{"id":"p2"')


def test_index_missing_or_behind_is_rebuilt(tmp_path):
    with Store.open(tmp_path) as s:
        for i in range(3):
            s.add_record(rec(i))
    lines = (DatasetFiles(tmp_path).done_index).read_text().splitlines()
    (DatasetFiles(tmp_path).done_index).write_text(lines[0] + "\n")  # killed between record and index writes
    with Store.open(tmp_path) as s:
        assert s.done == {"p0", "p1", "p2"}
    assert len((DatasetFiles(tmp_path).done_index).read_text().splitlines()) == 3
    (DatasetFiles(tmp_path).done_index).unlink()
    with Store.open(tmp_path) as s:
        assert s.recorded == 3


def test_second_writer_is_refused(tmp_path):
    with Store.open(tmp_path):
        with pytest.raises(StoreLocked, match="another run .* refusing to interleave"):
            Store.open(tmp_path)
    Store.open(tmp_path).close()  # released on close


# A writer whose file-size limit (RLIMIT_FSIZE) is below the new summary's size is stopped by the kernel partway
# through writing it, with nothing in the library patched: killed by SIGXFSZ (a crash mid-write: no cleanup runs),
# or, with SIGXFSZ ignored (Python's own default), its write fails with EFBIG (an error mid-write).
WRITE_CUT_SHORT = """
import resource, signal, sys
from eagledata.generation.conversations.store import Store
if sys.argv[2] == "killed":
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
with Store.open(sys.argv[1]) as s:
    s.write_summary({"stop_reason": "done"})
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    s.write_summary({"stop_reason": "budget", "pad": "x" * 100_000})
print("the write was not cut", flush=True)
"""


@pytest.mark.parametrize("cut", ["killed", "error"])
def test_summary_is_replaced_atomically(tmp_path, cut):
    """A writer killed (or failing) while it replaces summary.json leaves the old summary whole, and the next
    writer replaces it; a plain truncate-and-write would leave an empty or half-written file."""
    done = subprocess.run([sys.executable, "-c", WRITE_CUT_SHORT, str(tmp_path), cut], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    if cut == "killed":
        assert done.returncode == -signal.SIGXFSZ, (done.returncode, done.stdout, done.stderr[-2000:])
    else:
        assert done.returncode == 1 and "File too large" in done.stderr, (done.returncode, done.stderr[-2000:])
        assert sorted(p.name for p in tmp_path.iterdir() if "summary" in p.name) == ["summary.json"]  # no temp
    assert json.loads((tmp_path / "summary.json").read_text()) == {"stop_reason": "done"}
    with Store.open(tmp_path) as s:  # the cut writer's lock went with it
        assert s.read_summary() == {"stop_reason": "done"}
        s.write_summary({"stop_reason": "budget"})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"stop_reason": "budget"}
