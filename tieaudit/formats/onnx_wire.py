"""An ONNX model's protobuf without its weights' bytes: the *skeleton*, read through a read-only map.

``skeleton(path)`` walks the wire format of the file, descending only into the message fields
that can (transitively) hold a TensorProto (``SCHEMA``; tests compare it with onnx's descriptors).
Every ``TensorProto.raw_data`` it meets is replaced by an 8-byte placeholder (its index in the
table of real ``(file offset, length)`` pairs, little-endian) and every enclosing length prefix
is recomputed; all other bytes are copied verbatim. Parsing the skeleton therefore gives what
parsing the file gives (repeated and merged fields, last-wins scalars, unknown fields, a field
whose wire type does not match its declaration), except that each raw_data names where its bytes
are instead of holding them. The walk steps over raw_data by its length: the weights' pages are
never touched.

What the walk cannot settle with certainty (groups, a field number 0, a tag past 32 bits, a tag or
length spelled in more than 5 bytes, nesting or field counts past the limits below, files protobuf
cannot parse whole) returns None: the caller then parses the file itself, as onnx.load does. What
protobuf refuses in every implementation (a length, varint or fixed-width value running past the
end of its message, a varint longer than ten bytes, wire types 6 and 7) is an InputError naming
the byte.
"""

from __future__ import annotations

import mmap
import os
import re
from array import array
from dataclasses import dataclass

from tieaudit.core.errors import InputError

MODEL, GRAPH, NODE, ATTRIBUTE, TENSOR, SPARSE, FUNCTION, TRAINING = (
    "ModelProto", "GraphProto", "NodeProto", "AttributeProto", "TensorProto", "SparseTensorProto",
    "FunctionProto", "TrainingInfoProto",
)  # fmt: skip

SCHEMA: dict[str, dict[int, str]] = {
    MODEL: {7: GRAPH, 20: TRAINING, 25: FUNCTION},  # graph, training_info, functions
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},  # node, initializer, sparse_initializer
    NODE: {5: ATTRIBUTE},  # attribute
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},  # t g tensors graphs ...
    SPARSE: {1: TENSOR, 2: TENSOR},  # values, indices
    FUNCTION: {7: NODE, 11: ATTRIBUTE},  # node, attribute_proto
    TRAINING: {1: GRAPH, 2: GRAPH},  # initialization, algorithm
    TENSOR: {},
}
"""Message -> {field number: message type} for every field through which a TensorProto can be reached."""
RAW_DATA = 9
"""TensorProto.raw_data."""
PLACEHOLDER_BYTES = 8
"""Width of a placeholder: the little-endian index of the raw_data in the skeleton's table."""

MAX_ONNX_DEPTH = 100
"""Messages nested deeper than this are not walked (the file is parsed whole instead): protobuf's
own decoder refuses nesting past about 100 levels, and real models nest a few dozen at most."""
MAX_ONNX_FIELDS = 2_000_000
"""Fields the walk visits (in graphs, nodes with attributes, attributes holding tensors, and tensors)
before it parses the file whole instead: about a second of Python. A graph of 100 000 Constants
stays under it; past it are mostly tensors kept in unpacked typed fields, which protobuf's own
parser reads faster."""
PROTOBUF_LIMIT = (2 << 30) - 1
"""Largest message protobuf parses: a larger file is parsed whole, so that it is refused as onnx
refuses it."""

_LENGTH_DELIMITED, _VARINT, _FIXED64, _FIXED32, _START_GROUP, _END_GROUP = 2, 0, 1, 5, 3, 4
_MAX_VARINT32 = 5
"""Bytes of a tag or length varint: upb refuses a longer (padded) one, other parsers may not."""


def _tag_leads(fields: dict[int, str]) -> re.Pattern[bytes]:
    """Any first byte a length-delimited tag of these fields can have (minimal or padded varint)."""
    tags = [number << 3 | _LENGTH_DELIMITED for number in fields]
    leads = {tag & 0x7F | 0x80 for tag in tags} | {tag for tag in tags if tag < 0x80}
    return re.compile(b"[" + b"".join(re.escape(bytes([lead])) for lead in sorted(leads)) + b"]")


_TAG_LEADS = {kind: _tag_leads(SCHEMA[kind]) for kind in (NODE, ATTRIBUTE)}
"""Small messages searched (at C speed) for a tag leading to a tensor before they are walked."""


class _Unsure(Exception):
    """The walk met something it does not settle with certainty: parse the whole file instead."""


@dataclass(frozen=True)
class Skeleton:
    """The model's protobuf with each raw_data replaced by a placeholder, and where the bytes are."""

    data: bytes
    """The protobuf to parse (a ModelProto)."""
    offsets: array[int]
    """File offset of each raw_data's bytes, by placeholder index."""
    lengths: array[int]
    """Length of each raw_data, by placeholder index."""

    def locate(self, placeholder: bytes) -> tuple[int, int]:
        """(file offset, length) of the raw_data a placeholder stands for."""
        index = int.from_bytes(placeholder, "little")
        if len(placeholder) != PLACEHOLDER_BYTES or index >= len(self.offsets):
            raise ValueError(f"raw_data {placeholder!r} is not a placeholder of this skeleton")
        return self.offsets[index], self.lengths[index]


def encode_varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes([value]) for value in range(0x80)]


