"""Hidden-state files as the trainers read them, written around the page cache (training/storage/): SpecForge's
torch files written without torch.save, speculators' safetensors, and the fallback to torch.save."""
from __future__ import annotations

import io
import zipfile

import pytest
import torch
from torch.utils.serialization import config

from eagledata import files
from eagledata.files import DirectFile
from eagledata.training.storage import torchzip
from tests.helpers.threads import in_new_thread


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
                      "hidden_state": states[:, 3].unsqueeze(0),
                      "aux_hidden_state": states[:, :3].reshape(1, t, 3 * h)})
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
