"""The second reading of retie's output: the format's reference loader, not tieaudit's readers.

Where a tieaudit reader disagreed with the library people load the file with, retie would vouch
for bytes nobody else reads, so the staged output is read again by the reference loader, where it
is installed: ``safetensors.safe_open(framework="numpy")`` (files and Hugging Face shards),
``onnx.load`` plus each tensor's external data, ``torch.load(weights_only=True, mmap=True)`` for
.pt and a folder's .bin files (torch is imported for those only). Every original name is compared
with the input bit for bit, a block of rows at a time (memory bounded by a block for safetensors
and .pt, by one tensor for ONNX); a name restored from a record (``{dropped: kept}`` metadata, the
shard index, ``tieaudit.ties``, ONNX Identity aliases) is compared after applying it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import to_numpy
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.graph.compare import BlockComparer
from tieaudit.repair.reference_loaders import Block, Loaded, ReferenceMismatch, load_reference, numpy_float8
from tieaudit.repair.restore import Source, sources

__all__ = ["ReferenceCheck", "ReferenceMismatch", "reference_check"]

REFERENCE_BLOCK_BYTES = 2 << 20
"""Bytes read per block: small blocks stay in the CPU cache between the read and the comparison."""

_local = threading.local()  # one comparer (two reusable buffers) per verifying thread


def _rows_per_block(tensor: TensorInfo) -> int:
    if not tensor.shape:
        return 1
    row = max(1, tensor.nbytes // max(1, tensor.shape[0]))
    return max(1, REFERENCE_BLOCK_BYTES // row)


def _value_block(block: Block, source: Source, first: int, *, stop: int, ndim: int) -> np.ndarray:
    """Rows first:stop of a name's values, from the loader's stored tensor and the record."""
    if ndim == 0:
        value = block(())
    elif source.relation == "transposed":
        value = block((slice(None), slice(first, stop))).T
    else:
        value = block((slice(first, stop),))
    if source.relation == "cast" and source.dtype is not None:
        value = value.astype(to_numpy(source.dtype))
    return value


class ReferenceCheck:
    """The reference loader's reading of one output, compared with the input name by name.

    ``problem`` may run in several threads at once (each opens what it reads). It leaves the
    input's pages to the caller, who compares the same name with tieaudit's reading first.
    """

    def __init__(self, original: OpenCheckpoint, loaded: Loaded, found: dict[str, Source]) -> None:
        self._original = original
        self._loaded = loaded
        self._found = found

    def problem(self, tensor: TensorInfo, *, as_name: str | None = None) -> str | None:
        """What the reference loader reads differently for one original name (None: bit for bit
        equal); as_name: the name the output holds it under (optimizer state renumbered by retie)."""
        name = printable(tensor.name)
        source = self._found.get(as_name or tensor.name)
        if source is not None and source.relation == "beside":
            return None  # a Trainer folder's optimizer.pt and the like: copied as they are
        if source is None:
            return f"{name} is missing when the reference loader reads the output"
        dtype, shape = self._loaded.dtype_shape(source.name)
        if source.relation == "transposed":
            shape = shape[::-1]
        if source.relation == "cast":
            dtype = source.dtype or dtype
        if (dtype, shape) != (tensor.dtype, tensor.shape):
            return (
                f"{name} reads back as {printable(dtype)} {list(shape)} with the reference loader, "
                f"not {tensor.dtype} {list(tensor.shape)}"
            )
        if tensor.numel == 0:
            return None  # no bytes: the dtype and shape are all there is
        expected = self._original.array(tensor)
        comparer = getattr(_local, "comparer", None) or BlockComparer()
        _local.comparer = comparer
        rows = _rows_per_block(tensor)
        release = block_releaser([(self._original, tensor, expected)])
        with self._loaded.values(source.name) as block:
            for first in range(0, len(expected), rows) if expected.ndim else [0]:
                want = expected[first : first + rows] if expected.ndim else expected.reshape(1)
                value = _value_block(block, source, first, stop=first + len(want), ndim=expected.ndim)
                value = value.reshape(want.shape) if value.size == want.size else value
                if not comparer.same(want, value):
                    return f"{name} differs from the input when the reference loader reads the output"
                if expected.ndim:  # the input's pages of this block, read again here, go back too
                    release(first, first + len(want))
        return None


def block_releaser(
    pairs: list[tuple[OpenCheckpoint, TensorInfo, np.ndarray]],
) -> Callable[[int, int], None]:
    """Called after each block of rows is compared (verify.same_values, ReferenceCheck.problem):
    rows [first, stop) of each contiguous array given back to the kernel (a view that is not one
    contiguous run of its storage keeps its pages until the tensor is done)."""

    def release(first: int, stop: int) -> None:
        for opened, tensor, array in pairs:
            if array.flags.c_contiguous and array.ndim and tensor.nbytes == array.nbytes:
                start = tensor.byte_span()[0]
                row = array[0:1].nbytes
                opened.release(tensor, start + first * row, start + stop * row)

    return release


def training_files_tensors(ckpt: Checkpoint) -> frozenset[str]:
    """A Trainer folder's names from its training files (optimizer.pt, ...): the weights' reference
    loader does not read them; retie copies those files byte for byte."""
    layout = ckpt.training
    if ckpt.format != "hf-dir" or layout is None:
        return frozenset()
    files = {p.path for p in layout.parts if p.role != "model"}
    return frozenset(t.name for t in ckpt.tensors if t.file in files)


@contextmanager
def reference_check(
    original: OpenCheckpoint, written: Checkpoint, out: str
) -> Iterator[ReferenceCheck | None]:
    """The reference loader's reading of out (None where the loader is not installed), checked to
    hold the tensors tieaudit's reading holds; ReferenceMismatch when the loader refuses it."""
    try:
        loaded = load_reference(out, written)
    except ReferenceMismatch as exc:
        raise ReferenceMismatch(exc.message, out) from exc
    if loaded is None:
        yield None
        return
    beside = training_files_tensors(written)
    if written.format != "torch" and loaded.names != written.names - beside:
        differ = ", ".join(printable(n) for n in sorted(loaded.names ^ (written.names - beside))[:3])
        raise ReferenceMismatch(f"the reference loader and tieaudit see different tensors ({differ})", out)
    found = {name: Source(name, "stored") for name in loaded.names}
    found.update((name, Source(name, "beside")) for name in beside)
    if written.format == "onnx":  # Identity aliases and the tieaudit.ties record, read from the graph
        found.update((name, s) for name, s in sources(written).items() if name not in found)
    for name, source in loaded.ties().items():
        found.setdefault(name, source)
    with numpy_float8():
        yield ReferenceCheck(original, loaded, found)
