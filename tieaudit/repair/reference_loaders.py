"""The reference loaders' reading of retie's output and input, for ``repair.reference`` to compare.

One class per loader, each used only where installed: ``safetensors.safe_open(framework="numpy")``
for safetensors files and Hugging Face shards, ``onnx.load`` plus each tensor's external data for
ONNX (``reference_onnx``), ``torch.load(weights_only=True, mmap=True)`` for .pt and a folder's .bin
files (torch is imported for those only). Each gives the stored names, dtypes, shapes, values by
block, the names its format restores from records (``{dropped: kept}`` metadata, the shard index),
and every entry it returns beyond those (``entries``: a torch file's other leaves, an ONNX model's
tensors tieaudit does not read), compared whole (``entry_problem``).
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np

from tieaudit.core.dtypes import ITEMSIZE
from tieaudit.core.errors import TieauditError, one_line
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint
from tieaudit.formats.hf_dir import torch_weights
from tieaudit.repair.reference_base import Block, Loaded, ReferenceMismatch, root_of
from tieaudit.repair.restore import Source

__all__ = [
    "Block",
    "Loaded",
    "ReferenceMismatch",
    "load_reference",
    "numpy_float8",
    "preload_ml_dtypes",
    "root_of",
]


# --- safetensors (files and Hugging Face shards) ------------------------------------------------

_NUMPY_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
"""ml_dtypes types the safetensors library looks up as numpy attributes (numpy itself has none)."""


def _needs_ml_dtypes(*checkpoints: Checkpoint) -> bool:
    """Whether a checkpoint holds a tensor numpy reads only through ml_dtypes' types."""
    dtypes = {t.dtype for ckpt in checkpoints for t in ckpt.tensors}
    dtypes.update(u.dtype for ckpt in checkpoints for u in ckpt.unread)
    return any(dtype == "bfloat16" or dtype.startswith("float8") for dtype in dtypes)


def _import_ml_dtypes() -> None:
    with suppress(ImportError):  # numpy_float8 imports it again, and says what is missing
        import ml_dtypes  # noqa: F401


def preload_ml_dtypes(ckpt: Checkpoint) -> None:
    """Start importing ml_dtypes in a thread when the verification of ckpt's output will need it
    (numpy_float8): its 0.75 s then overlaps the write, which runs in the kernel without the GIL."""
    if "ml_dtypes" not in sys.modules and _needs_ml_dtypes(ckpt):
        threading.Thread(target=_import_ml_dtypes, name="tieaudit-preload", daemon=True).start()


@contextmanager
def numpy_float8(*checkpoints: Checkpoint) -> Iterator[None]:
    """numpy.float8_* for the duration (safetensors' numpy framework asks numpy for them by name),
    and numpy's "bfloat16" (registered by importing ml_dtypes), when one of the checkpoints holds a
    tensor of those types: ml_dtypes costs 0.75 s to import."""
    if not _needs_ml_dtypes(*checkpoints):
        yield
        return
    import ml_dtypes

    added = [n for n in _NUMPY_NAMES if not hasattr(np, n) and hasattr(ml_dtypes, n)]
    for name in added:
        setattr(np, name, getattr(ml_dtypes, name))
    try:
        yield
    finally:
        for name in added:
            delattr(np, name)


SHARED_HANDLE_BYTES = 32 << 20
"""Largest tensor the safetensors reference loader reads through one handle (see values)."""


