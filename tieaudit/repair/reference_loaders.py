"""The reference loaders' reading of retie's output, for ``repair.reference`` to compare.

One class per loader, each used only where installed: ``safetensors.safe_open(framework="numpy")``
for safetensors files and Hugging Face shards, ``onnx.load`` plus each tensor's external data for
ONNX, ``torch.load(weights_only=True, mmap=True)`` for .pt and a folder's .bin files (torch is
imported for those only). Each gives the stored names, dtypes, shapes, values by block, and the
names its format restores from records (``{dropped: kept}`` metadata, the shard index).
"""

from __future__ import annotations

import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from tieaudit.core.errors import TieauditError, one_line
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint
from tieaudit.formats.hf_dir import torch_weights
from tieaudit.repair.restore import Source


class ReferenceMismatch(TieauditError):
    """The reference loader reads the written output differently from the input."""


Block = Callable[[tuple[slice, ...]], np.ndarray]
"""The values of a region of one stored tensor (one slice per leading axis, or () for all)."""


class Loaded(ABC):
    """Stored tensors as a reference loader gives them."""

    names: frozenset[str]
    """Every stored tensor name the loader sees."""

    @abstractmethod
    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
        """Canonical dtype and shape of a stored tensor."""

    @abstractmethod
    def values(self, name: str) -> AbstractContextManager[Block]:
        """Access to one stored tensor's values; what it holds (a map, a copy) goes at the end."""

    def ties(self) -> dict[str, Source]:
        """Dropped name -> where the loader's format restores it from (beyond the stored names)."""
        return {}


def _root(out: str) -> str:
    """The folder the output's files are named relative to (the output itself for a model folder)."""
    return out if os.path.isdir(out) else os.path.dirname(os.path.abspath(out))


# --- safetensors (files and Hugging Face shards) ------------------------------------------------

_NUMPY_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
"""ml_dtypes types the safetensors library looks up as numpy attributes (numpy itself has none)."""


@contextmanager
def numpy_float8() -> Iterator[None]:
    """numpy.float8_* for the duration (safetensors' numpy framework asks numpy for them by name)."""
    import ml_dtypes

    added = [n for n in _NUMPY_NAMES if not hasattr(np, n) and hasattr(ml_dtypes, n)]
    for name in added:
        setattr(np, name, getattr(ml_dtypes, name))
    try:
        yield
    finally:
        for name in added:
            delattr(np, name)


class _Safetensors(Loaded):
    """Each file is opened once for its names and metadata, then once per tensor compared: a file
    stays mapped only while one of its tensors is read, so resident memory stays bounded."""

    def __init__(self, out: str, written: Checkpoint, files: list[str]) -> None:
        from tieaudit.formats.safetensors import SAFETENSORS_DTYPES
        from tieaudit.formats.tie_records import metadata_ties

        self._info: dict[str, tuple[str, str, tuple[int, ...]]] = {}
        metadata: list[tuple[str, dict[str, str]]] = []
        root = _root(out)
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
        """Each block read through a safe_open of its own: the library maps the whole file and
        the pages a block touches stay resident until the handle closes, so one handle per tensor
        kept a whole tensor (the embedding, twice with two verifying threads) in memory. A block
        is a copy, so it outlives its handle; an open costs a header parse."""
        path = self._info[name][0]

        def block(index: tuple[slice, ...]) -> np.ndarray:
            with self._open(path, os.path.basename(path)) as handle:
                piece = handle.get_slice(name)
                array: np.ndarray = piece[index] if index else piece[...]
                return array

        yield block

    def ties(self) -> dict[str, Source]:
        return self._ties


# --- ONNX -----------------------------------------------------------------------------------------


def _onnx_protos(graph: Any) -> Iterator[tuple[str, Any]]:
    """(value name, TensorProto) of every tensor the ONNX reader takes, in the reader's order:
    a graph's initializers, its Constant values, then each node's subgraphs."""
    from tieaudit.formats.onnx_consumers import is_op, subgraphs

    yield from ((init.name, init) for init in graph.initializer)
    for node in graph.node:
        if is_op(node, "Constant") and node.output:
            value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if value is not None:
                yield node.output[0], value
    for node in graph.node:
        for _, subgraph in subgraphs(node, ""):
            yield from _onnx_protos(subgraph)


def _onnx_type(proto: Any) -> str:
    import onnx

    try:
        name: str = onnx.TensorProto.DataType.Name(proto.data_type)
    except ValueError:
        return f"#{proto.data_type}"
    return name


