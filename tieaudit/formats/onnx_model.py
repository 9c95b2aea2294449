"""ONNX models: initializers and Constant values as tensors, plus who consumes them.

Tensors come from the main graph and every subgraph (If/Loop/Scan attributes, recursively).
The protobuf is parsed from its skeleton (``onnx_wire``) with onnx's own schema, without importing
onnx (``onnx_proto``): embedded ``raw_data`` is served from a map
of the model file like external data, never copied; only typed fields (``float_data``...) are
decoded into memory. External data is located by tieaudit itself (``onnx_external``),
never by onnx's loader, so a hostile location cannot make us read outside the model's folder.
Tensors tieaudit does not read (sparse initializers, other attribute tensors, functions, training
graphs, skipped dtypes) have their external data confined all the same (``onnx_tensors``). Who
reads each tensor is gathered on the same walk (``onnx_consumers``).
"""

from __future__ import annotations

import os
from collections import ChainMap
from typing import TYPE_CHECKING

from tieaudit.core.bytestore import ByteStore, OpenCheckpoint
from tieaudit.core.dtypes import itemsize
from tieaudit.core.errors import InputError, one_line
from tieaudit.core.escape import quoted
from tieaudit.core.limits import bounded_product
from tieaudit.core.records import (
    Checkpoint,
    DeclaredTie,
    Skipped,
    StorageInfo,
    TensorInfo,
    contiguous_strides,
)
from tieaudit.formats.interface import Reader
from tieaudit.formats.onnx_consumers import ConsumerMap, Scope, is_op, resolve_identities, subgraphs, text
from tieaudit.formats.onnx_external import ExternalFiles
from tieaudit.formats.onnx_proto import EXTERNAL, data_type_name, parse_model, typed_field_bytes
from tieaudit.formats.onnx_tensors import every_tensor
from tieaudit.formats.onnx_wire import Skeleton, skeleton
from tieaudit.formats.tie_records import TIES_METADATA_KEY, tieaudit_ties
from tieaudit.formats.viewable import MAX_BYTES, MAX_DIMS, check_viewable

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto

ONNX_DTYPES: dict[str, str] = {
    "FLOAT": "float32",
    "FLOAT16": "float16",
    "BFLOAT16": "bfloat16",
    "DOUBLE": "float64",
    "FLOAT8E4M3FN": "float8_e4m3fn",
    "FLOAT8E4M3FNUZ": "float8_e4m3fnuz",
    "FLOAT8E5M2": "float8_e5m2",
    "FLOAT8E5M2FNUZ": "float8_e5m2fnuz",
    "COMPLEX64": "complex64",
    "COMPLEX128": "complex128",
    "INT64": "int64",
    "INT32": "int32",
    "INT16": "int16",
    "INT8": "int8",
    "UINT64": "uint64",
    "UINT32": "uint32",
    "UINT16": "uint16",
    "UINT8": "uint8",
    "BOOL": "bool",
}
"""TensorProto.DataType names -> canonical dtypes; others (strings, 4-bit, ...) are skipped."""

UNREAD_TENSOR = (
    "a tensor tieaudit does not read (it reads initializers and Constant values); external data confined"
)
"""Why a TensorProto elsewhere (functions, training graphs, other node attributes) is listed in skipped."""

_MODEL_FIELDS: dict[int, int] = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}
"""ModelProto field number -> protobuf wire type (0 varint, 2 length-delimited)."""


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None


def looks_like_model_proto(head: bytes) -> bool:
    """True when head starts with ``ir_version`` and every field it holds is a ModelProto field."""
    if head[:1] != b"\x08":
        return False
    pos = 0
    while pos < len(head):
        tag = _varint(head, pos)
        if tag is None:
            return pos > 0  # the head ends inside a tag
        field_number, wire_type = tag[0] >> 3, tag[0] & 7
        if _MODEL_FIELDS.get(field_number) != wire_type:
            return False
        value = _varint(head, tag[1])
        if value is None:
            return pos > 0
        if field_number == 1 and not 1 <= value[0] < 1000:
            return False  # ir_version is a small positive number
        pos = value[1] + (value[0] if wire_type == 2 else 0)
    return True


