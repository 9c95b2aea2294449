"""The GGUF header, parsed by tieaudit itself: magic, version, tensor count, key/value count, the
key/values, the tensor infos, then tensor data from the next multiple of ``general.alignment``.

Why not ``gguf.GGUFReader``: it builds a numpy field object for every element of every array (a
header with 256 000 tokens and 256 000 merges takes it 9.9 s here, this parser 0.4 s), its
errors are multi-line numpy or struct messages, and its counts are bounded only by running off the
end of the map. Here every count and length is checked against what the remaining bytes can hold
and against the MAX_* limits below before anything is allocated; array contents are skipped by
length, never read, except the few scalar and string values tieaudit reports. The ``gguf`` package
gives the constants (value types, GGML types and their block sizes), so a type added to it is
read the way llama.cpp writes it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from tieaudit.core.dtypes import GGML_BLOCK_TYPES
from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.core.escape import quoted
from tieaudit.core.limits import NPY_INTP_MAX, bounded_product, shown_dims

MAX_GGUF_TENSORS = 1_000_000
"""Tensor infos in one GGUF file: a 405B llama has about 1 100, a per-expert MoE conversion some
tens of thousands; each costs a few hundred bytes of records."""
MAX_GGUF_KEYS = 1_000_000
"""Key/value pairs in one GGUF file: converters write a few dozen (the vocabulary is one array)."""
MAX_GGUF_NAME_BYTES = 65_535
"""Longest key or tensor name read: the GGUF specification's limit for keys (llama.cpp's tensor
names are at most 63 bytes)."""
MAX_GGUF_VALUE_BYTES = 1_000_000
"""Longest string value read into memory (``general.architecture``, ``tokenizer.ggml.model``);
longer strings, and all array contents, are skipped by length without being read."""
MAX_GGUF_ARRAY_DEPTH = 8
"""Arrays nested in arrays: converters write none; skipping deeper ones would recurse further."""
GGML_MAX_DIMS = 4
"""Dimensions of a tensor: ggml's GGML_MAX_DIMS (llama.cpp refuses more)."""

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_READ_VALUES = frozenset({"general.architecture", "general.alignment", "tokenizer.ggml.model"})
"""Keys whose values are read; ``*.vocab_size`` too. Others are only stepped over."""
_COUNTED_ARRAYS = frozenset({"tokenizer.ggml.tokens"})
"""Arrays whose length is kept (the vocabulary's size)."""
ALIGNMENT_KEY = "general.alignment"
_RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})
"""Names gguf.GGUFReader gives the header's own fields: a key so named is a duplicate it refuses."""


@dataclass(frozen=True, kw_only=True)
class GgufTensor:
    """One tensor info, checked."""

    name: str
    """As stored."""
    ggml_type: str
    """The GGML type's name (F32, F16, Q4_K, ...)."""
    dims: tuple[int, ...]
    """GGML's ne: innermost (a row's length) first."""
    offset: int
    """Absolute offset of the first byte in the file."""
    nbytes: int
    """Bytes the tensor occupies."""
    row_bytes: int
    """Bytes of one row (dims[0] elements)."""


@dataclass(frozen=True, kw_only=True)
class GgufHeader:
    """What tieaudit reads of a GGUF file."""

    version: int
    """GGUF version (2 or 3)."""
    values: dict[str, object]
    """The values read (``_READ_VALUES``, ``*.vocab_size``)."""
    array_lengths: dict[str, int]
    """Lengths of the arrays counted (``_COUNTED_ARRAYS``)."""
    tensors: tuple[GgufTensor, ...]
    """In stored order."""


class _Cursor:
    """Reads little-endian values from a map, every read checked against its end."""

    def __init__(self, data: mmap.mmap, path: str) -> None:
        self.data, self.path, self.pos = data, path, 0

    def need(self, count: int, what: str) -> None:
        if count > len(self.data) - self.pos:
            raise InputError(f"truncated: {what} at byte {self.pos} runs past the end of the file", self.path)

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        result: int | float | bool = value
        return result

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", what))

    def string(self, what: str, limit: int) -> str | None:
        """A length-prefixed UTF-8 string; None (skipped) when longer than limit."""
        length = self.u64(f"the length of {what}")
        self.need(length, what)
        if length > limit:
            self.pos += length
            return None
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{what} is not UTF-8", self.path) from exc

    def name(self, what: str) -> str:
        start = self.pos
        text = self.string(what, MAX_GGUF_NAME_BYTES)
        if text is None:
            raise InputError(
                f"{what} at byte {start} is longer than the {MAX_GGUF_NAME_BYTES}-byte limit", self.path
            )
        return text


