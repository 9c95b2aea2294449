"""The second reading of retie's output: the format's reference loader, not tieaudit's readers.

Where a tieaudit reader disagreed with the library people load the file with, retie would vouch
for bytes nobody else reads, so the staged output is read again by the reference loader, where it
is installed: ``safetensors.safe_open(framework="numpy")`` (files and Hugging Face shards),
``onnx.load`` plus each tensor's external data, ``torch.load(weights_only=True, mmap=True)`` for
.pt and a folder's .bin files (torch is imported for those only). The input is read by its own
reference loader as well, so that what is compared is the loaders' reading of the input against
their reading of the output, not tieaudit's reading: every original name is compared bit for bit,
a block of rows at a time (memory bounded by a block for safetensors and .pt, by one tensor for
ONNX), with tieaudit's reading of the input and the loader's; a name restored from a record
(``{dropped: kept}`` metadata, the shard index, ``tieaudit.ties``, ONNX Identity aliases) is
compared after applying it; then every other entry the loader returns from the input (a tensor kind
tieaudit only lists, a non-tensor value) must be in the output, equal, unless the plan drops or
renames it on purpose. A loader that is not installed is named in a note: that side was read by
tieaudit's own reader only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import cast
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.formats.hf_dir import torch_weights
from tieaudit.graph.compare import BlockComparer
from tieaudit.repair.reference_loaders import Block, Loaded, ReferenceMismatch, load_reference, numpy_float8
from tieaudit.repair.restore import Source, sources

__all__ = [
    "InputReading",
    "ReferenceCheck",
    "ReferenceMismatch",
    "compare_input",
    "reference_check",
]

REFERENCE_BLOCK_BYTES = 2 << 20
"""Bytes read per block: small blocks stay in the CPU cache between the read and the comparison."""

_local = threading.local()  # one comparer (two reusable buffers) per verifying thread


def _rows_per_block(tensor: TensorInfo) -> int:
    if not tensor.shape:
        return 1
    row = max(1, tensor.nbytes // max(1, tensor.shape[0]))
    return max(1, REFERENCE_BLOCK_BYTES // row)


def _value_block(block: Block, source: Source, first: int, *, stop: int, ndim: int, of: str) -> np.ndarray:
    """Rows first:stop of a name's values, from the loader's stored tensor (of dtype of) and the
    record."""
    if ndim == 0:
        value = block(())
    elif source.relation == "transposed":
        value = block((slice(None), slice(first, stop))).T
    else:
        value = block((slice(first, stop),))
    if source.relation == "cast" and source.dtype is not None:
        value = cast(value, of, source.dtype)
    return value


def _row_blocks(expected: np.ndarray, rows: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """(first, stop, rows first:stop of expected) a block at a time (a 0-d array: one block)."""
    if not expected.ndim:
        yield 0, 1, expected.reshape(1)
        return
    for first in range(0, len(expected), rows):
        want = expected[first : first + rows]
        yield first, first + len(want), want


@dataclass(frozen=True)
class InputReading:
    """The reference loader's reading of the input, already compared tensor by tensor with
    tieaudit's (``compare_input``); loaded is None where that loader is not installed."""

    loaded: Loaded | None


def compare_input(original: OpenCheckpoint) -> InputReading:
    """The reference loader's reading of the input, every tensor it reads compared with tieaudit's
    reading bit for bit (ReferenceMismatch naming the first that differs). It needs no output:
    retie runs it while the output is written."""
    loaded = input_reference(original)
    if loaded is None:
        return InputReading(None)
    tensors = [t for t in original.checkpoint.tensors if t.name in loaded.names]
    with numpy_float8(original.checkpoint):
        for tensor in tensors:
            problem = _input_problem(original, loaded, tensor)
            if problem is not None:
                raise ReferenceMismatch(problem, original.checkpoint.path)
    return InputReading(loaded)