def load_model(path: str, *, for_writing: bool = False) -> ModelProto:
    """The ModelProto at path, without external data, every byte in memory (with onnx's own classes
    when for_writing); parse failures become InputError."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    return parse_model(data, path, for_writing=for_writing)


def load_skeleton(path: str, *, for_writing: bool = False) -> tuple[ModelProto, Skeleton | None]:
    """The model at path with each raw_data a placeholder into the skeleton's table (see
    onnx_wire); (the whole model, None) when the file must be parsed whole. for_writing: parsed
    with onnx's own classes, which onnx.helper's messages can be added to."""
    found = skeleton(path)
    if found is None:
        return load_model(path, for_writing=for_writing), None
    return parse_model(found.data, path, for_writing=for_writing), found


class _Collector:
    """Walks a model's graphs, gathering tensors, storages and consumers."""

    def __init__(self, path: str, found: Skeleton | None = None) -> None:
        self.path = path
        self.skeleton = found
        """Where each raw_data placeholder's bytes are; None: the model was parsed whole."""
        self.model_dir = os.path.dirname(os.path.abspath(path))
        self.model_file = os.path.basename(path)
        self.store = ByteStore(self.model_dir)
        self.external = ExternalFiles(self.model_dir, path)
        self.tensors: list[TensorInfo] = []
        self.storages: dict[str, StorageInfo] = {}
        self.consumers = ConsumerMap(path)
        self.aliases: dict[str, str] = {}
        self.skipped: list[Skipped] = []
        self.accounted: list[TensorProto] = []
        """Every TensorProto read or already listed in skipped (held: their ids must stay unique)."""
        self.files: list[str] = [self.model_file]
        self.taken: set[str] = set()
        self.suffixes: dict[str, int] = {}
        self.ranges: dict[tuple[str, int, int], str] = {}

    def _unique_name(self, value_name: str, graph_path: str) -> str:
        # A subgraph value named like an outer one keeps its name behind its graph's path.
        name = value_name if value_name not in self.taken else f"{graph_path or 'main'}/{value_name}"
        base, count = name, self.suffixes.get(name, 2)
        while name in self.taken:
            name, count = f"{base}#{count}", count + 1
        self.suffixes[base] = count  # the next repeat starts here: repeats stay linear, not quadratic
        self.taken.add(name)
        return name

    def add_tensor(self, proto: TensorProto, value_name: str, graph_path: str) -> str | None:
        """Record one TensorProto; returns its tensor name, or None when it is skipped."""
        self.accounted.append(proto)
        name = self._unique_name(text(value_name, "tensor name", self.path), graph_path)
        type_name = data_type_name(proto.data_type)
        if type_name == "UNDEFINED":  # no loader can decode it: not a tensor of some other type
            message = f"tensor {quoted(name)} has data type {proto.data_type}, which ONNX does not define"
            raise InputError(message, self.path)
        dtype = ONNX_DTYPES.get(type_name)
        if dtype is None:
            self.skipped.append(Skipped(name, f"ONNX data type {type_name} is not supported"))
            return None
        if proto.HasField("segment"):
            self.skipped.append(Skipped(name, "segmented tensor (a part of a larger tensor)"))
            return None
        if len(proto.dims) > MAX_DIMS:  # counted before a single dimension is copied out
            count = len(proto.dims)
            raise InputError(
                f"tensor {quoted(name)} has {count} dimensions; at most {MAX_DIMS} can be viewed", self.path
            )
        shape = tuple(proto.dims)
        if any(dim < 0 for dim in shape):
            raise InputError(f"tensor {quoted(name)} has a negative dimension {list(shape)}", self.path)
        check_viewable(name, shape, (), itemsize=itemsize(dtype), byte_offset=0, path=self.path)
        numel = bounded_product(shape, MAX_BYTES)
        assert numel is not None  # check_viewable bounds it
        if proto.data_location == EXTERNAL:
            storage = self._external(proto, name, dtype, expected=numel * itemsize(dtype))
        else:
            storage = self._embedded(proto, name, dtype, numel=numel)
        self.tensors.append(
            TensorInfo(
                name=name,
                dtype=dtype,
                shape=shape,
                strides=contiguous_strides(shape),
                storage_id=storage.storage_id,
                byte_offset=0,
                file=storage.file,
            )
        )
        self.consumers.add_tensor(name)
        return name

    def _embedded(self, proto: TensorProto, name: str, dtype: str, *, numel: int) -> StorageInfo:
        expected = numel * itemsize(dtype)
        offset, data = -1, b""
        if proto.HasField("raw_data") and self.skeleton is not None:
            offset, length = self.skeleton.locate(proto.raw_data)  # served from the file's map
        else:
            raw = proto.HasField("raw_data")
            data = proto.raw_data if raw else self._typed_field_bytes(proto, name, dtype, numel=numel)
            length = len(data)
        if length != expected:
            raise InputError(
                f"tensor {name!r}: shape {list(proto.dims)} of {dtype} needs {expected} bytes, "
                f"the protobuf holds {length}",
                self.path,
            )
        if offset < 0:
            self.store.hold(name, data)
        storage = StorageInfo(
            storage_id=name, file=self.model_file, file_offset=offset, nbytes=expected, dtype=dtype
        )
        self.storages[name] = storage
        return storage

    def _typed_field_bytes(self, proto: TensorProto, name: str, dtype: str, *, numel: int) -> bytes:
        try:
            return typed_field_bytes(proto, dtype, numel=numel, itemsize=itemsize(dtype))
        except ValueError as exc:
            raise InputError(f"tensor {name!r}: cannot decode values: {one_line(exc)}", self.path) from exc

    def _entries(self, proto: TensorProto, what: str) -> list[tuple[str, str]]:
        return [
            (
                text(entry.key, f"{what}: external data key", self.path),
                text(entry.value, f"{what}: external data", self.path),
            )
            for entry in proto.external_data
        ]

    def _external(self, proto: TensorProto, name: str, dtype: str, *, expected: int) -> StorageInfo:
        what = f"initializer {quoted(name)}"
        extent = self.external.extent(what, self._entries(proto, what), expected)
        # Two initializers naming the very same bytes are one storage; an empty range aliases nothing.
        key = (extent.file, extent.offset, extent.length)
        storage_id = self.ranges.setdefault(key, name) if extent.length else name
        if storage_id == name:
            file, offset, length = key
            self.storages[name] = StorageInfo(
                storage_id=name, file=file, file_offset=offset, nbytes=length, dtype=dtype
            )
            if extent.file not in self.files:
                self.files.append(extent.file)
        return self.storages[storage_id]

    def confine_unread(self, model: ModelProto) -> None:
        """Confine the external data of every tensor in the model, read or not (see onnx_tensors),
        and list each one not read (a function's, a training graph's, a non-Constant node
        attribute's such as ConstantOfShape's value) in skipped: never silently left out."""
        accounted = {id(proto) for proto in self.accounted}
        for where, proto in every_tensor(model):
            if proto.data_location == EXTERNAL:
                self.external.extent(where, self._entries(proto, where), None)
            if id(proto) not in accounted:
                self.skipped.append(Skipped(where, UNREAD_TENSOR))

    def _constant(self, node: NodeProto, graph_path: str) -> str | None:
        output = text(node.output[0], "value name", self.path)
        for attr in node.attribute:
            if attr.name == "value" and attr.HasField("t"):
                return self.add_tensor(attr.t, output, graph_path)
        kinds = ", ".join(text(attr.name, "attribute name", self.path) for attr in node.attribute) or "no"
        self.skipped.append(Skipped(output, f"Constant with {kinds} attribute, not a tensor value"))
        for attr in node.attribute:  # a sparse_value's tensors: listed by this entry
            if attr.HasField("sparse_tensor"):
                self.accounted += [attr.sparse_tensor.values, attr.sparse_tensor.indices]
        return None

    def _define_values(self, graph: GraphProto, graph_path: str, scope: Scope) -> None:
        own_initializers = {init.name for init in graph.initializer}
        for value in graph.input:
            # Before IR 4 initializers were also listed as inputs; those are not shadows.
            if value.name not in own_initializers:
                scope[value.name] = None
        seen: set[str] = set()
        for init in graph.initializer:
            if init.name in seen:
                where = graph_path or "main"
                raise InputError(f"initializer {init.name!r} appears twice in graph {where}", self.path)
            seen.add(init.name)
            scope[init.name] = self.add_tensor(init, init.name, graph_path)
        for sparse in graph.sparse_initializer:
            sparse_name = text(sparse.values.name, "sparse initializer name", self.path)
            self.skipped.append(Skipped(sparse_name, "sparse initializer (external data confined, not read)"))
            self.accounted += [sparse.values, sparse.indices]
            scope[sparse.values.name] = None
        for node in graph.node:
            for output in node.output:
                scope[output] = None
            if is_op(node, "Constant") and node.output:
                scope[node.output[0]] = self._constant(node, graph_path)

    def walk(self, graph: GraphProto, graph_path: str, outer: Scope) -> None:
        """Collect graph's tensors and consumers, then its subgraphs' (which see graph's values)."""
        scope = outer.new_child()
        self._define_values(graph, graph_path, scope)
        self.aliases.update(resolve_identities(graph, scope, self.path))
        label = graph_path or "main"
        prefix = f"{graph_path}/" if graph_path else ""
        with self.consumers.graph(graph):
            for index, node in enumerate(graph.node):
                node_name = self.consumers.record(node, index, scope, graph_label=label)
                for sub_path, subgraph in subgraphs(node, prefix + node_name):
                    self.walk(subgraph, sub_path, scope)

    def checkpoint(self, declared: tuple[DeclaredTie, ...] = ()) -> OpenCheckpoint:
        """The Checkpoint gathered so far, with the store its bytes are read through."""
        for file, identity in self.external.identities.items():
            self.store.pin(file, identity)  # opened later: it must still be the file checked
        checkpoint = Checkpoint(
            path=self.path,
            format="onnx",
            tensors=tuple(self.tensors),
            storages=self.storages,
            consumers=self.consumers.frozen(),
            aliases=self.aliases,
            skipped=tuple(self.skipped),
            files=tuple(self.files),
            declared_ties=declared,
        )
        return OpenCheckpoint(checkpoint, self.store)


class OnnxReader(Reader):
    """ONNX protobuf models, with embedded or external data."""

    format = "onnx"

    def sniff(self, path: str, head: bytes) -> bool:
        return looks_like_model_proto(head) or path.lower().endswith(".onnx")

    def read(self, path: str) -> OpenCheckpoint:
        model, found = load_skeleton(path)
        collector = _Collector(path, found)
        collector.walk(model.graph, "", ChainMap())
        collector.confine_unread(model)
        # tieaudit retie records the copies it removed (and how to restore them) in metadata_props.
        record = next((p.value for p in model.metadata_props if p.key == TIES_METADATA_KEY), None)
        where = f"{os.path.basename(path)}:metadata_props"
        return collector.checkpoint(tuple(tieaudit_ties(record, where, "metadata")))