class _Safetensors(Loaded):
    """Each file is opened once for its names and metadata, then once per tensor compared: a file
    stays mapped only while one of its tensors is read, so resident memory stays bounded."""

    def __init__(self, out: str, written: Checkpoint, files: list[str]) -> None:
        from tieaudit.formats.safetensors import SAFETENSORS_DTYPES
        from tieaudit.formats.tie_records import metadata_ties

        self._info: dict[str, tuple[str, str, tuple[int, ...]]] = {}
        metadata: list[tuple[str, dict[str, str]]] = []
        root = root_of(out)
        for file in files:
            with self._open(os.path.join(root, file), file) as handle:
                metadata.append((file, dict(handle.metadata() or {})))
                for key in handle.keys():
                    if key in self._info:
                        raise ReferenceMismatch(
                            f"the safetensors library finds {printable(key)} in two files"
                        )
                    piece = handle.get_slice(key)
                    dtype = piece.get_dtype()
                    shape = tuple(piece.get_shape())
                    self._info[key] = (os.path.join(root, file), SAFETENSORS_DTYPES.get(dtype, dtype), shape)
        self.names = frozenset(self._info)
        self._ties: dict[str, Source] = {}
        names = set(self.names)
        records = [
            t
            for f, meta in metadata
            for t in metadata_ties(meta, names, f"{f}:__metadata__", declared_by="metadata")
        ]
        # The index's records are JSON read by json (as transformers reads them), not by safetensors.
        records += [tie for tie in written.declared_ties if tie.declared_by == "index"]
        for tie in records:
            if tie.kept in names and tie.dropped not in names:
                self._ties.setdefault(tie.dropped, Source(tie.kept, tie.relation, tie.dtype))

    @staticmethod
    @contextmanager
    def _open(path: str, file: str) -> Iterator[Any]:
        from safetensors import safe_open

        try:
            with safe_open(path, framework="numpy") as handle:
                yield handle
        except Exception as exc:  # SafetensorError and friends: the library refuses the file
            if isinstance(exc, ReferenceMismatch):
                raise
            raise ReferenceMismatch(
                f"the safetensors library cannot read {file}: {one_line(exc, 200, escaped=True)}"
            ) from exc

    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
        _, dtype, shape = self._info[name]
        return dtype, shape

    @contextmanager
    def values(self, name: str) -> Iterator[Block]:
        """The library maps the whole file and the pages a block touches stay resident until the
        handle closes: a tensor of at most SHARED_HANDLE_BYTES is read through one handle (the
        pages it holds resident are bounded by it), a larger one (the embedding) through a handle
        per block, so that it is never whole in memory. A block is a copy, so it outlives its
        handle; an open costs a header parse (a 2 GB file's 900 blocks: 0.3 s)."""
        path, dtype, shape = self._info[name]
        file = os.path.basename(path)
        if math.prod(shape) * ITEMSIZE.get(dtype, 16) <= SHARED_HANDLE_BYTES:
            with self._open(path, file) as handle:
                piece = handle.get_slice(name)
                yield lambda index: piece[index] if index else piece[...]
            return

        def block(index: tuple[slice, ...]) -> np.ndarray:
            with self._open(path, file) as handle:
                piece = handle.get_slice(name)
                array: np.ndarray = piece[index] if index else piece[...]
                return array

        yield block

    def ties(self) -> dict[str, Source]:
        return self._ties


# --- torch -----------------------------------------------------------------------------------------


class _Torch(Loaded):
    """torch.load of one .pt, or of every .bin of a folder (names merged, as from_pretrained does):
    every leaf by dotted name (``entries``), the tensors of any kind among them (``names``)."""

    def __init__(self, paths: list[str], what: str) -> None:
        import torch

        from tieaudit.repair.torch_entries import torch_entries
        from tieaudit.repair.torch_sink import file_mappings
        from tieaudit.repair.torch_writer import load_weights

        self._entries: dict[str, Any] = {}
        for path in paths:
            try:
                found = torch_entries(torch, load_weights(path), path)
            except TieauditError as exc:
                raise ReferenceMismatch(f"torch.load cannot load {what}: {exc.message}") from exc
            twice = next((name for name in found if name in self._entries), None)
            if twice is not None:  # from_pretrained would keep one of them
                raise ReferenceMismatch(f"torch.load finds {printable(twice)} in two files of {what}")
            self._entries.update(found)
        self._tensors = {n: v for n, v in self._entries.items() if isinstance(v, torch.Tensor)}
        self._torch = torch
        self._mappings = file_mappings(paths)  # the output's pages, given back after each tensor
        self.names = frozenset(self._tensors)

    def entries(self) -> frozenset[str]:
        return frozenset(self._entries)

    def entry_problem(self, name: str, other: Loaded, other_name: str) -> str | None:
        from tieaudit.repair.torch_entries import same_entry

        if not isinstance(other, _Torch):
            return super().entry_problem(name, other, other_name)
        return same_entry(self._torch, self._entries[name], other._entries[other_name])

    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
        tensor = self._tensors[name]
        return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)

    @contextmanager
    def values(self, name: str) -> Iterator[Block]:
        tensor = self._tensors[name].detach()
        same_width = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}.get(tensor.element_size())

        def block(index: tuple[slice, ...]) -> np.ndarray:
            part = tensor[index]
            try:
                array: np.ndarray = part.numpy()
            except TypeError:  # bfloat16, float8: numpy has no such dtype; the same bits as integers
                array = part.view(getattr(self._torch, same_width or "uint8")).numpy()
            return array

        from tieaudit.repair.torch_sink import release_tensor

        try:
            yield block
        finally:
            release_tensor(tensor, self._mappings)


def load_reference(out: str, written: Checkpoint, *, what: str = "the output") -> Loaded | None:
    """The reference loader's view of out (what: how messages name it), or None where that loader
    is not installed."""
    try:
        if written.format == "onnx":
            from tieaudit.repair.reference_onnx import OnnxLoaded

            return OnnxLoaded(out, written, what)
        if written.format == "torch":
            return _Torch([out], what)
        layout = written.training  # a Trainer folder's optimizer.pt and the like are not weights
        beside = {p.path for p in layout.parts if p.role != "model"} if layout else set()
        files = sorted({s.file for s in written.storages.values()} - beside) or [os.path.basename(out)]
        if written.format == "hf-dir" and torch_weights(
            tuple(files)
        ):  # a file goes by its bytes, not its name
            return _Torch([os.path.join(root_of(out), file) for file in files], what)
        return _Safetensors(out, written, files)
    except ImportError:
        return None
