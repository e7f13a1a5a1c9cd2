"""A dict of tensors written as `torch.save` writes it (without the zip's CRC32), straight from the tensors'
memory into a `DirectFile`, byte for byte what `torch.save` gives (tests compare the two).

Why not `torch.save`: per 0.5 MB sample file it costs ~0.4 ms of Python (a pickler class made per call, the zip
writer's set-up) plus a copy of every tensor into storage of its own (a view would save its whole base), and it
writes through the page cache. Here the pickle is tiny, the records' constant parts come from one `torch.save`
of a small template (so they follow the installed torch), and each tensor is copied once, into the staging
buffer, whatever its strides.

The layout is PyTorchStreamWriter's (caffe2/serialize/inline_container.cc over miniz): per record a local header
with sizes deferred to a data descriptor, an "FB" extra field padding the data to the storage alignment, then a
central directory, a zip64 end record and locator, and the end record. Archives of 4 GiB or more (zip64 sizes
per record) and empty tensors are left to `torch.save`: `fits` says when.
"""
from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import torch

from ...files import DirectFile
from .common import write_tensor

ARCHIVE = "archive"  # the name torch.save gives a file object's archive
LOCAL = struct.Struct("<IHHHHHIIIHH")
DESCRIPTOR = struct.Struct("<IIII")
CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
ZIP64_END = struct.Struct("<IQHHIIQQQQ")
ZIP64_LOCATOR = struct.Struct("<IIQI")
END = struct.Struct("<IHHHHIIH")
FLAGS = 0x0808  # sizes in a data descriptor; UTF-8 names
LIMIT = 0xFFFFFFFF


@dataclass(frozen=True)
class Template:
    """What a `torch.save` of n tensors writes around them, as this torch writes it."""

    alignment: int
    before: tuple[tuple[str, bytes], ...]  # records between data.pkl and data/0
    after: tuple[tuple[str, bytes], ...]  # records after the last tensor


@lru_cache(maxsize=8)
def template(n: int) -> Template:
    """From `torch.save` of n one-element tensors (CRC off): the records it writes besides the pickle and the
    tensors. The serialization id among them hashes the record names only, once CRC32 is off."""
    from torch.utils.serialization import config

    buf = io.BytesIO()
    # `patch` is added when torch installs its config modules (install_config_module): no stub has it
    with config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        torch.save({str(i): torch.zeros(1) for i in range(n)}, buf)
    records = read_records(buf.getvalue())
    names = [name for name, _ in records]
    first, last = names.index("data/0"), names.index(f"data/{n - 1}")
    alignment = int(dict(records)[".storage_alignment"])
    return Template(alignment, tuple(records[1:first]), tuple(records[last + 1:]))


def read_records(data: bytes) -> list[tuple[str, bytes]]:
    """(name without the archive prefix, bytes) of each record of a torch zip, in order (zipfile lists them;
    its readers would check the CRC fields, here 0)."""
    out = []
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        *_, name_len, extra_len = LOCAL.unpack_from(data, info.header_offset)
        start = info.header_offset + LOCAL.size + name_len + extra_len
        out.append((info.filename.split("/", 1)[1], data[start:start + info.file_size]))
    return out


class _Storage:
    def __init__(self, key: str, dtype: torch.dtype, numel: int):
        self.key, self.numel = key, numel
        self.kind = getattr(torch, torch.storage._dtype_to_storage_type_map()[dtype])


class _Tensor:
    """Pickles as `Tensor.__reduce_ex__` does for a contiguous CPU tensor with its own storage."""

    def __init__(self, storage: _Storage, shape: tuple[int, ...]):
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        strides, step = [], 1
        for n in reversed(self.shape):
            strides.append(step)
            step *= n
        # new tuples each time: torch's pickle memoizes none of them across tensors
        return torch._utils._rebuild_tensor_v2, (self.storage, 0, tuple(self.shape), tuple(reversed(strides)),
                                                 False, OrderedDict())


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", obj.kind, obj.key, "cpu", obj.numel)
        return None


def pickled(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """data.pkl of `torch.save(dict(tensors))` (protocol 2), storages numbered in order."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump({name: _Tensor(_Storage(str(i), t.dtype, t.numel()), tuple(t.shape))
                                    for i, (name, t) in enumerate(tensors.items())})
    return buf.getvalue()


def fits(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether this writer can: below zip64 sizes (4 GiB, with a generous bound on headers and padding), and no
    empty tensor (miniz writes an empty record without a data descriptor)."""
    data = sum(t.numel() * t.element_size() for t in tensors.values())
    return data + (len(tensors) + 16) * 1024 < LIMIT and all(t.numel() for t in tensors.values())


def save(tensors: Mapping[str, torch.Tensor], out: DirectFile) -> None:
    """Write `dict(tensors)` as `torch.save` would (CRC32 off); views are written as their own contiguous data."""
    tpl = template(len(tensors))
    records: list[tuple[str, int, int]] = []  # name, local header offset, size

    def record(name: str, data: bytes | None, size: int, tensor: torch.Tensor | None = None) -> None:
        full = f"{ARCHIVE}/{name}".encode()
        start = out.size + LOCAL.size + len(full) + 4
        pad = -start % tpl.alignment
        records.append((full.decode(), out.size, size))
        out.write(LOCAL.pack(0x04034B50, 0, FLAGS, 0, 0, 0, 0, 0, 0, len(full), pad + 4) + full + b"FB" +
                  struct.pack("<H", pad) + b"Z" * pad)
        if tensor is None:
            assert data is not None, "a record is its bytes or a tensor"
            out.write(data)
        else:
            write_tensor(out, tensor)
        out.write(DESCRIPTOR.pack(0x08074B50, 0, size, size))

    data_pkl = pickled(tensors)
    record("data.pkl", data_pkl, len(data_pkl))
    for name, data in tpl.before:
        record(name, data, len(data))
    for i, t in enumerate(tensors.values()):
        record(f"data/{i}", None, t.numel() * t.element_size(), t)
    for name, data in tpl.after:
        record(name, data, len(data))
    directory_at = out.size
    for name, offset, size in records:
        full = name.encode()
        out.write(CENTRAL.pack(0x02014B50, 0, 0, FLAGS, 0, 0, 0, 0, size, size, len(full), 0, 0, 0, 0, 0, offset)
                  + full)
    directory_size, end_at, n = out.size - directory_at, out.size, len(records)
    out.write(ZIP64_END.pack(0x06064B50, ZIP64_END.size - 12, 0x031E, 0x2D, 0, 0, n, n, directory_size, directory_at)
              + ZIP64_LOCATOR.pack(0x07064B50, 0, end_at, 1)
              + END.pack(0x06054B50, 0, 0, n, n, directory_size, directory_at, 0))