def _input_problem(original: OpenCheckpoint, loaded: Loaded, tensor: TensorInfo) -> str | None:
    """How the reference loader's reading of one input tensor differs from tieaudit's (None: not)."""
    name = printable(tensor.name)
    if loaded.dtype_shape(tensor.name) != (tensor.dtype, tensor.shape):
        in_dtype, in_shape = loaded.dtype_shape(tensor.name)
        return (
            f"{name} is {printable(in_dtype)} {list(in_shape)} when the reference loader reads the "
            f"input, not {tensor.dtype} {list(tensor.shape)} as tieaudit reads it"
        )
    if tensor.numel == 0:
        return None
    expected = original.array(tensor)
    comparer = getattr(_local, "comparer", None) or BlockComparer()
    _local.comparer = comparer
    release = block_releaser([(original, tensor, expected)])
    stored = Source(tensor.name, "stored")
    with loaded.values(tensor.name) as block:
        for first, stop, want in _row_blocks(expected, _rows_per_block(tensor)):
            given = _value_block(block, stored, first, stop=stop, ndim=expected.ndim, of=tensor.dtype)
            if not comparer.same(want, given.reshape(want.shape) if given.size == want.size else given):
                return f"{name} differs between tieaudit's reading of the input and the reference loader's"
            if expected.ndim:
                release(first, stop)
    return None


class ReferenceCheck:
    """The reference loader's reading of one output, compared name by name with the input as
    tieaudit reads it and as the reference loader reads it (``source``: None where that loader is
    not installed, then ``notes`` say so).

    ``problem`` may run in several threads at once (each opens what it reads). It leaves the
    input's pages to the caller, who compares the same name with tieaudit's reading first.
    ``rest_problem`` then covers every other entry the loader returns from the input.
    """

    def __init__(
        self,
        original: OpenCheckpoint,
        loaded: Loaded,
        found: dict[str, Source],
        *,
        source: Loaded | None,
    ) -> None:
        self._original = original
        self._loaded = loaded
        self._found = found
        self._source = source
        """The reference loader's reading of the input, compared already (compare_input): here
        for the entries beyond the tensors (rest_problem)."""
        self.notes: list[str] = []
        """What verification could not do as asked (a reference loader not installed)."""

    def problem(self, tensor: TensorInfo, *, as_name: str | None = None) -> str | None:
        """What the reference loader reads differently for one original name (None: bit for bit
        equal); as_name: the name the output holds it under (optimizer state renumbered by retie)."""
        name = printable(tensor.name)
        target = self._found.get(as_name or tensor.name)
        if target is not None and target.relation == "beside":
            return None  # a Trainer folder's optimizer.pt and the like: copied as they are
        if target is None:
            return f"{name} is missing when the reference loader reads the output"
        dtype, shape = self._loaded.dtype_shape(target.name)
        kept = dtype  # the stored tensor's (a cast's source)
        if target.relation == "transposed":
            shape = shape[::-1]
        if target.relation == "cast":
            dtype = target.dtype or dtype
        if (dtype, shape) != (tensor.dtype, tensor.shape):
            return (
                f"{name} reads back as {printable(dtype)} {list(shape)} with the reference loader, "
                f"not {tensor.dtype} {list(tensor.shape)}"
            )
        if tensor.numel == 0:
            return None  # no bytes: the dtype and shape are all there is
        with self._loaded.values(target.name) as block:
            return self._compare(tensor, target, block=block, kept=kept)

    def _compare(self, tensor: TensorInfo, target: Source, *, block: Block, kept: str) -> str | None:
        """Block by block: the output's values as the reference loader reads them, equal to
        tieaudit's reading of the input (which compare_input held to the loader's reading of it)."""
        name = printable(tensor.name)
        expected = self._original.array(tensor)
        comparer = getattr(_local, "comparer", None) or BlockComparer()
        _local.comparer = comparer
        release = block_releaser([(self._original, tensor, expected)])
        for first, stop, want in _row_blocks(expected, _rows_per_block(tensor)):
            value = _value_block(block, target, first, stop=stop, ndim=expected.ndim, of=kept)
            if not comparer.same(want, value.reshape(want.shape) if value.size == want.size else value):
                return f"{name} differs from the input when the reference loader reads the output"
            if expected.ndim:  # the input's pages of this block, read again here, go back too
                release(first, stop)
        return None

    def rest_problem(
        self, compared: frozenset[str], *, renamed: Mapping[str, str | None], rewritten: tuple[str, ...]
    ) -> str | None:
        """The first entry the reference loader returns from the input, beyond the tensors compared
        (compared), that the output lacks or holds otherwise: a tensor kind tieaudit does not read,
        a non-tensor value. renamed: what the plan moves or drops on purpose (None: dropped);
        rewritten: prefixes under which the plan changes non-tensor values on purpose."""
        source = self._source
        if source is None:
            return None
        out_entries = self._loaded.entries()
        for name in sorted(source.entries() - compared - training_files_tensors(self._original.checkpoint)):
            if name in renamed and renamed[name] is None:
                continue
            if any(name.startswith(prefix) for prefix in rewritten) and name not in source.names:
                continue
            target = renamed.get(name) or name
            if target not in out_entries:
                shown = printable(name)
                return f"{shown} is in the input as the reference loader reads it, but not in the output"
            problem = source.entry_problem(name, self._loaded, target)
            if problem is not None:
                return f"{printable(name)} {problem}"
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


