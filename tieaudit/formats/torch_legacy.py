"""torch.save's legacy stream (torch < 1.6, or ``_use_new_zipfile_serialization=False``).

The file is five pickles (magic number, protocol version, system info, the object, the storage
key list) followed, per listed key, by an 8-byte element count and the storage's raw bytes. torch
reads it with the same weights_only unpickler as a zip's data.pkl (``torch.serialization.
_legacy_load``), after first trying the file as the older tar format, which weights_only refuses.
"""

from __future__ import annotations

import reprlib
import struct
import tarfile

from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.core.escape import printable
from tieaudit.formats.pickle_budget import PickleBudget
from tieaudit.formats.pickle_vm import Truncated
from tieaudit.formats.torch_checkpoint import LocateStorage
from tieaudit.formats.torch_pickle import MAX_PICKLE_BYTES, Layout, Referenced, load_pickle, truncated_error
from tieaudit.formats.torch_records import StorageRef
from tieaudit.formats.zip_archive import pread

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
FIRST_WINDOW = 64 << 10
"""Bytes read for a pickle at first; a longer pickle is read again with a window 8 times larger."""
MAX_HEADER_PICKLE_BYTES = 64 << 10
"""The magic number, protocol version and system info pickles: about 130 bytes together in every
legacy file torch wrote."""


def _is_tar(fd: int) -> bool:
    """Whether tarfile (as torch's _legacy_load opens it first) takes the file for a tar archive."""
    block = pread(fd, tarfile.BLOCKSIZE, 0)
    if len(block) < tarfile.BLOCKSIZE:
        return False
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError):
        return False
    return True


def _load_at(
    fd: int,
    start: int,
    size: int,
    *,
    path: str,
    what: str,
    layout: Layout = "plain",
    limit: int = MAX_PICKLE_BYTES,
    referenced: Referenced,
    budget: PickleBudget,
) -> tuple[object, dict[str, StorageRef], int]:
    """The pickle starting at byte start (at most limit bytes), read through a growing window. A
    retry with a larger window is charged again: what the shorter one cost was spent."""
    window = min(FIRST_WINDOW, limit)
    while True:
        data = pread(fd, min(window, size - start, limit), start)
        try:
            root, storages, end = load_pickle(
                data, path, what, layout=layout, referenced=referenced, budget=budget
            )
        except Truncated:
            if start + len(data) >= size:
                raise truncated_error(what, path) from None
            if len(data) >= limit:
                raise InputError(f"{what} is larger than {limit} bytes", path) from None
            window *= 8
            continue
        return root, storages, start + end


def _shown(value: object) -> str:
    return printable(reprlib.repr(value))


def read_legacy(
    fd: int, size: int, path: str, *, referenced: Referenced, budget: PickleBudget
) -> tuple[object, dict[str, StorageRef], LocateStorage]:
    """The object pickle's root, its storages, and where each storage's bytes are in the file."""
    if _is_tar(fd):
        raise UnsupportedFormatError(
            "the file is also a tar archive, which torch.load reads as the pre-1.0 tar format and "
            "refuses with weights_only",
            path,
        )
    header = MAX_HEADER_PICKLE_BYTES
    def load(
        position: int, what: str, *, layout: Layout = "plain", limit: int = MAX_PICKLE_BYTES
    ) -> tuple[object, dict[str, StorageRef], int]:
        return _load_at(
            fd, position, size, path=path, what=what, layout=layout, limit=limit, referenced=referenced,
            budget=budget,
        )  # fmt: skip

    magic, _, position = load(0, "the magic number", limit=header)
    version, _, position = load(position, "the protocol version", limit=header)
    if magic != MAGIC_NUMBER or version != PROTOCOL_VERSION:
        raise InputError(f"not a legacy torch file (magic {_shown(magic)}, protocol {_shown(version)})", path)
    sys_info, _, position = load(position, "the system info", limit=header)
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise UnsupportedFormatError("big-endian (or unmarked) legacy checkpoints are not supported", path)
    root, storages, position = load(position, "the object pickle", layout="legacy")
    keys, _, position = load(position, "the storage key list")
    offsets = _offsets(fd, size, position, keys=keys, storages=storages, path=path)

    def locate(ref: StorageRef) -> int:
        if ref.key not in offsets:
            raise InputError(
                f"storage {printable(ref.key[:40])!r} is referenced but its bytes are not in the file", path
            )
        return offsets[ref.key]

    return root, storages, locate


def _offsets(
    fd: int, size: int, position: int, *, keys: object, storages: dict[str, StorageRef], path: str
) -> dict[str, int]:
    if type(keys) is not list or not all(type(key) is str for key in keys) or len(set(keys)) != len(keys):
        raise InputError("the storage key list is not a list of distinct strings", path)
    offsets: dict[str, int] = {}
    for key in keys:
        ref = storages.get(key)
        shown = printable(key[:40])
        if ref is None:
            raise InputError(f"storage key {shown!r} is listed but no tensor refers to it", path)
        prefix = pread(fd, 8, position)
        numel = struct.unpack("<q", prefix)[0] if len(prefix) == 8 else -1
        if numel != ref.numel:
            raise InputError(
                f"storage {shown!r} at byte {position}: size {numel}, expected {ref.numel}", path
            )
        offsets[key] = position + 8
        position += 8 + ref.nbytes  # past the bytes without reading them
        if position > size:
            raise InputError(
                f"truncated: storage {shown!r} runs to byte {position}, the file has {size}", path
            )
    return offsets
