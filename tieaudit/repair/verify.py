"""Proof before the rename: every original name, read back from the output, equals the input.

Read back twice: by tieaudit's own readers, then by the format's reference loader
(repair.reference), which reads the input too, so that a reader disagreeing with safetensors, onnx
or torch cannot vouch for bytes those libraries would read differently, and no entry the loader
returns from the input (a tensor kind tieaudit only lists, a non-tensor value) is lost unnoticed.
A torch output must also record each storage at the location (``cuda:0``) the input recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import TieauditError
from tieaudit.core.escape import quoted
from tieaudit.core.interrupts import worker_pool
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.formats import open_checkpoint
from tieaudit.graph.compare import BlockComparer
from tieaudit.repair.reference import (
    InputReading,
    ReferenceCheck,
    block_releaser,
    loader_name,
    reference_check,
)
from tieaudit.repair.restore import Source, restored_array, sources

BLOCK_ROWS_BYTES = 16 << 20


_local = threading.local()  # one comparer (two reusable buffers) per verifying thread


class VerificationError(TieauditError):
    """The written output does not reproduce the input; it is discarded."""


def same_values(
    left: np.ndarray,
    right: np.ndarray,
    comparer: BlockComparer,
    *,
    done: Callable[[int, int], None] | None = None,
) -> bool:
    """Bit-for-bit equality of two arrays of one shape, a block of rows at a time; done(first, stop)
    is told each block of rows compared (to give its pages back), so that what stays resident while
    verifying is a block, not the tensor."""
    if left.shape != right.shape or left.dtype.itemsize != right.dtype.itemsize:
        return False
    if left.ndim == 0:
        return comparer.same(left.reshape(1), right.reshape(1))
    row_bytes = max(1, left[0:1].nbytes) if len(left) else 1
    rows = max(1, BLOCK_ROWS_BYTES // row_bytes)
    for first in range(0, len(left), rows):
        if not comparer.same(left[first : first + rows], right[first : first + rows]):
            return False
        if done is not None:
            done(first, min(first + rows, len(left)))
    return True


VERIFY_THREADS = 2


def _problem(
    original: OpenCheckpoint,
    written: OpenCheckpoint,
    tensor: TensorInfo,
    *,
    source: Source | None,
    reference: ReferenceCheck | None,
    as_name: str | None = None,
) -> str | None:
    """What is wrong with one name in the written output: as tieaudit reads it, then as the
    reference loader reads it (None when both give the input bit for bit)."""
    if source is None:
        return f"{tensor.name} is missing from the written output"
    value = restored_array(written, source)
    expected = original.array(tensor)
    if value.dtype != expected.dtype:
        return f"{tensor.name} comes back as {value.dtype}, not {tensor.dtype}"
    comparer = getattr(_local, "comparer", None) or BlockComparer()
    _local.comparer = comparer
    pairs = [(original, tensor, expected)]
    if source.relation in ("stored", "equal") and source.name in written.checkpoint.names:
        pairs.append((written, written.checkpoint.tensor(source.name), value))
    same = same_values(expected, value, comparer, done=block_releaser(pairs))
    _release(written, source.name)
    try:
        if not same:
            return f"{tensor.name} differs from the input after writing"
        # Right after tieaudit's comparison, while the input's pages of this name are still in.
        return None if reference is None else reference.problem(tensor, as_name=as_name)
    finally:
        _release(original, tensor.name)


def verify_output(
    original: OpenCheckpoint,
    out: str,
    *,
    renamed: Mapping[str, str | None] | None = None,
    rewritten: tuple[str, ...] = (),
    input_reading: InputReading,
) -> list[str]:
    """Re-read out; raise VerificationError naming the first name that is missing or differs.
    Returns notes on what could not be done as asked (a reference loader not installed: that side
    was read by tieaudit's own reader only).

    renamed: original names the plan moves (optimizer state renumbered: compared under the new
    name) or discards (None: not compared); rewritten: prefixes under which the plan changes
    non-tensor values on purpose (``RetiePlan.rewritten``); input_reading: the reference loader's
    reading of the input, compared already with tieaudit's (``compare_input``).
    Names are compared by two threads:
    memcmp and the page faults behind it run outside the GIL.
    """
    moves = renamed or {}
    kept = [(t, moves.get(t.name, t.name)) for t in original.checkpoint.tensors]
    with (
        open_checkpoint(out) as written,
        reference_check(original, written.checkpoint, out, input_reading=input_reading) as reference,
    ):
        provided = sources(written.checkpoint)
        with worker_pool(VERIFY_THREADS, "verify") as pool:
            problems = pool.map(
                lambda pair: _problem(
                    original,
                    written,
                    pair[0],
                    source=provided.get(pair[1]),
                    reference=reference,
                    as_name=pair[1],
                ),
                [(t, name) for t, name in kept if name is not None],
            )
            for problem in problems:
                if problem is not None:
                    raise VerificationError(problem, out)
        moved = location_problem(original.checkpoint, written.checkpoint, renamed=moves)
        if moved is not None:
            raise VerificationError(moved, out)
        if reference is None:
            loader = loader_name(written.checkpoint)
            return [f"the output was verified by tieaudit's own reader only: {loader} is not installed"]
        compared = frozenset(t.name for t in original.checkpoint.tensors)
        rest = reference.rest_problem(compared, renamed=moves, rewritten=rewritten)
        if rest is not None:
            raise VerificationError(rest, out)
        return list(reference.notes)


def location_problem(
    original: Checkpoint, written: Checkpoint, *, renamed: Mapping[str, str | None]
) -> str | None:
    """A storage the output records at a location (``cuda:0``, ``cpu``) that none of the input
    storages its names viewed had; None when every one is where it was. Formats that record no
    location ("") are not compared; a re-tied name views its kept tensor's storage, so a storage
    may hold names from storages of several locations, and any of them is where it was."""
    origin = {new: old for old, new in renamed.items() if new is not None}
    before: dict[str, set[str]] = {}
    for tensor in written.tensors:
        name = origin.get(tensor.name, tensor.name if tensor.name not in renamed else None)
        if name is None or name not in original.names:
            continue
        location = original.storages[original.tensor(name).storage_id].location
        if location:
            before.setdefault(tensor.storage_id, set()).add(location)
    for storage_id, locations in before.items():
        after = written.storages[storage_id].location
        if after and after not in locations:
            name = next(t.name for t in written.tensors if t.storage_id == storage_id)
            was = ", ".join(quoted(where) for where in sorted(locations))
            now = quoted(after)
            return f"{quoted(name)} is recorded at {now} in the written output, at {was} in the input"
    return None


def _release(opened: OpenCheckpoint, name: str) -> None:
    """Give back the pages just compared, so verification's memory stays bounded per tensor."""
    tensor = opened.checkpoint.tensor(name)
    opened.release(tensor, *tensor.byte_span())
