"""files.py: files written around the page cache (`DirectFile`) and atomic replacement."""
from __future__ import annotations

import errno
import os

import pytest

from eagledata import files
from eagledata.files import DirectFile
from tests.helpers.threads import in_new_thread


@pytest.mark.parametrize("refused_at", [None, "open", "write"])
def test_direct_file_holds_exactly_the_bytes_written_whatever_their_alignment(tmp_path, monkeypatch, refused_at):
    import fcntl

    monkeypatch.setattr(files, "STAGING_BYTES", 2 * files.DIRECT_ALIGN)
    direct = getattr(os, "O_DIRECT", 0)
    real_open, real_write = os.open, os.write

    def refusing_open(path, flags, *args):  # tmpfs or FUSE: O_DIRECT refused when the file is opened
        if flags & direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def refusing_write(fd, data):  # a block size larger than DIRECT_ALIGN: refused at the first write
        if fcntl.fcntl(fd, fcntl.F_GETFL) & direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)
    if refused_at == "open":
        monkeypatch.setattr(os, "open", refusing_open)
    elif refused_at == "write":
        monkeypatch.setattr(os, "write", refusing_write)
    data = os.urandom(5 * files.DIRECT_ALIGN + 123)
    sizes = [0, 1, 4095, 4096, 4097, 8192, 8193, len(data)]

    def write_all():
        modes = []
        for n in sizes:
            with DirectFile(tmp_path / f"f{n}") as f:
                for piece in (data[:n // 3], data[n // 3:n]):  # two writes, the first unaligned
                    f.write(piece)
            modes.append(f.direct)
        return modes
    modes = in_new_thread(write_all)
    # direct unless refused (only whole blocks are written directly: a shorter file is never refused at a write)
    assert modes == [bool(direct) and (refused_at is None or refused_at == "write" and n < files.DIRECT_ALIGN)
                     for n in sizes]
    for n in sizes:
        assert (tmp_path / f"f{n}").read_bytes() == data[:n]


def test_direct_files_open_together_in_one_thread_keep_their_own_bytes(tmp_path):
    a, b = os.urandom(10_000), os.urandom(10_000)
    with DirectFile(tmp_path / "a") as fa:
        fa.write(a[:5000])
        with DirectFile(tmp_path / "b") as fb:
            fb.write(b)
        fa.write(a[5000:])
    assert (tmp_path / "a").read_bytes() == a and (tmp_path / "b").read_bytes() == b


def test_a_folder_under_a_file_is_an_input_error_naming_the_file_and_the_setting(tmp_path):
    """Issue 44 bug 7: an output_dir under a file was a raw NotADirectoryError naming neither the file nor the
    setting."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(files.InputError) as e:
        files.make_dir(blocker / "out" / "datasets" / "A", "output_dir")
    assert str(e.value) == (f"field 'output_dir': cannot create the folder {blocker}/out/datasets/A: {blocker} is a "
                            f"file, not a folder")
    with pytest.raises(files.InputError, match=f"^cannot create the folder {blocker}: {blocker} is a file, not a"):
        files.make_dir(blocker)
    with pytest.raises(files.InputError, match=f"^cannot create the folder {blocker}/routing: {blocker} is a file"):
        files.atomic_write_text(blocker / "routing" / "m.yaml", "x")
    assert files.make_dir(tmp_path / "new" / "deep") == tmp_path / "new" / "deep" and (tmp_path / "new").is_dir()
