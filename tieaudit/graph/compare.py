"""Byte-level comparison of tensors, in bounded blocks, without materialising a whole tensor.

Equality is byte equality (so +0.0 != -0.0 and NaN payloads must match): a tie is the same
bits, and a tolerance would call a head one optimizer step away equal. Blocks are copied into
two reusable buffers and compared with memcmp (bytearray ==), which runs at memory speed;
pages of a memory-mapped storage are released after each block so resident memory stays
bounded by the block size, not the tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import xxhash

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import cast, itemsize, to_numpy, values
from tieaudit.core.interrupts import worker_pool
from tieaudit.core.records import TensorInfo

BLOCK_BYTES = 16 << 20
TRANSPOSED_BLOCK_BYTES = 64 << 20
"""Bytes of a block of rows a transposed comparison reads at a time (two strips of the other tensor
are held beside it): its strip is read by one pread per row of the other tensor, and wider runs mean
fewer calls (a 2048-column matrix: 32 KiB runs, 0.25 s for 0.8 GB where 16 MiB blocks took 0.35)."""
SAMPLE_COUNT = 16  # enough to tell random matrices apart; exact comparison decides


def _is_contiguous(tensor: TensorInfo) -> bool:
    expected = 1
    for dim, stride in zip(reversed(tensor.shape), reversed(tensor.strides), strict=True):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _rows_per_block(tensor: TensorInfo, block_bytes: int = BLOCK_BYTES) -> int:
    row_bytes = max(1, tensor.nbytes // max(1, tensor.shape[0])) if tensor.shape else tensor.nbytes
    return max(1, block_bytes // max(1, row_bytes))


def _as_rows(array: np.ndarray) -> np.ndarray:
    """A view whose first axis is the one blocks are taken along (1-D and 0-D included)."""
    return array.reshape(1) if array.ndim == 0 else array


def iter_blocks(opened: OpenCheckpoint, tensor: TensorInfo, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, block) along axis 0; releases each block's pages once the caller moves on."""
    array = _as_rows(opened.array(tensor))
    contiguous = _is_contiguous(tensor)
    row_bytes = array[0:1].nbytes if len(array) else 0
    for first in range(0, len(array), rows):
        yield first, array[first : first + rows]
        if contiguous:
            start = tensor.byte_offset + first * row_bytes
            opened.release(tensor, start, start + rows * row_bytes)
    if not contiguous:
        begin, end = tensor.byte_span()
        opened.release(tensor, begin, end)


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    """libc memcmp (4+ GB/s on mapped pages, no copy); None where libc cannot be loaded."""
    try:
        import ctypes

        function = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    function.restype = ctypes.c_int
    return function


TILE = 256
"""Side of the square tiles a transposed comparison works in (256 x 256 x 4 bytes: 256 KiB each)."""
SPLIT_BYTES = 4 << 20
"""A transposed block at least this large is compared by two threads (the second thread costs
about 0.1 ms to start: worth it past a few MiB)."""
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
ROW_PAD_BYTES = 64
"""Bytes a strip's rows are set further apart than their width: a strip of a matrix whose rows are a
power of two bytes long (2048 float32) would otherwise put every row of a tile's column in the
same CPU cache set, and comparing it transposed ran 2-3x slower."""