def _value_type(cursor: _Cursor, what: str) -> int:
    code = cursor.u32(f"the type of {what}")
    if code not in _SCALARS and code not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
        raise InputError(f"{what} has unknown value type {code}", cursor.path)
    return code


def _skip(cursor: _Cursor, code: int, what: str, *, depth: int) -> None:
    """Step over one value of type code."""
    if code in _SCALARS:
        cursor.need(struct.calcsize(_SCALARS[code]), what)
        cursor.pos += struct.calcsize(_SCALARS[code])
    elif code == GGUFValueType.STRING:
        cursor.string(what, -1)
    else:
        _skip_array(cursor, what, depth + 1)


def _skip_array(cursor: _Cursor, what: str, depth: int) -> int:
    """Step over an array; its length."""
    if depth > MAX_GGUF_ARRAY_DEPTH:
        raise InputError(f"{what} nests arrays deeper than {MAX_GGUF_ARRAY_DEPTH}", cursor.path)
    code = _value_type(cursor, f"the elements of {what}")
    count = cursor.u64(f"the length of {what}")
    if code in _SCALARS:
        size = struct.calcsize(_SCALARS[code])
        cursor.need(count * size, f"{what} ({count} elements)")
        cursor.pos += count * size
        return count
    least = 8 if code == GGUFValueType.STRING else 12  # a string's length; an array's type and length
    cursor.need(count * least, f"{what} ({count} elements)")  # bounds the loop by the file's size
    for _ in range(count):
        _skip(cursor, code, what, depth=depth)
    return count


def _read_values(cursor: _Cursor, count: int) -> tuple[dict[str, object], dict[str, int]]:
    values: dict[str, object] = {}
    lengths: dict[str, int] = {}
    keys: set[str] = set()
    for index in range(count):
        key = cursor.name(f"key {index}")
        what = f"the value of {quoted(key)}"
        if key in keys:
            raise InputError(f"key {quoted(key)} appears twice (readers differ on which counts)", cursor.path)
        if key in _RESERVED_KEYS:
            raise InputError(f"key {quoted(key)} is the name gguf's reader gives a header field", cursor.path)
        keys.add(key)
        code = _value_type(cursor, what)
        if key == ALIGNMENT_KEY and code != GGUFValueType.UINT32:
            # gguf.GGUFReader refuses any other type ("Bad type for general.alignment field")
            type_name = GGUFValueType(code).name
            raise InputError(
                f"{ALIGNMENT_KEY} has type {type_name}; gguf's reader takes only UINT32", cursor.path
            )
        wanted = key in _READ_VALUES or key.endswith(".vocab_size")
        if code == GGUFValueType.ARRAY:
            length = _skip_array(cursor, what, 1)
            if key in _COUNTED_ARRAYS:
                lengths[key] = length
        elif wanted and code in _SCALARS:
            values[key] = cursor.scalar(_SCALARS[code], what)
        elif wanted and code == GGUFValueType.STRING:
            values[key] = cursor.string(what, MAX_GGUF_VALUE_BYTES)
        else:
            _skip(cursor, code, what, depth=0)
    return values, lengths


def _ggml_type(code: int, name: str, path: str) -> tuple[str, int, int]:
    """The type's name, block size and bytes per block."""
    try:
        kind = GGMLQuantizationType(code)
    except ValueError:
        raise UnsupportedFormatError(
            f"tensor {quoted(name)} has GGML type {code}, unknown to gguf", path
        ) from None
    block, size = GGML_QUANT_SIZES[kind]
    if block > 1 and kind.name not in GGML_BLOCK_TYPES:
        message = f"tensor {quoted(name)} has GGML type {kind.name}, which tieaudit does not read yet"
        raise UnsupportedFormatError(message, path)
    return kind.name, block, size


