"""The ONNX reference loader's reading of retie's output and input (``repair.reference_loaders``).

``onnx.load`` without external data, each tensor's external data read by onnx's own helper, values
decoded by ``numpy_helper``: the tensors tieaudit reads (matched to its names in order), and the
others (strings, 4-bit types, segments) as entries of their own, compared whole.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tieaudit.core.errors import one_line
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint
from tieaudit.repair.reference_base import Block, Loaded, ReferenceMismatch, root_of


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


class OnnxLoaded(Loaded):
    """onnx.load of the output (without external data) and each tensor's values as onnx gives them.

    The protobuf is held whole, as onnx holds it; each tensor's values are a copy (protobuf hands
    out raw_data as a new bytes object), so one tensor is read at a time, whatever the threads.
    The tensors tieaudit does not read (strings, 4-bit types, segments) are entries too, by value
    name (``#n`` for a repeat), compared whole with ``entry_problem``."""

    def __init__(self, out: str, written: Checkpoint, what: str) -> None:
        import onnx

        from tieaudit.formats.onnx_model import ONNX_DTYPES

        try:
            model = onnx.load(out, load_external_data=False)
        except Exception as exc:  # DecodeError and friends: onnx refuses the file
            raise ReferenceMismatch(f"onnx cannot load {what}: {one_line(exc, 200, escaped=True)}") from exc
        self._base = root_of(out)
        self._one_at_a_time = threading.Lock()
        self._dtypes = ONNX_DTYPES
        every = list(_onnx_protos(model.graph))
        read = [_onnx_type(proto) in ONNX_DTYPES and not proto.HasField("segment") for _, proto in every]
        taken = iter([pair for pair, readable in zip(every, read, strict=True) if readable])
        self._others: dict[str, Any] = {}
        for (value, proto), readable in zip(every, read, strict=True):
            if not readable:
                key, count = value, 2
                while key in self._others:
                    key, count = f"{value}#{count}", count + 1
                self._others[key] = proto
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
        if self.names & set(self._others):
            twice = printable(sorted(self.names & set(self._others))[0])
            raise ReferenceMismatch(f"onnx finds two tensors named {twice}")

    def entries(self) -> frozenset[str]:
        return self.names | frozenset(self._others)

    def entry_problem(self, name: str, other: Loaded, other_name: str) -> str | None:
        if not isinstance(other, OnnxLoaded) or name not in self._others or other_name not in other._others:
            return super().entry_problem(name, other, other_name)
        mine, theirs = self._others[name], other._others[other_name]
        if (mine.data_type, list(mine.dims)) != (theirs.data_type, list(theirs.dims)):
            return "has another data type or shape in the output"
        with self._one_at_a_time, other._one_at_a_time if other is not self else contextlib.nullcontext():
            same = _same_proto(self._resolved(mine), other._resolved(theirs))
        return None if same else "holds other values in the output"

    def _resolved(self, proto: Any) -> Any:
        """proto with its external data read in (onnx's own loader, confined as onnx confines it)."""
        import onnx
        from onnx.external_data_helper import load_external_data_for_tensor

        if proto.data_location != onnx.TensorProto.EXTERNAL:
            return proto
        copy = onnx.TensorProto()
        copy.CopyFrom(proto)
        try:
            load_external_data_for_tensor(copy, self._base)
        except Exception as exc:  # onnx refuses the location or the length
            raise ReferenceMismatch(
                f"onnx cannot read {printable(proto.name)}: {one_line(exc, 200, escaped=True)}"
            ) from exc
        copy.data_location = onnx.TensorProto.DEFAULT
        del copy.external_data[:]
        return copy

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


def _same_proto(first: Any, second: Any) -> bool:
    """Equal values as onnx decodes them; where onnx decodes neither, equal fields (name aside)."""
    import onnx
    from onnx import numpy_helper

    try:
        left, right = numpy_helper.to_array(first), numpy_helper.to_array(second)
    except Exception:  # a type numpy_helper does not decode: the stored fields, bit for bit
        plain: list[bytes] = []
        for proto in (first, second):
            copy = onnx.TensorProto()
            copy.CopyFrom(proto)
            copy.name = ""
            plain.append(bytes(copy.SerializeToString(deterministic=True)))
        return plain[0] == plain[1]
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    if left.dtype.kind == "O":  # strings
        return bool((left == right).all())
    return left.tobytes() == right.tobytes()