def padded_rows(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An empty 2-D array of shape whose rows lie ROW_PAD_BYTES further apart than their width."""
    rows, columns = shape
    pad = max(1, ROW_PAD_BYTES // dtype.itemsize)
    return np.empty((rows, columns + pad), dtype=dtype)[:, :columns]


class BlockComparer:
    """Compares equally-sized blocks byte for byte: contiguous blocks in place with memcmp,
    strided ones (transposed views) after a copy into two reusable buffers."""

    def __init__(self) -> None:
        self._left = bytearray()
        self._right = bytearray()
        self._memcmp = _libc_memcmp()

    def _fill(self, buffer: bytearray, block: np.ndarray) -> None:
        target = np.frombuffer(buffer, dtype=block.dtype, count=block.size).reshape(block.shape)
        np.copyto(target, block, casting="no")

    def same(self, left: np.ndarray, right: np.ndarray) -> bool:
        """True when the two blocks hold the same bytes (same shape and item size required)."""
        if left.shape != right.shape or left.dtype.itemsize != right.dtype.itemsize:
            return False
        count = int(left.nbytes)
        if count == 0:
            return True
        if self._memcmp is not None and left.flags.c_contiguous and right.flags.c_contiguous:
            return self._memcmp(left.ctypes.data, right.ctypes.data, count) == 0
        if count > len(self._left):
            self._left = bytearray(count)
            self._right = bytearray(count)
        self._fill(self._left, left)
        self._fill(self._right, right.view(left.dtype) if right.dtype != left.dtype else right)
        if count == len(self._left):
            return self._left == self._right  # bytearray == is memcmp
        return self._left[:count] == self._right[:count]

    def same_transposed(self, block: np.ndarray, strip: np.ndarray) -> bool:
        """True when block (2-D) holds the bytes of strip.T, compared in square tiles small enough
        to stay in the CPU cache: about twice as fast as copying strip.T whole, and no buffer."""
        if (
            block.ndim != 2
            or block.shape != strip.shape[::-1]
            or block.dtype.itemsize != strip.dtype.itemsize
        ):
            return False
        unsigned = _UNSIGNED.get(block.dtype.itemsize)
        if unsigned is None:  # 16-byte items (complex128): no integer type of their width
            return self.same(block, strip.T)
        left, right = block.view(unsigned), strip.view(unsigned)  # bits, not values: -0.0 != 0.0
        rows = left.shape[0]
        if left.nbytes < SPLIT_BYTES or rows < 2 * TILE:
            return _tiles_equal(left, right, 0, stop=rows)
        # numpy compares each tile without the GIL: a second thread takes the lower half's tiles
        half = rows // 2 // TILE * TILE
        with worker_pool(1, "compare") as pool:
            lower = pool.submit(_tiles_equal, left, right, half, stop=rows)
            upper = _tiles_equal(left, right, 0, stop=half)
            return lower.result() and upper


def _tiles_equal(left: np.ndarray, right: np.ndarray, first: int, *, stop: int) -> bool:
    """Rows [first, stop) of left equal to the same columns of right.T, tile by tile."""
    columns = left.shape[1]
    full = np.empty((TILE, TILE), dtype=bool)
    for row in range(first, stop, TILE):
        for column in range(0, columns, TILE):
            a = left[row : min(row + TILE, stop), column : column + TILE]
            b = right[column : column + TILE, row : min(row + TILE, stop)].T
            out = full if a.shape == full.shape else np.empty(a.shape, dtype=bool)
            np.equal(a, b, out=out)
            if not out.all():
                return False
    return True


def equal_bytes(
    opened: OpenCheckpoint,
    first: TensorInfo,
    second: TensorInfo,
    *,
    comparer: BlockComparer,
    other: OpenCheckpoint | None = None,
) -> bool:
    """Same shape, same dtype, same bytes; other: the checkpoint second is in, when not opened's."""
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    rows = _rows_per_block(first)
    blocks = iter_blocks(other or opened, second, rows)
    pairs = zip(iter_blocks(opened, first, rows), blocks, strict=True)
    return all(comparer.same(a, b) for (_, a), (_, b) in pairs)


def transposed_bytes(
    opened: OpenCheckpoint, first: TensorInfo, second: TensorInfo, *, comparer: BlockComparer
) -> bool:
    """second == first.T bit for bit (2-D, same dtype), compared one block of first's rows at a time;
    the column strip of second each block needs is read by a second thread while the block before
    is compared (pread gathers it outside the GIL, numpy compares outside it)."""
    if len(first.shape) != 2 or first.shape != second.shape[::-1] or first.dtype != second.dtype:
        return False
    if first.shape[1] > first.shape[0]:
        # second == first.T exactly when first == second.T: walk the taller one by blocks of rows,
        # so that the column strip each block needs of the other is as wide as can be
        first, second = second, first
    other = opened.array(second)
    begin, end = second.byte_span()
    rows, height = _rows_per_block(first, TRANSPOSED_BLOCK_BYTES), first.shape[0]
    buffers: dict[tuple[int, int], np.ndarray] = {}  # two per strip shape: one read, one compared

    def strip(row: int) -> np.ndarray:
        columns = other[:, row : row + rows]
        if not _is_contiguous(second):
            return columns
        # read with pread, never through the map (see read_runs), into rows set apart (padded_rows)
        slot = (row // rows % 2, columns.shape[1])
        into = buffers.get(slot)
        if into is None:
            into = buffers[slot] = padded_rows(columns.shape, columns.dtype)
        start = second.byte_offset + row * other.strides[1]
        read = opened.store.read_runs(opened.storage(second), start, stride=other.strides[0], into=into)
        return into if read else columns

    with worker_pool(1, "strips") as pool:
        coming = pool.submit(strip, 0)
        for row, block in iter_blocks(opened, first, rows):
            columns = coming.result()
            if row + rows < height:
                coming = pool.submit(strip, row + rows)  # read while this block is compared
            same = comparer.same_transposed(block, columns)
            opened.release(second, begin, end)  # whatever the map faulted in for this strip
            if not same:
                return False
    return True


def cast_bytes(
    opened: OpenCheckpoint, wide: TensorInfo, narrow: TensorInfo, *, comparer: BlockComparer
) -> bool:
    """narrow == wide cast to narrow's dtype (round to nearest even, as torch's .to() does)."""
    if wide.shape != narrow.shape or itemsize(wide.dtype) <= itemsize(narrow.dtype):
        return False
    rows = _rows_per_block(wide)
    pairs = zip(iter_blocks(opened, wide, rows), iter_blocks(opened, narrow, rows), strict=True)
    # a value out of the narrow type's range casts to inf (or NaN): not equal
    return all(comparer.same(cast(a, wide.dtype, narrow.dtype), b) for (_, a), (_, b) in pairs)


def full_hash(opened: OpenCheckpoint, tensor: TensorInfo) -> bytes:
    """xxh3-128 of the tensor's bytes in row-major order."""
    hasher = xxhash.xxh3_128()
    for _, block in iter_blocks(opened, tensor, _rows_per_block(tensor)):
        hasher.update(np.ascontiguousarray(block).view(np.uint8).data)
    return hasher.digest()


def sample_positions(shape: tuple[int, ...], count: int = SAMPLE_COUNT) -> tuple[np.ndarray, ...]:
    """A fixed, spread-out set of multi-indices into shape (same shape -> same positions)."""
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    flat = np.unique((np.arange(count, dtype=np.int64) * 2654435761 + 7) % max(1, numel))
    return tuple(np.unravel_index(flat, shape)) if shape else ()


def sample(opened: OpenCheckpoint, tensor: TensorInfo, transposed: bool = False) -> np.ndarray:
    """Sampled elements; with transposed, sampled at the positions of the transposed shape."""
    if not tensor.shape:
        return opened.array(tensor).reshape(1).copy()
    if transposed:
        rows, cols = sample_positions(tensor.shape[::-1])
        index: tuple[np.ndarray, ...] = (cols, rows)
    else:
        index = sample_positions(tensor.shape)
    size = itemsize(tensor.dtype)
    element = sum((i * s for i, s in zip(index, tensor.strides, strict=True)), np.zeros(1, np.int64))
    offsets = (tensor.byte_offset + element * size).tolist()
    data = opened.store.gather(opened.storage(tensor), offsets, size)
    return np.frombuffer(data, dtype=to_numpy(tensor.dtype))


def is_constant(opened: OpenCheckpoint, tensor: TensorInfo) -> bool:
    """Every element has the same bytes (LayerNorm ones, zero biases, zero-initialised LoRA B)."""
    array = _as_rows(opened.array(tensor))
    if array.size == 0:
        return True
    size = array.dtype.itemsize
    first = np.ascontiguousarray(array[(slice(0, 1),) * array.ndim]).view(np.uint8).reshape(1, size)

    def uniform(block: np.ndarray) -> bool:
        return bool((np.ascontiguousarray(block).view(np.uint8).reshape(-1, size) == first).all())

    return all(uniform(block) for _, block in iter_blocks(opened, tensor, _rows_per_block(tensor)))


def difference(opened: OpenCheckpoint, first: TensorInfo, second: TensorInfo) -> tuple[float, float]:
    """(max absolute difference, fraction of elements whose bytes differ) of two same-shape tensors."""
    rows = _rows_per_block(first)
    worst = 0.0
    differing = 0
    for (_, left), (_, right) in zip(
        iter_blocks(opened, first, rows), iter_blocks(opened, second, rows), strict=True
    ):
        # complex128 holds every dtype's values (a complex tensor's too, without ComplexWarning);
        # overflow and inf - inf are part of the answer, not warnings.
        wide = np.complex128 if np.iscomplexobj(left) else np.float64
        with np.errstate(all="ignore"):
            delta = np.abs(values(left, first.dtype).astype(wide) - values(right, second.dtype).astype(wide))
        if delta.size:
            worst = max(worst, float(np.nanmax(delta)) if not np.isnan(delta).all() else worst)
        same = np.ascontiguousarray(left).view(np.uint8).reshape(left.size, -1) == np.ascontiguousarray(
            right
        ).view(np.uint8).reshape(right.size, -1)
        differing += int((~same.all(axis=1)).sum())
    return worst, differing / max(1, first.numel)
