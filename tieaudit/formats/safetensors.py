"""safetensors: 8-byte little-endian header length, a JSON header, then raw bytes.

Each tensor is its own storage (the format cannot alias). A header is accepted only where the
safetensors library (``Metadata::validate`` in its ``tensor.rs``, and serde_json's parser, see
``safetensors_json``) accepts it: offsets sorted, contiguous from 0, each tensor's span exactly
its shape times its dtype, computed without overflowing a u64, and the last tensor ending at the
last byte of the file. Where tieaudit refuses what the library accepts, the message says why:
duplicate keys (loaders differ on which one counts), shapes no numpy view can hold, dtypes
tieaudit does not read (4- and 6-bit, exponent-only), and entries spelled as lists or dtypes as
objects (only serde reads those spellings). tests/test_differential_safetensors.py holds both
lists against the library.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

from tieaudit.core.bytestore import ByteStore, OpenCheckpoint
from tieaudit.core.dtypes import itemsize
from tieaudit.core.errors import InputError, UnsafeInputError, UnsupportedFormatError, one_line
from tieaudit.core.escape import quoted
from tieaudit.core.limits import U64_MAX, bounded_product, shown_dims
from tieaudit.core.records import (
    Checkpoint,
    StorageInfo,
    TensorInfo,
    contiguous_strides,
)
from tieaudit.formats.interface import Reader
from tieaudit.formats.safetensors_json import DuplicateKeyError, HeaderJsonError, parse_header_json
from tieaudit.formats.tie_records import metadata_ties
from tieaudit.formats.viewable import MAX_DIMS, check_viewable

MAX_HEADER_BYTES = 100_000_000
"""Largest JSON header: the limit the safetensors library itself enforces (it refuses larger)."""

SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "C64": "complex64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
"""The library's dtype names (exact spelling; it has no C128) -> canonical dtypes."""

UNVIEWED_DTYPES = frozenset({"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0"})
"""Dtypes the library knows that tieaudit does not read (4- and 6-bit elements, exponent-only
scales; its torch reader skips the last too). A file holding one is refused by name: skipping the
tensor would let retie write a copy without it."""


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header."""

    tensors: tuple[TensorInfo, ...]
    """Tensors in data order."""
    storages: dict[str, StorageInfo]
    """One storage per tensor."""
    metadata: dict[str, str]
    """The ``__metadata__`` map (empty when absent)."""


@dataclass(frozen=True, kw_only=True)
class _Entry:
    """One tensor entry of the header, its fields checked one by one."""

    name: str
    """The key, as stored."""
    dtype: str
    """Canonical dtype."""
    shape: tuple[int, ...]
    """Dimensions, each at most U64_MAX."""
    begin: int
    """First byte, relative to the end of the header."""
    end: int
    """One past the last byte, relative to the end of the header."""


def _is_u64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def _shown(value: object) -> str:
    """A JSON value from the header for a message, never more than a few dozen characters."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else f"a list of {len(value)}"
    text = value if isinstance(value, str) else json.dumps(value)
    return quoted(text, 40)


