"""``torch.save`` with resident memory bounded by one write chunk, not by the checkpoint.

The torch writers load their input with ``torch.load(mmap=True)``: every storage is a view of a
private, read-only-in-practice mapping of the input file. ``torch.save`` then hands each storage's
bytes to the file object in one ``write`` call, and every page it reads stays resident: a 1.5 GB
checkpoint re-tied held 1.2 GB. ``save`` gives torch a file object that writes those bytes in
chunks and, after each chunk, tells the kernel the input pages it came from are no longer needed
(``MADV_DONTNEED``). Only addresses inside a mapping of one of the input files are released: such
pages are file-backed and never written (tieaudit modifies no loaded tensor), so a page released
and read again simply faults in from the page cache with the same bytes. Memory of any other kind
(a tensor torch built in memory, a legacy file read whole) is written and left alone.

Linux only (``/proc/self/maps`` and libc's ``madvise``); elsewhere ``save`` writes the same bytes
without releasing anything.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
from collections.abc import Iterable, Sequence
from typing import Any

from tieaudit.repair.st_stream import pwrite_all, start_writeback
from tieaudit.repair.torch_locations import StorageLocations, recorded

CHUNK_BYTES = 16 << 20
"""Bytes written (and input pages released) per step: a bound on what one write holds resident."""

_PAGE = mmap.PAGESIZE


def _libc_madvise() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    function.restype = ctypes.c_int
    return function


_MADVISE = _libc_madvise()


def file_mappings(paths: Iterable[str]) -> list[tuple[int, int]]:
    """[start, end) address ranges of this process's mappings of the files at paths (by device
    and inode, so a link or a renamed file is still recognised); empty where /proc is missing."""
    wanted = set()
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        wanted.add((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino))
    ranges: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 5 or ":" not in fields[3]:
                    continue
                major, minor = (int(part, 16) for part in fields[3].split(":", 1))
                if (major, minor, int(fields[4])) in wanted:
                    start, end = (int(part, 16) for part in fields[0].split("-", 1))
                    ranges.append((start, end))
    except OSError:
        return []
    return ranges


def release(address: int, length: int, mappings: Sequence[tuple[int, int]]) -> None:
    """Give back the pages of [address, address + length) that lie inside one of the file mappings."""
    if _MADVISE is None:
        return
    for start, end in mappings:
        first = max(start, address // _PAGE * _PAGE)
        last = min(end, -(-(address + length) // _PAGE) * _PAGE)
        if last > first:
            _MADVISE(first, last - first, mmap.MADV_DONTNEED)  # a hint: failure changes no data


def release_tensor(tensor: Any, mappings: Sequence[tuple[int, int]]) -> None:
    """Give back the mapped file pages under a torch tensor's storage."""
    storage = tensor.untyped_storage()
    release(storage.data_ptr(), storage.nbytes(), mappings)


class ReleasingFile(io.RawIOBase):
    """A write-only file at fd for torch.save, releasing input pages behind each chunk."""

    def __init__(self, fd: int, mappings: Sequence[tuple[int, int]]) -> None:
        super().__init__()
        self.fd = fd
        self.mappings = tuple(mappings)
        self.offset = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.offset

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = view.nbytes
        if not total:
            return 0
        address = _address(view) if self.mappings else None
        for start in range(0, total, CHUNK_BYTES):
            piece = view[start : start + CHUNK_BYTES]
            pwrite_all(self.fd, piece, self.offset)
            start_writeback(self.fd, self.offset, piece.nbytes)
            self.offset += piece.nbytes
            if address is not None:
                release(address + start, piece.nbytes, self.mappings)
        return total


def _address(view: memoryview) -> int | None:
    """The address of a contiguous buffer (read-only ones included), or None."""
    if not view.c_contiguous:
        return None
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def save(
    torch: Any, root: Any, out: str, *, inputs: Iterable[str], locations: StorageLocations | None = None
) -> None:
    """torch.save(root) to a new file out (it must not exist), releasing pages of the mapped inputs;
    each storage locations noted is recorded where the input recorded it (``torch_locations``)."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with ReleasingFile(fd, file_mappings(inputs)) as handle, recorded(torch, locations):
            torch.save(root, handle)
    finally:
        os.close(fd)
