"""safetensors: 8-byte little-endian header length, a JSON header, then raw bytes.

Each tensor is its own storage (the format cannot alias). The header is validated the way the
reference implementation does (offsets in order, contiguous, matching the shapes) so that a
hostile header cannot make a view reach outside its tensor.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

from tieaudit.bytestore import ByteStore
from tieaudit.dtypes import ITEMSIZE, itemsize
from tieaudit.errors import InputError
from tieaudit.formats.interface import Reader
from tieaudit.formats.viewable import check_viewable
from tieaudit.model import Checkpoint, DeclaredBy, DeclaredTie, StorageInfo, TensorInfo, contiguous_strides

MAX_HEADER_BYTES = 100_000_000  # the limit safetensors itself enforces

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
    "C128": "complex128",
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

TIES_METADATA_KEY = "tieaudit.ties"
"""Namespaced metadata key for relations other loaders do not restore (transposed, cast)."""


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header."""

    tensors: tuple[TensorInfo, ...]
    """Tensors in data order."""
    storages: dict[str, StorageInfo]
    """One storage per tensor."""
    metadata: dict[str, str]
    """The ``__metadata__`` map (empty when absent)."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _parse_entry(name: str, entry: object, path: str) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(entry, dict):
        raise InputError(f"header entry {name!r} is not an object", path)
    dtype_code = entry.get("dtype")
    if not isinstance(dtype_code, str) or dtype_code not in SAFETENSORS_DTYPES:
        raise InputError(f"tensor {name!r} has unknown dtype {dtype_code!r}", path)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InputError(f"tensor {name!r} has an invalid shape {shape!r}", path)
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        raise InputError(f"tensor {name!r} has invalid data_offsets {offsets!r}", path)
    return SAFETENSORS_DTYPES[dtype_code], tuple(shape), offsets[0], offsets[1]


def read_header(path: str, file: str) -> SafetensorsHeader:
    """Read and validate the header of one safetensors file (``file`` is its relative name)."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise InputError("truncated: shorter than the 8-byte header length", path)
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise InputError(
                    f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit", path
                )
            if 8 + header_len > size:
                raise InputError(
                    f"header length {header_len} runs past the end of the {size}-byte file", path
                )
            raw = handle.read(header_len)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad UTF-8, bad JSON and integers past Python's digit limit.
        raise InputError(f"header is not valid JSON ({_first_line(exc)})", path) from exc
    if not isinstance(header, dict):
        raise InputError("header is not a JSON object", path)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InputError("__metadata__ must map strings to strings", path)
    data_start = 8 + header_len
    entries = sorted(
        ((name, *_parse_entry(name, entry, path)) for name, entry in header.items()),
        key=lambda item: (item[3], item[4]),
    )
    tensors: list[TensorInfo] = []
    storages: dict[str, StorageInfo] = {}
    expected_begin = 0
    for name, dtype, shape, begin, end in entries:
        if begin != expected_begin or end < begin:
            raise InputError(
                f"tensor {name!r} data_offsets [{begin}, {end}] overlap or leave a gap "
                f"(expected to start at {expected_begin})",
                path,
            )
        numel = 1
        for dim in shape:
            numel *= dim
        if end - begin != numel * itemsize(dtype):
            raise InputError(
                f"tensor {name!r}: shape {list(shape)} of {dtype} needs {numel * itemsize(dtype)} bytes, "
                f"data_offsets give {end - begin}",
                path,
            )
        expected_begin = end
        storages[name] = StorageInfo(name, file, data_start + begin, end - begin, dtype)
        strides = contiguous_strides(shape)
        check_viewable(name, shape, strides, itemsize(dtype), 0, path)
        tensors.append(TensorInfo(name, dtype, shape, strides, name, 0, file))
    if data_start + expected_begin > size:
        raise InputError(
            f"truncated: tensors need {data_start + expected_begin} bytes, the file has {size}", path
        )
    return SafetensorsHeader(tuple(tensors), storages, dict(metadata))


def metadata_ties(
    metadata: dict[str, str], stored: set[str], where: str, declared_by: DeclaredBy
) -> list[DeclaredTie]:
    """``{dropped: kept}`` records (safetensors.torch.save_model's convention) as declared ties,
    plus tieaudit's own ``tieaudit.ties`` record (JSON) for transposed and cast relations."""
    ties = []
    for dropped, kept in sorted(metadata.items()):
        # Other metadata ("format": "pt", ...) names no stored tensor; a tie record always does.
        if kept in stored and dropped != kept:
            ties.append(DeclaredTie(dropped, kept, declared_by, where))
    ties.extend(tieaudit_ties(metadata.get(TIES_METADATA_KEY), where, declared_by))
    return ties


def tieaudit_ties(record: str | None, where: str, declared_by: DeclaredBy) -> list[DeclaredTie]:
    """Parse a ``tieaudit.ties`` record: ``{dropped: {"source", "relation", "dtype"}}``."""
    if record is None:
        return []
    try:
        entries = json.loads(record)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{TIES_METADATA_KEY} is not valid JSON ({_first_line(exc)})", where) from exc
    if not isinstance(entries, dict):
        raise InputError(f"{TIES_METADATA_KEY} must be a JSON object", where)
    ties = []
    for dropped, entry in sorted(entries.items()):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("source"), str)
            or entry.get("relation") not in ("equal", "transposed", "cast")
            # str(): a JSON list or object as dtype is unhashable; no such value names a dtype.
            or (entry["relation"] == "cast" and str(entry.get("dtype")) not in ITEMSIZE)
        ):
            raise InputError(f"{TIES_METADATA_KEY} entry for {dropped!r} is malformed", where)
        ties.append(
            DeclaredTie(
                dropped,
                entry["source"],
                declared_by,
                f"{where}:{TIES_METADATA_KEY}",
                entry["relation"],
                entry.get("dtype"),
            )
        )
    return ties


class SafetensorsReader(Reader):
    """Single safetensors files."""

    format = "safetensors"

    def sniff(self, path: str, head: bytes) -> bool:
        if len(head) < 9:
            return path.endswith(".safetensors") and len(head) > 0
        (header_len,) = struct.unpack("<Q", head[:8])
        return head[8:9] == b"{" and header_len > 0 or path.endswith(".safetensors")

    def read(self, path: str) -> Checkpoint:
        file = os.path.basename(path)
        header = read_header(path, file)
        stored = {t.name for t in header.tensors}
        return Checkpoint(
            path=path,
            format="safetensors",
            tensors=header.tensors,
            storages=header.storages,
            store=ByteStore(os.path.dirname(os.path.abspath(path))),
            declared_ties=tuple(metadata_ties(header.metadata, stored, f"{file}:__metadata__", "metadata")),
            files=(file,),
        )