def _why_not_u64(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not an integer"
    if value > U64_MAX:  # an integer past 2**64-1 arrives as a float, as serde_json reads it
        return "is too large (at most 2**64-1)"
    return "is negative" if value < 0 else "is not an integer"


def _dtype(name: str, code: object, path: str) -> str:
    if isinstance(code, str) and code in SAFETENSORS_DTYPES:
        return SAFETENSORS_DTYPES[code]
    if isinstance(code, str) and code in UNVIEWED_DTYPES:
        message = f"tensor {quoted(name)} has dtype {code}, which tieaudit does not read"
        raise UnsupportedFormatError(message, path)
    spelled = _shown(code) if isinstance(code, str) else f"{_shown(code)} (not a string)"
    raise InputError(f"tensor {quoted(name)} has unknown dtype {spelled}", path)


def _parse_entry(name: str, entry: object, path: str) -> _Entry:
    tensor = f"tensor {quoted(name)}"
    if not isinstance(entry, dict):
        message = f"header entry {quoted(name)} is not an object with dtype, shape and data_offsets"
        raise InputError(message, path)
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise InputError(f"{tensor} has no {field}", path)
    dtype = _dtype(name, entry["dtype"], path)
    shape = entry["shape"]
    if not isinstance(shape, list):
        raise InputError(f"{tensor} has a shape that is not a list ({_shown(shape)})", path)
    if len(shape) > MAX_DIMS:  # counted before any dimension is looked at
        raise InputError(f"{tensor} has {len(shape)} dimensions; at most {MAX_DIMS} can be viewed", path)
    if not all(_is_u64(dim) for dim in shape):
        wrong = next(dim for dim in shape if not _is_u64(dim))
        why = _why_not_u64(wrong)
        raise InputError(f"{tensor} has an invalid shape: dimension {_shown(wrong)} {why}", path)
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_u64(o) for o in offsets)):
        raise InputError(f"{tensor} has invalid data_offsets {_shown(offsets)} (two integers)", path)
    return _Entry(name=name, dtype=dtype, shape=tuple(shape), begin=offsets[0], end=offsets[1])


def _check_span(entry: _Entry, expected_begin: int, path: str) -> None:
    """The library's per-tensor rules, in its order: offsets, then overflow, then the byte count."""
    name, begin, end = quoted(entry.name), entry.begin, entry.end
    if begin != expected_begin or end < begin:
        raise InputError(
            f"tensor {name} data_offsets [{begin}, {end}] overlap or leave a gap "
            f"(expected to start at {expected_begin})",
            path,
        )
    numel = bounded_product(entry.shape, U64_MAX)
    nbits = None if numel is None else bounded_product((numel, 8 * itemsize(entry.dtype)), U64_MAX)
    if numel is None or nbits is None:
        raise InputError(
            f"tensor {name}: shape {shown_dims(entry.shape)} of {entry.dtype} overflows a 64-bit byte count",
            path,
        )
    if end - begin != nbits // 8:
        raise InputError(
            f"tensor {name}: shape {shown_dims(entry.shape)} of {entry.dtype} needs {nbits // 8} bytes, "
            f"data_offsets give {end - begin}",
            path,
        )


