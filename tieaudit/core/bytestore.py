"""Read-only access to storage bytes: memory maps of files, or buffers already in memory.

``OpenCheckpoint`` pairs a reader's records with the ``ByteStore`` that owns the open maps; it is the
only object that holds open files, and it closes them (use it as a context manager).
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from tieaudit.core.dtypes import itemsize, to_numpy
from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.records import Checkpoint, StorageInfo, TensorInfo


def _close_map(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:
        pass  # a caller still holds a view; the map closes when that view is released


class ByteStore:
    """Hands out read-only memoryviews of storages; maps each file once, lazily."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._opening = threading.Lock()
        """Held while a file is mapped or opened: verification and writing read one store from two
        threads, and two maps of one file would leave the first one's pages unreleasable (``drop``
        advises the map it finds, so a tensor read through the other stayed resident, 1 GB of it)."""
        self._maps: dict[str, mmap.mmap] = {}
        self._fds: dict[str, int] = {}
        self._memory: dict[str, bytes] = {}
        self._pins: dict[str, tuple[int, int]] = {}
        """File -> the (device, inode) a reader checked it as: what opening it must find."""

    def pin(self, file: str, identity: tuple[int, int]) -> None:
        """Read file only if opening it finds identity, with one link: the file a reader checked
        by path (ONNX external data), not one swapped in or hard-linked after the check."""
        self._pins[file] = identity

    def _check_opened(self, file: str, fd: int, path: str) -> None:
        pinned = self._pins.get(file)
        if pinned is None:
            return
        status = os.fstat(fd)
        if (status.st_dev, status.st_ino) != pinned:
            raise UnsafeInputError("was replaced after it was checked; nothing was read from it", path)
        if status.st_nlink > 1:
            raise UnsafeInputError(
                f"has {status.st_nlink} hard links (made after it was checked); nothing was read from it",
                path,
            )

    def hold(self, storage_id: str, data: bytes) -> None:
        """Keep bytes that live in memory (e.g. ONNX data embedded in the protobuf)."""
        self._memory[storage_id] = data

    def _map(self, file: str) -> mmap.mmap:
        mapped = self._maps.get(file)
        if mapped is not None:
            return mapped
        with self._opening:
            return self._maps.get(file) or self._new_map(file)

    def _new_map(self, file: str) -> mmap.mmap:
        path = os.path.join(self.root, file)
        try:
            with open(path, "rb") as handle:
                self._check_opened(file, handle.fileno(), path)
                if os.fstat(handle.fileno()).st_size == 0:
                    raise InputError("file is empty", path)
                mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:  # the file was only stat-ed by the reader: now it must open
            raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
        self._maps[file] = mapped
        return mapped

    def buffer(self, storage: StorageInfo) -> memoryview:
        """The storage's bytes, read-only and zero-copy."""
        if storage.storage_id in self._memory:
            return memoryview(self._memory[storage.storage_id])
        if storage.nbytes == 0:
            return memoryview(b"")
        mapped = self._map(storage.file)
        end = storage.file_offset + storage.nbytes
        if storage.file_offset < 0 or end > len(mapped):
            raise InputError(
                f"storage {storage.storage_id} needs bytes {storage.file_offset}..{end} "
                f"but the file has {len(mapped)}",
                os.path.join(self.root, storage.file),
            )
        return memoryview(mapped)[storage.file_offset : end]

    def _fd(self, file: str) -> int:
        fd = self._fds.get(file)
        if fd is not None:
            return fd
        with self._opening:  # two threads must not open it twice (one descriptor would leak)
            fd = self._fds.get(file)
            if fd is None:
                path = os.path.join(self.root, file)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError as exc:
                    raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
                try:
                    self._check_opened(file, fd, path)
                except InputError:
                    os.close(fd)
                    raise
                self._fds[file] = fd
            return fd

    def copy_to(self, storage: StorageInfo, start: int, end: int, *, out_fd: int, out_offset: int) -> bool:
        """Copy storage bytes [start, end) into out_fd at out_offset inside the kernel
        (copy_file_range: no mapping, no user-space copy). False when not possible here
        (bytes held in memory, or the file systems refuse); the caller then copies itself."""
        if storage.storage_id in self._memory or not hasattr(os, "copy_file_range"):
            return False
        source = self._fd(storage.file)
        position, remaining = storage.file_offset + start, end - start
        try:
            while remaining > 0:
                copied = os.copy_file_range(source, out_fd, remaining, position, out_offset)
                if copied == 0:
                    raise InputError(f"storage {storage.storage_id} is cut short", storage.file)
                position, out_offset, remaining = position + copied, out_offset + copied, remaining - copied
        except OSError:
            if remaining != end - start:
                raise  # part was copied: a real I/O error, not an unsupported call
            return False
        return True

    def gather(self, storage: StorageInfo, offsets: list[int], size: int) -> bytes:
        """size bytes at each offset of the storage, concatenated.

        For a few dozen scattered elements pread beats the mapping: a touch through the map
        can fault in a whole large folio per element, a pread copies just the element.
        """
        if storage.storage_id in self._memory or storage.nbytes == 0:
            data = self.buffer(storage)
            return b"".join(bytes(data[o : o + size]) for o in offsets)
        fd = self._fd(storage.file)
        chunks = [os.pread(fd, size, storage.file_offset + offset) for offset in offsets]
        if any(len(chunk) != size for chunk in chunks):
            raise InputError(
                f"storage {storage.storage_id} is cut short", os.path.join(self.root, storage.file)
            )
        return b"".join(chunks)

    def read_runs(self, storage: StorageInfo, start: int, *, stride: int, into: np.ndarray) -> bool:
        """Fill into (2-D, each row contiguous; rows may lie further apart than their width) row by
        row with runs of storage bytes: row i from start + i * stride. Read with pread, so no page
        of the mapping is touched: a column strip of a matrix read through the map would fault in
        a whole page-cache folio per row. False when the storage is held in memory (read the map
        then)."""
        if storage.storage_id in self._memory or into.ndim != 2 or into.strides[1] != into.itemsize:
            return False
        runs, width = into.shape[0], into.shape[1] * into.itemsize
        if runs and start + (runs - 1) * stride + width > storage.nbytes:
            raise ValueError(f"runs past the end of storage {storage.storage_id}")
        fd = self._fd(storage.file)
        for run in range(runs):
            if os.preadv(fd, [into[run]], storage.file_offset + start + run * stride) != width:
                raise InputError(
                    f"storage {storage.storage_id} is cut short", os.path.join(self.root, storage.file)
                )
        return True

    def drop(self, storage: StorageInfo, start: int, end: int) -> None:
        """Let the kernel reclaim pages of storage bytes [start, end) that were read.

        The mapping is read-only and file-backed, so dropped pages simply fault in again
        from the page cache if read later: this bounds resident memory, never changes data.
        """
        mapped = self._maps.get(storage.file)
        if mapped is None or storage.storage_id in self._memory:
            return
        page = mmap.PAGESIZE
        first = (storage.file_offset + start) // page * page
        last = min(len(mapped), storage.file_offset + end)
        if last > first:
            mapped.madvise(mmap.MADV_DONTNEED, first, last - first)

    def close(self) -> None:
        """Unmap every file (views still alive keep their map until released)."""
        for mapped in self._maps.values():
            _close_map(mapped)
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._memory.clear()


