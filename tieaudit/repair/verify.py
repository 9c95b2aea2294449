"""Proof before the rename: every original name, read back from the output, equals the input."""

from __future__ import annotations

import numpy as np

from tieaudit.compare import BlockComparer
from tieaudit.errors import TieauditError
from tieaudit.formats import open_checkpoint
from tieaudit.model import Checkpoint
from tieaudit.repair.restore import restored_array, sources

BLOCK_ROWS_BYTES = 16 << 20


class VerificationError(TieauditError):
    """The written output does not reproduce the input; it is discarded."""


def same_values(left: np.ndarray, right: np.ndarray, comparer: BlockComparer) -> bool:
    """Bit-for-bit equality of two arrays of one shape, a block of rows at a time."""
    if left.shape != right.shape or left.dtype.itemsize != right.dtype.itemsize:
        return False
    if left.ndim == 0:
        return comparer.same(left.reshape(1), right.reshape(1))
    row_bytes = max(1, left[0:1].nbytes) if len(left) else 1
    rows = max(1, BLOCK_ROWS_BYTES // row_bytes)
    return all(comparer.same(left[i : i + rows], right[i : i + rows]) for i in range(0, len(left), rows))


def verify_output(original: Checkpoint, out: str) -> None:
    """Re-read out; raise VerificationError naming the first name that is missing or differs."""
    with open_checkpoint(out) as written:
        provided = sources(written)
        comparer = BlockComparer()
        for tensor in original.tensors:
            source = provided.get(tensor.name)
            if source is None:
                raise VerificationError(f"{tensor.name} is missing from the written output", out)
            value = restored_array(written, source)
            if value.dtype != original.array(tensor).dtype:
                raise VerificationError(f"{tensor.name} comes back as {value.dtype}, not {tensor.dtype}", out)
            if not same_values(original.array(tensor), value, comparer):
                raise VerificationError(f"{tensor.name} differs from the input after writing", out)
            _release(original, tensor.name)
            _release(written, source.name)


def _release(ckpt: Checkpoint, name: str) -> None:
    """Give back the pages just compared, so verification's memory stays bounded per tensor."""
    tensor = ckpt.tensor(name)
    begin, end = tensor.byte_span()
    ckpt.store.drop(ckpt.storages[tensor.storage_id], begin, end)