def _read_raw(path: str) -> tuple[bytes, int]:
    """The header's bytes and the file's size."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(9)
            if len(prefix) < 8:
                raise InputError("truncated: shorter than the 8-byte header length", path)
            (header_len,) = struct.unpack("<Q", prefix[:8])
            implausible = header_len > MAX_HEADER_BYTES or 8 + header_len > size
            if implausible and len(prefix) == 9 and prefix[8:] not in b"{ \t\r\n":
                # a length no file could have, and no JSON object after it: another kind of file
                raise InputError(
                    "not a safetensors file: it does not start with a header (an 8-byte length, then "
                    f"a JSON object); its first bytes are {prefix[:8]!r}",
                    path,
                )
            if header_len > MAX_HEADER_BYTES:
                raise InputError(
                    f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit", path
                )
            if 8 + header_len > size:
                raise InputError(
                    f"header length {header_len} runs past the end of the {size}-byte file", path
                )
            first = prefix[8 : 8 + header_len]  # the header's first byte, read with the length
            return first + handle.read(header_len - len(first)), size
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc


POLYGLOT = (
    "is both a safetensors file and one torch.load unpickles (a polyglot): safetensors reads tensors "
    "from it, torch.load (given another name, or the open file) unpickles it as {what}; tieaudit will "
    "not vouch for one reading while a loader takes the other"
)
"""Why a safetensors file torch.load takes too is refused, whatever its name."""


def refuse_polyglot(path: str, size: int) -> None:
    """Refuse a safetensors file that torch.load takes too, as torch.load tries it: a zip (its first
    4 bytes), a tar archive (its first 512), or a pickle from byte 0: the legacy stream, or any
    pickle it unpickles before it fails (a string opcode can swallow the header length and the
    JSON). The torch sniffers and the pickle walk are imported only for a file starting like one."""
    from tieaudit.formats.pickle_start import starts_like_pickle
    from tieaudit.formats.torch_tar import TAR_BLOCK, is_tar_header
    from tieaudit.formats.zip_archive import LOCAL_MAGIC

    try:
        with open(path, "rb") as handle:
            block = handle.read(TAR_BLOCK)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    if not (block.startswith(LOCAL_MAGIC) or starts_like_pickle(block) or is_tar_header(block)):
        return
    from tieaudit.formats.bare_pickle import unpickled_by_torch

    what = unpickled_by_torch(path, block[:64], size)
    if what:
        raise UnsafeInputError(POLYGLOT.format(what=what), path)


def _metadata(header: dict[str, object], path: str) -> dict[str, str]:
    metadata = header.pop("__metadata__", None)
    if metadata is None:  # absent, or null: the library reads both as no metadata
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InputError("__metadata__ must map strings to strings", path)
    return metadata


def read_header(path: str, file: str) -> SafetensorsHeader:
    """Read and validate the header of one safetensors file (``file`` is its relative name)."""
    raw, size = _read_raw(path)
    try:
        header = parse_header_json(raw)
    except DuplicateKeyError as exc:
        raise InputError(f"header is ambiguous: {exc}", path) from exc
    except (HeaderJsonError, RecursionError) as exc:
        raise InputError(f"header is not valid JSON ({one_line(exc, 200)})", path) from exc
    if not isinstance(header, dict):
        raise InputError("header is not a JSON object", path)
    refuse_polyglot(path, size)
    metadata = _metadata(header, path)
    data_start = 8 + len(raw)
    # Sorted by offsets, as the library sorts them before validating.
    entries = sorted(
        (_parse_entry(name, entry, path) for name, entry in header.items()),
        key=lambda item: (item.begin, item.end),
    )
    tensors: list[TensorInfo] = []
    storages: dict[str, StorageInfo] = {}
    expected_begin = 0
    for entry in entries:
        _check_span(entry, expected_begin, path)
        expected_begin = entry.end
        name, dtype, shape = entry.name, entry.dtype, entry.shape
        storages[name] = StorageInfo(
            storage_id=name,
            file=file,
            file_offset=data_start + entry.begin,
            nbytes=entry.end - entry.begin,
            dtype=dtype,
        )
        check_viewable(
            name, shape, (), itemsize=itemsize(dtype), byte_offset=0, path=path
        )  # bounds the strides' products
        tensors.append(
            TensorInfo(
                name=name,
                dtype=dtype,
                shape=shape,
                strides=contiguous_strides(shape),
                storage_id=name,
                byte_offset=0,
                file=file,
            )
        )
    if data_start + expected_begin > size:
        raise InputError(
            f"truncated: tensors need {data_start + expected_begin} bytes, the file has {size}", path
        )
    if data_start + expected_begin < size:
        uncovered = size - data_start - expected_begin
        raise InputError(
            f"{uncovered} bytes after the last tensor belong to no tensor; the safetensors library "
            "refuses such files, and other readers could find data there",
            path,
        )
    return SafetensorsHeader(tuple(tensors), storages, dict(metadata))


class SafetensorsReader(Reader):
    """Single safetensors files."""

    format = "safetensors"

    def sniff(self, path: str, head: bytes) -> bool:
        if len(head) < 9:
            return path.endswith(".safetensors") and len(head) > 0
        (header_len,) = struct.unpack("<Q", head[:8])
        return head[8:9] == b"{" and header_len > 0 or path.endswith(".safetensors")

    def read(self, path: str) -> OpenCheckpoint:
        file = os.path.basename(path)
        header = read_header(path, file)
        stored = {t.name for t in header.tensors}
        checkpoint = Checkpoint(
            path=path,
            format="safetensors",
            tensors=header.tensors,
            storages=header.storages,
            declared_ties=tuple(
                metadata_ties(header.metadata, stored, f"{file}:__metadata__", declared_by="metadata")
            ),
            files=(file,),
        )
        return OpenCheckpoint(checkpoint, ByteStore(os.path.dirname(os.path.abspath(path))))
