"""Stream-write a safetensors file tensor by tensor, never holding more than one chunk in memory.

The header (8-byte little-endian length + JSON, padded with spaces to a multiple of 8, as the
reference implementation pads it) is built from metadata alone; each tensor's bytes are then
copied from the input's read-only views in bounded chunks, so memory stays at one chunk
whatever the checkpoint's size.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import UnsupportedFormatError
from tieaudit.core.interrupts import worker_pool
from tieaudit.core.records import TensorInfo
from tieaudit.formats.safetensors import SAFETENSORS_DTYPES

WRITER_THREADS = 2
CHUNK_BYTES = 64 << 20
"""Bytes copied per write: large enough to run at copy speed, small enough to bound memory."""

DTYPE_CODES: dict[str, str] = {canonical: code for code, canonical in SAFETENSORS_DTYPES.items()}
"""Canonical dtype name -> safetensors dtype code (F32, BF16, ...)."""


def header_bytes(tensors: Sequence[TensorInfo], metadata: Mapping[str, str]) -> bytes:
    """The 8-byte length and the padded JSON header for tensors stored back to back in order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": DTYPE_CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def byte_chunks(array: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """The array's elements in row-major order as byte chunks of at most about chunk_bytes.

    A contiguous view is sliced in place (no copy); a strided one is copied a block of rows
    at a time, which only other formats' inputs can need (safetensors views are contiguous).
    """
    if array.size == 0:
        return
    if array.flags.c_contiguous:
        flat = array.reshape(-1).view(np.uint8).data
        for start in range(0, len(flat), chunk_bytes):
            yield flat[start : start + chunk_bytes]
        return
    row_bytes = array[0:1].nbytes
    rows = max(1, chunk_bytes // max(1, row_bytes))
    for start in range(0, len(array), rows):
        block = np.ascontiguousarray(array[start : start + rows])
        yield block.reshape(-1).view(np.uint8).data


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux sync_file_range, or None (other systems, or no libc to load)."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the range's dirty pages; do not wait


def start_writeback(fd: int, offset: int, count: int) -> None:
    """Let the disk start on bytes just written, so the fsync before the rename finds less to do."""
    if _SYNC_FILE_RANGE is not None and count > 0:
        _SYNC_FILE_RANGE(fd, offset, count, _SYNC_FILE_RANGE_WRITE)  # a hint: failure changes nothing


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of data at offset: pwrite may write less (a disk close to full), never silently."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view, offset = view[written:], offset + written


def write_tensor(fd: int, offset: int, opened: OpenCheckpoint, *, tensor: TensorInfo) -> int:
    """Write one tensor's bytes at offset of fd; returns the bytes written.

    A contiguous file-backed tensor is copied inside the kernel (copy_file_range); anything else
    goes through bounded chunks, releasing the input pages behind it.
    """
    array = opened.array(tensor)
    storage = opened.storage(tensor)
    start, end = tensor.byte_span()
    contiguous = bool(array.flags.c_contiguous)
    if (
        contiguous
        and end - start == tensor.nbytes
        and opened.store.copy_to(storage, start, end, out_fd=fd, out_offset=offset)
    ):
        start_writeback(fd, offset, tensor.nbytes)
        return tensor.nbytes
    written = 0
    for chunk in byte_chunks(array.reshape(1) if array.ndim == 0 else array):
        pwrite_all(fd, chunk, offset + written)
        if contiguous:  # bound resident memory to about one chunk: these pages were only read
            opened.release(tensor, start + written, start + written + len(chunk))
        written += len(chunk)
    opened.release(tensor, start, end)
    start_writeback(fd, offset, written)
    return written


def write_safetensors(
    path: str, opened: OpenCheckpoint, tensors: Sequence[TensorInfo], *, metadata: Mapping[str, str]
) -> None:
    """Create path (it must not exist) holding tensors, in this order, with their bytes from opened.

    Every tensor's place is known from the header, so tensors are written at their offsets by two
    threads (the copies run in the kernel or in numpy/memcpy, outside the GIL).
    """
    unknown = sorted({t.dtype for t in tensors} - set(DTYPE_CODES))
    if unknown:
        raise UnsupportedFormatError(f"safetensors cannot store dtypes {unknown}", path)
    header = header_bytes(tensors, metadata)
    offsets = list(itertools.accumulate((t.nbytes for t in tensors), initial=len(header)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, header, 0)
        with worker_pool(WRITER_THREADS, "write") as pool:  # all workers end before fd closes
            jobs = [
                pool.submit(write_tensor, fd, offset, opened=opened, tensor=t)
                for offset, t in zip(offsets[:-1], tensors, strict=True)
            ]
            for tensor, job in zip(tensors, jobs, strict=True):
                if job.result() != tensor.nbytes:
                    raise RuntimeError(f"{tensor.name}: wrote {job.result()} bytes, expected {tensor.nbytes}")
        os.ftruncate(fd, offsets[-1])  # a last empty tensor still fixes the file's length
    finally:
        os.close(fd)
