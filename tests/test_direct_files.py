"""Files written around the page cache (`DirectFile`) and SpecForge's torch files written without torch.save."""
from __future__ import annotations

import errno
import io
import os
import threading
import zipfile

import pytest
import torch
from torch.utils.serialization import config

from eagledata import files
from eagledata.files import DirectFile
from eagledata.training.storage import torchzip


def in_new_thread(fn):
    """Run `fn` in a fresh thread (a fresh staging buffer, of the size patched in) and return its result."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


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


def reference(tensors: dict[str, torch.Tensor]) -> bytes:
    """torch.save of the same tensors, each in contiguous storage of its own, with CRC32 off."""
    own = {k: torch.empty(v.shape, dtype=v.dtype).copy_(v) for k, v in tensors.items()}
    buf = io.BytesIO()
    with config.patch({"save.compute_crc32": False}):
        torch.save(own, buf)
    return buf.getvalue()


@pytest.mark.parametrize("staging", [8 << 20, 8192])  # the small buffer splits rows and headers across writes
def test_torchzip_writes_byte_for_byte_what_torch_save_writes(tmp_path, monkeypatch, staging):
    monkeypatch.setattr(files, "STAGING_BYTES", staging)
    cases = []
    for t, h in [(1, 1), (5, 4), (300, 256), (4099, 7), (37, 1000)]:
        states = torch.randn(t, 4, h).to(torch.bfloat16)  # the writer gets views of a batch's [T, 4, H]
        cases.append({"input_ids": torch.arange(t) * 7919, "loss_mask": (torch.arange(t) % 3 > 0).long(),
                      "hidden_state": states[:, 3].unsqueeze(0), "aux_hidden_state": states[:, :3].reshape(1, t, 3 * h)})
    cases.append({"x": torch.randn(3, 5).t(), "y": torch.tensor(2.5), "z": torch.arange(6, dtype=torch.int32)[::2]})

    def write_all():
        for i, tensors in enumerate(cases):
            assert torchzip.fits(tensors)
            with DirectFile(tmp_path / f"c{i}.ckpt") as f:
                torchzip.save(tensors, f)
    in_new_thread(write_all)
    for i, tensors in enumerate(cases):
        path = tmp_path / f"c{i}.ckpt"
        assert path.read_bytes() == reference(tensors)
        back = torch.load(path, weights_only=True, mmap=True)
        assert list(back) == list(tensors) and all(torch.equal(back[k], v) for k, v in tensors.items())
        with zipfile.ZipFile(path) as z:  # a valid zip, every CRC field 0 (torch.load never checks them)
            assert {i.CRC for i in z.infolist()} == {0}


def test_torchzip_leaves_archives_of_4_gib_and_empty_tensors_to_torch_save():
    big = torch.empty(1, dtype=torch.bfloat16).expand(1 << 31)  # 4 GiB of bf16 with no memory behind it
    assert torchzip.fits({"ids": torch.zeros(5, dtype=torch.long), "a": big[: (1 << 31) - (1 << 20)]})
    assert not torchzip.fits({"ids": torch.zeros(5, dtype=torch.long), "a": big})
    assert not torchzip.fits({"ids": torch.zeros(0, dtype=torch.long)})  # miniz writes empty records otherwise


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_speculators_files_are_byte_for_byte_what_safetensors_writes(tmp_path, dtype):
    from safetensors.torch import save

    from eagledata.training.assembly import Sample
    from eagledata.training.storage.speculators import RowFileWriter

    for t, h in [(1, 1), (7, 5), (300, 256)]:
        batch = torch.randn(t + 3, 4, h).to(dtype)
        states = batch[2:2 + t]  # a sample's rows of a batch: a view
        sample = Sample("s", "", list(range(1000, 1000 + t)), [1] * t, False)
        RowFileWriter.save(None, sample, states, tmp_path / "hs.safetensors")
        want = save({"token_ids": torch.tensor(sample.input_ids), "hidden_states": states.clone()})
        assert (tmp_path / "hs.safetensors").read_bytes() == want


def test_direct_files_open_together_in_one_thread_keep_their_own_bytes(tmp_path):
    a, b = os.urandom(10_000), os.urandom(10_000)
    with DirectFile(tmp_path / "a") as fa:
        fa.write(a[:5000])
        with DirectFile(tmp_path / "b") as fb:
            fb.write(b)
        fa.write(a[5000:])
    assert (tmp_path / "a").read_bytes() == a and (tmp_path / "b").read_bytes() == b


def test_specforge_files_of_4_gib_or_more_fall_back_to_torch_save(tmp_path, monkeypatch):
    from eagledata.training.assembly import Sample
    from eagledata.training.storage.specforge import SampleFileWriter, sample_tensors

    states = torch.randn(9, 4, 6).to(torch.bfloat16)[2:7]  # a view of a batch
    sample = Sample("s", "", [5, 6, 7, 8, 9], [0, 1, 1, 1, 1], False)
    SampleFileWriter.save(None, sample, states, tmp_path / "direct.ckpt")
    monkeypatch.setattr(torchzip, "fits", lambda tensors: False)  # as for a 4 GiB sample
    SampleFileWriter.save(None, sample, states, tmp_path / "saved.ckpt")
    # the same bytes either way: each state in storage of its own (not the batch's), CRC32 off
    assert (tmp_path / "saved.ckpt").read_bytes() == (tmp_path / "direct.ckpt").read_bytes() == \
        reference(sample_tensors(sample.input_ids, sample.loss_mask, states))
