"""Wheels fetched once: two fetchers at the same time download once; a folder of the wheel is extracted once and
whole."""
from __future__ import annotations

import threading
import time
import zipfile

import pytest

from eagledata.wheels import MissingPackage, extract_once, fetch_wheel


def test_two_fetchers_at_once_download_once(tmp_path):
    """The lock: without it both threads miss the cache and both download (plant it by removing `_locked`)."""
    downloads = []

    def slow_download(requirement, dest):
        downloads.append(requirement)
        time.sleep(0.3)
        with zipfile.ZipFile(dest / "demo_pkg-1.0-py3-none-any.whl", "w") as z:
            z.writestr("demo_pkg/__init__.py", "")

    found = []
    threads = [threading.Thread(target=lambda: found.append(fetch_wheel("demo-pkg==1.0", tmp_path, slow_download)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert downloads == ["demo-pkg==1.0"] and found == [tmp_path / "demo_pkg-1.0-py3-none-any.whl"] * 2


def test_a_folder_of_the_wheel_is_extracted_once(tmp_path):
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/code/a.py", "A = 1\n")
        z.writestr("pkg/code/sub/b.py", "B = 2\n")
        z.writestr("pkg/data.json", "{}")
    dest = extract_once(wheel, "pkg/code/", tmp_path / "out")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.py")) == ["pkg/code/a.py", "pkg/code/sub/b.py"]
    assert not (dest / "pkg" / "data.json").exists()
    (dest / "pkg" / "code" / "a.py").write_text("A = 'kept'\n")
    assert extract_once(wheel, "pkg/code/", dest) == dest  # there already: left as it is
    assert (dest / "pkg" / "code" / "a.py").read_text() == "A = 'kept'\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left
    with pytest.raises(MissingPackage, match="the wheel has no nothing/"):
        extract_once(wheel, "nothing/", tmp_path / "other")