class OpenCheckpoint:
    """A checkpoint's records and the open memory maps its tensor bytes come from."""

    def __init__(self, checkpoint: Checkpoint, store: ByteStore) -> None:
        self.checkpoint = checkpoint
        """What the reader found (metadata only; outlives this object)."""
        self.store = store
        """The open maps and file descriptors; closed by ``close``."""

    def storage(self, tensor: TensorInfo) -> StorageInfo:
        """The storage tensor views."""
        return self.checkpoint.storages[tensor.storage_id]

    def array(self, tensor: TensorInfo) -> np.ndarray:
        """A read-only, zero-copy numpy view of the tensor's elements."""
        size = itemsize(tensor.dtype)
        return np.ndarray(
            shape=tensor.shape,
            dtype=to_numpy(tensor.dtype),
            buffer=self.store.buffer(self.storage(tensor)),
            offset=tensor.byte_offset,
            strides=tuple(s * size for s in tensor.strides),
        )

    def release(self, tensor: TensorInfo, start: int, end: int) -> None:
        """Let the kernel reclaim the pages of bytes [start, end) of tensor's storage (see drop)."""
        self.store.drop(self.storage(tensor), start, end)

    def close(self) -> None:
        """Release the memory maps."""
        self.store.close()

    def __enter__(self) -> OpenCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