def loader_name(ckpt: Checkpoint) -> str:
    """The reference loader of a checkpoint's weights, for notes."""
    if ckpt.format == "torch" or (ckpt.format == "hf-dir" and torch_weights(ckpt.files)):
        return "torch.load(weights_only=True), the torch extra"
    return "onnx" if ckpt.format == "onnx" else "the safetensors library"


def input_reference(original: OpenCheckpoint) -> Loaded | None:
    """The reference loader's reading of the input (None where it is not installed), checked to
    return exactly the tensors tieaudit reads or lists: a tensor only one of them sees would be
    compared by nobody."""
    ckpt = original.checkpoint
    if ckpt.format == "torchscript":
        return None  # its one loader, torch.jit.load, runs the archive's code: never called here
    try:
        loaded = load_reference(ckpt.path, ckpt, what="the input")
    except ReferenceMismatch as exc:
        raise ReferenceMismatch(exc.message, ckpt.path) from exc
    if loaded is None:
        return None
    beside = training_files_tensors(ckpt)
    layout = ckpt.training if ckpt.format == "hf-dir" else None
    beside_files = {p.path for p in layout.parts if p.role != "model"} if layout else set()
    listed = (ckpt.names - beside) | {u.name for u in ckpt.unread if u.file not in beside_files}
    if loaded.names != listed:
        differ = ", ".join(printable(n) for n in sorted(loaded.names ^ listed)[:3])
        raise ReferenceMismatch(
            f"the reference loader and tieaudit see different tensors in the input ({differ})", ckpt.path
        )
    return loaded


@contextmanager
def reference_check(
    original: OpenCheckpoint, written: Checkpoint, out: str, *, input_reading: InputReading
) -> Iterator[ReferenceCheck | None]:
    """The reference loader's reading of out and of the input (None where the output's loader is
    not installed), checked to hold the tensors tieaudit's readings hold; ReferenceMismatch when
    the loader refuses either."""
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
    input_loaded = input_reading.loaded
    with numpy_float8(original.checkpoint, written):
        check = ReferenceCheck(original, loaded, found, source=input_loaded)
        if input_loaded is None and original.checkpoint.format == "torchscript":
            check.notes.append(
                "the input was read for verification by tieaudit's own reader only: the one loader of a "
                "TorchScript archive, torch.jit.load, runs its code, and tieaudit never calls it"
            )
        elif input_loaded is None:
            check.notes.append(
                f"the input was read for verification by tieaudit's own reader only: its reference "
                f"loader ({loader_name(original.checkpoint)}) is not installed"
            )
        yield check