class _Walk:
    """One walk of a mapped file: the edits that turn it into its skeleton, and the table."""

    def __init__(self, data: mmap.mmap | bytes, path: str) -> None:
        self.data = data
        self.path = path
        self.edits: list[tuple[int, int, bytes] | None] = []
        """(start, end, replacement) of the file, in file order; None: a length that did not change."""
        self.offsets: array[int] = array("Q")
        self.lengths: array[int] = array("Q")
        self.fields = 0

    def _refuse(self, what: str, kind: str, pos: int) -> InputError:
        return InputError(f"not a valid ONNX protobuf: byte {pos} (in a {kind}): {what}", self.path)

    def _varint(self, pos: int, end: int, kind: str) -> tuple[int, int]:
        data, start = self.data, pos
        value = shift = 0
        while pos < end:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value & 0xFFFFFFFFFFFFFFFF, pos
            shift += 7
            if shift == 70:
                raise self._refuse("a varint longer than 10 bytes", kind, start)
        raise self._refuse("a varint runs past the end of its message", kind, start)

    def _may_hold_tensors(self, kind: str, start: int, end: int) -> bool:
        """False when no byte of [start, end) can begin the tag of a field leading to a tensor:
        then the message holds none and is copied as it is, unwalked (a node without attributes)."""
        leads = _TAG_LEADS.get(kind)
        return leads is None or leads.search(self.data, start, end) is not None

    def message(self, kind: str, start: int, end: int, *, depth: int) -> int:
        """Walk the message of type kind in [start, end); returns how much its size changes."""
        if depth > MAX_ONNX_DEPTH:
            raise _Unsure
        data, children, growth, pos = self.data, SCHEMA[kind], 0, start
        while pos < end:
            self.fields += 1
            if self.fields > MAX_ONNX_FIELDS:
                raise _Unsure
            tag_at, tag = pos, data[pos]
            pos += 1
            if tag >= 0x80:  # the common one-byte tags skip the call
                tag, pos = self._varint(tag_at, end, kind)
                if pos - tag_at > _MAX_VARINT32:
                    raise _Unsure
            field, wire = tag >> 3, tag & 7
            if wire == _LENGTH_DELIMITED and field and tag <= 0xFFFFFFFF:
                length_at, length = pos, data[pos] if pos < end else 0x80
                body = pos + 1
                if length >= 0x80:
                    length, body = self._varint(pos, end, kind)
                stop = body + length
                if stop > end:
                    what = f"field {field} has length {length}, past the end of its message"
                    raise self._refuse(what, kind, tag_at)
                if body - pos > _MAX_VARINT32:
                    raise _Unsure
                if kind == TENSOR and field == RAW_DATA:
                    growth += self._placeholder(length_at, body, stop)
                elif field in children and self._may_hold_tensors(children[field], body, stop):
                    slot = len(self.edits)
                    self.edits.append(None)  # the new length goes before the child's own edits
                    inner = self.message(children[field], body, stop, depth=depth + 1)
                    if inner:
                        prefix = encode_varint(length + inner)
                        self.edits[slot] = (length_at, body, prefix)
                        growth += inner + len(prefix) - (body - length_at)
                pos = stop
            elif field == 0 or tag > 0xFFFFFFFF or wire in (_START_GROUP, _END_GROUP):
                raise _Unsure  # refused or stepped over depending on the protobuf implementation
            elif wire == _VARINT:
                if pos < end and data[pos] < 0x80:
                    pos += 1
                else:
                    pos = self._varint(pos, end, kind)[1]
            elif wire in (_FIXED64, _FIXED32):
                pos += 8 if wire == _FIXED64 else 4
                if pos > end:
                    raise self._refuse("a fixed-width value runs past the end of its message", kind, tag_at)
            else:
                raise self._refuse(f"wire type {wire}, which protobuf does not define", kind, tag_at)
        return growth

    def _placeholder(self, length_at: int, body: int, stop: int) -> int:
        """Replace the raw_data at [body, stop) (its length at length_at); returns the size change."""
        placeholder = len(self.offsets).to_bytes(PLACEHOLDER_BYTES, "little")
        self.offsets.append(body)
        self.lengths.append(stop - body)
        self.edits.append((length_at, stop, encode_varint(PLACEHOLDER_BYTES) + placeholder))
        return 1 + PLACEHOLDER_BYTES - (stop - length_at)

    def assemble(self, size: int) -> bytes:
        """The file with every edit applied."""
        parts: list[bytes] = []
        done = 0
        for edit in self.edits:
            if edit is None:
                continue
            start, end, replacement = edit
            parts.append(self.data[done:start])
            parts.append(replacement)
            done = end
        parts.append(self.data[done:size])
        return b"".join(parts)


def skeleton(path: str) -> Skeleton | None:
    """The skeleton of the ONNX model at path, or None when the file must be parsed whole."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > PROTOBUF_LIMIT:
                return None
            if size == 0:
                return Skeleton(b"", array("Q"), array("Q"))
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    try:
        return skeleton_of(data, path)
    finally:
        data.close()


def skeleton_of(data: mmap.mmap | bytes, path: str) -> Skeleton | None:
    """The skeleton of a model's bytes (a map of the file at path, or bytes in memory)."""
    if len(data) > PROTOBUF_LIMIT:
        return None
    walk = _Walk(data, path)
    try:
        growth = walk.message(MODEL, 0, len(data), depth=1)
    except _Unsure:
        return None
    if len(data) + growth > PROTOBUF_LIMIT:
        return None  # placeholders longer than tiny raw_data would push it past what protobuf parses
    return Skeleton(walk.assemble(len(data)), walk.offsets, walk.lengths)