def _tensor_info(cursor: _Cursor, index: int) -> tuple[str, str, tuple[int, ...], int, int]:
    """(name, type, dims, relative offset, row bytes) of one tensor info."""
    name = cursor.name(f"tensor name {index}")
    ndims = cursor.u32(f"the dimension count of {quoted(name)}")
    if ndims > GGML_MAX_DIMS:
        raise InputError(
            f"tensor {quoted(name)} has {ndims} dimensions; ggml allows {GGML_MAX_DIMS}", cursor.path
        )
    dims = tuple(cursor.u64(f"a dimension of {quoted(name)}") for _ in range(ndims))
    type_name, block, size = _ggml_type(cursor.u32(f"the type of {quoted(name)}"), name, cursor.path)
    offset = cursor.u64(f"the offset of {quoted(name)}")
    row = dims[0] if dims else 1
    if row % block:
        message = f"tensor {quoted(name)}: a row of {row} elements is not whole {type_name} blocks of {block}"
        raise InputError(message, cursor.path)
    return name, type_name, dims, offset, row // block * size


def parse_header(data: mmap.mmap, path: str) -> GgufHeader:
    """Parse and check a whole GGUF file's header against its size (data: the file, mapped)."""
    cursor = _Cursor(data, path)
    cursor.need(4, "the magic")
    if bytes(data[:4]) != b"GGUF":
        raise InputError("not a GGUF file (no GGUF magic)", path)
    cursor.pos = 4
    version = cursor.u32("the version")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        why = "a big-endian GGUF file" if swapped in (2, 3) else f"GGUF version {version}"
        raise UnsupportedFormatError(f"{why}: tieaudit reads little-endian GGUF versions 2 and 3", path)
    counts = (cursor.u64("the tensor count"), cursor.u64("the key/value count"))
    for count, limit, what in zip(
        counts, (MAX_GGUF_TENSORS, MAX_GGUF_KEYS), ("tensors", "key/values"), strict=True
    ):
        if count > limit:
            raise InputError(f"header declares {count} {what}, more than the {limit} tieaudit reads", path)
    values, lengths = _read_values(cursor, counts[1])
    alignment = values.get(ALIGNMENT_KEY, 32)
    assert isinstance(alignment, int)  # a UINT32 (_read_values refuses every other type)
    if alignment <= 0 or alignment & (alignment - 1):
        raise InputError(f"{ALIGNMENT_KEY} {alignment} is not a power of two", path)
    cursor.need(counts[0] * 24, f"{counts[0]} tensor infos")  # a name length, type, offset, dims count
    infos = [_tensor_info(cursor, index) for index in range(counts[0])]
    data_start = -(-cursor.pos // alignment) * alignment
    return GgufHeader(
        version=version,
        values=values,
        array_lengths=lengths,
        tensors=_placed(infos, data_start, alignment=alignment, size=len(data), path=path),
    )


def _placed(
    infos: list[tuple[str, str, tuple[int, ...], int, int]],
    data_start: int,
    *,
    alignment: int,
    size: int,
    path: str,
) -> tuple[GgufTensor, ...]:
    """Tensors with absolute offsets, each aligned, inside the file, overlapping no other."""
    tensors: list[GgufTensor] = []
    seen: set[str] = set()
    for name, type_name, dims, offset, row_bytes in infos:
        if name in seen:
            raise InputError(f"tensor {quoted(name)} appears twice (readers differ on which counts)", path)
        seen.add(name)
        nbytes = bounded_product((row_bytes, *dims[1:]), NPY_INTP_MAX)
        if nbytes is None:
            raise InputError(f"tensor {quoted(name)}: shape {shown_dims(dims)} overflows a byte count", path)
        if offset % alignment:
            raise InputError(f"tensor {quoted(name)} starts at {offset}, not a multiple of {alignment}", path)
        begin = data_start + offset
        if begin + nbytes > size:
            raise InputError(
                f"truncated: tensor {quoted(name)} needs bytes {begin}..{begin + nbytes}, "
                f"the file has {size}",
                path,
            )
        tensors.append(
            GgufTensor(
                name=name,
                ggml_type=type_name,
                dims=dims,
                offset=data_start + offset,
                nbytes=nbytes,
                row_bytes=row_bytes,
            )
        )
    ordered = sorted(tensors, key=lambda t: (t.offset, t.nbytes))
    for first, second in zip(ordered, ordered[1:], strict=False):
        if first.offset + first.nbytes > second.offset:
            raise InputError(f"tensors {quoted(first.name)} and {quoted(second.name)} overlap", path)
    return tuple(tensors)