def _named_as(name: str, value: str) -> bool:
    """tieaudit's name for a tensor is its value name, or ``graph/value``, maybe with ``#n``."""
    for candidate in (name, re.sub(r"#\d+$", "", name)):
        if candidate == value or candidate.endswith(f"/{value}"):
            return True
    return False


class _Onnx(Loaded):
    """onnx.load of the output (without external data) and each tensor's values as onnx gives them.

    The protobuf is held whole, as onnx holds it; each tensor's values are a copy (protobuf hands
    out raw_data as a new bytes object), so one tensor is read at a time, whatever the threads."""

    def __init__(self, out: str, written: Checkpoint) -> None:
        import onnx

        from tieaudit.formats.onnx_model import ONNX_DTYPES

        try:
            model = onnx.load(out, load_external_data=False)
        except Exception as exc:  # DecodeError and friends: onnx refuses the file
            raise ReferenceMismatch(
                f"onnx cannot load the output: {one_line(exc, 200, escaped=True)}"
            ) from exc
        self._base = _root(out)
        self._one_at_a_time = threading.Lock()
        self._dtypes = ONNX_DTYPES
        taken = (
            (value, proto)
            for value, proto in _onnx_protos(model.graph)
            if _onnx_type(proto) in ONNX_DTYPES and not proto.HasField("segment")
        )
        self._protos: dict[str, Any] = {}
        for tensor in written.tensors:
            value, proto = next(taken, ("", None))
            if proto is None or not _named_as(tensor.name, value):
                raise ReferenceMismatch(f"onnx does not find {printable(tensor.name)} where tieaudit does")
            self._protos[tensor.name] = proto
        extra = next(taken, None)
        if extra is not None:
            raise ReferenceMismatch(f"onnx finds {printable(extra[0])}, which tieaudit does not read")
        self.names = frozenset(self._protos)

    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
        proto = self._protos[name]
        return self._dtypes[_onnx_type(proto)], tuple(proto.dims)

    @contextmanager
    def values(self, name: str) -> Iterator[Block]:
        """The whole tensor as onnx reads it, held while it is compared."""
        with self._one_at_a_time:
            yield from self._values(name)

    def _values(self, name: str) -> Iterator[Block]:
        import onnx
        from onnx import numpy_helper
        from onnx.external_data_helper import load_external_data_for_tensor

        proto = self._protos[name]
        try:
            if proto.data_location == onnx.TensorProto.EXTERNAL:
                copy = onnx.TensorProto()
                copy.CopyFrom(proto)
                load_external_data_for_tensor(copy, self._base)
                copy.data_location = onnx.TensorProto.DEFAULT
                del copy.external_data[:]
                proto = copy
            array = numpy_helper.to_array(proto)
        except Exception as exc:  # onnx refuses the location, the length or the values
            raise ReferenceMismatch(
                f"onnx cannot read {printable(name)}: {one_line(exc, 200, escaped=True)}"
            ) from exc
        yield lambda index: array[index]


# --- torch -----------------------------------------------------------------------------------------


class _Torch(Loaded):
    """torch.load of one .pt, or of every .bin of a folder (names merged, as from_pretrained does)."""

    def __init__(self, paths: list[str]) -> None:
        import torch

        from tieaudit.repair.torch_sink import file_mappings
        from tieaudit.repair.torch_writer import load_weights, named_tensors

        self._tensors: dict[str, Any] = {}
        for path in paths:
            try:
                root = load_weights(path)
            except TieauditError as exc:
                raise ReferenceMismatch(f"torch.load cannot load the output: {exc.message}") from exc
            for name, tensor in named_tensors(torch, root).items():
                self._tensors.setdefault(name, tensor)
        self._torch = torch
        self._mappings = file_mappings(paths)  # the output's pages, given back after each tensor
        self.names = frozenset(self._tensors)

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


def load_reference(out: str, written: Checkpoint) -> Loaded | None:
    """The reference loader's view of the output, or None where that loader is not installed."""
    try:
        if written.format == "onnx":
            return _Onnx(out, written)
        if written.format == "torch":
            return _Torch([out])
        layout = written.training  # a Trainer folder's optimizer.pt and the like are not weights
        beside = {p.path for p in layout.parts if p.role != "model"} if layout else set()
        files = sorted({s.file for s in written.storages.values()} - beside) or [os.path.basename(out)]
        if written.format == "hf-dir" and torch_weights(
            tuple(files)
        ):  # a file goes by its bytes, not its name
            return _Torch([os.path.join(out, file) for file in files])
        return _Safetensors(out, written, files)
    except ImportError:
        return None
