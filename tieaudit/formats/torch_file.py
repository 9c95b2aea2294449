"""PyTorch checkpoints: torch.save's zip archive (torch >= 1.6) and the legacy stream before it.

The object pickle is read with the allowlist unpickler (no pickle code runs, torch is never
imported); tensors become strided views into storage records whose bytes are located in the file
without being read, so ``Checkpoint.array`` maps them zero-copy.
"""

from __future__ import annotations

import io
import lzma
import os
import reprlib
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tieaudit.bytestore import ByteStore
from tieaudit.dtypes import ITEMSIZE, itemsize
from tieaudit.errors import InputError, UnsafeInputError, UnsupportedFormatError
from tieaudit.formats.interface import Reader
from tieaudit.formats.torch_pickle import DtypeToken, Opaque, StorageRef, TensorRecord, load_pickle
from tieaudit.formats.viewable import check_viewable
from tieaudit.model import Checkpoint, Skipped, StorageInfo, TensorInfo

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = b"\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")
"""The LONG1 opcode pickling MAGIC_NUMBER, which every legacy file starts with (after PROTO)."""
MAX_PICKLE_BYTES = 1 << 30
"""data.pkl larger than this is refused: real ones hold metadata only (a few MB)."""
MAX_DEPTH = 200
"""Containers nested deeper than this are refused rather than walked."""
MAX_VISITS = 1_000_000
"""Values visited while flattening; bounds work on pickles that share one container many times."""
ROOT_NAME = "<root>"
"""Name of the tensor when the checkpoint is a single tensor rather than a container."""

LocateStorage = Callable[[StorageRef], int]
"""Absolute file offset of a storage's first byte; raises InputError when its bytes are not there."""


@dataclass(frozen=True)
class Entry:
    """One leaf of the unpickled object, with its dotted name."""

    name: str
    """Dotted path: dict keys and list indexes joined with ``.``."""
    value: object
    """The leaf: a TensorRecord, or a value that becomes a Skipped entry."""


# What zipfile raises for a malformed archive, including a compressed member that does not inflate
# (bzip2's errors are OSErrors), or an archive needing a zip version it does not implement.
_ZIP_ERRORS: tuple[type[Exception], ...] = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError)
_ZIP_ERRORS += (NotImplementedError, zlib.error, lzma.LZMAError)


def _is_zip(path: str, head: bytes) -> bool:
    if not head.startswith(ZIP_MAGIC):
        return False
    (name_len,) = struct.unpack("<H", head[26:28]) if len(head) >= 30 else (0,)
    if head[30 : 30 + name_len].endswith(b"/data.pkl"):
        return True  # torch writes data.pkl first; no need to open the archive
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") for name in archive.namelist())
    except OSError:
        return False
    except _ZIP_ERRORS:
        return False


def _is_legacy(head: bytes) -> bool:
    # PROTO n, then (protocol 4+) an optional 9-byte FRAME, then LONG1 of the magic number.
    return head[:1] == b"\x80" and LEGACY_MAGIC in head[2:24]


def _check_member_name(name: str, path: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        raise UnsafeInputError(f"zip member {name!r} leaves the archive (absolute path or '..')", path)


def _zip_prefix(archive: zipfile.ZipFile, path: str) -> str:
    names = [info.filename for info in archive.infolist()]
    for name in names:
        _check_member_name(name, path)
    if len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise InputError(f"zip member {duplicate!r} appears more than once", path)
    pickles = [name for name in names if name.count("/") == 1 and name.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise InputError(
            f"expected one <prefix>/data.pkl record in the zip archive, found {len(pickles)}", path
        )
    prefix = pickles[0][: -len("/data.pkl")]
    if f"{prefix}/constants.pkl" in names or any(name.startswith(f"{prefix}/code/") for name in names):
        raise UnsupportedFormatError(
            "a TorchScript archive (torch.jit.save), not a torch.save checkpoint", path
        )
    return prefix


def _read_member(archive: zipfile.ZipFile, name: str, limit: int, path: str) -> bytes:
    info = archive.getinfo(name)
    if info.flag_bits & 1:  # zipfile would ask for a password (RuntimeError)
        raise InputError(f"zip member {name!r} is encrypted", path)
    # zipfile never yields more than the declared size, so checking the claim first bounds memory.
    if info.file_size > limit:
        raise InputError(f"zip member {name!r} is larger than {limit} bytes", path)
    # torch.save writes members stored; zlib's memory is bounded, but lzma's and bzip2's
    # decompressors allocate what a hostile header asks for (a MemoryError seen in fuzzing).
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise InputError(
            f"zip member {name!r} uses compression method {info.compress_type}, "
            "which torch.save never writes",
            path,
        )
    with archive.open(name) as member:
        data = member.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"zip member {name!r} is larger than {limit} bytes", path)
    return data


def _member_data_offset(handle: io.BufferedReader, info: zipfile.ZipInfo, path: str) -> int:
    # The central directory's extra field may differ from the local one (torch pads the local one
    # to align data), so the data offset comes from the local header itself.
    handle.seek(info.header_offset)
    header = handle.read(30)
    lengths: tuple[int, int] = struct.unpack("<HH", header[26:30]) if len(header) == 30 else (0, 0)
    name_len, extra_len = lengths
    encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
    if not header.startswith(ZIP_MAGIC) or handle.read(name_len) != info.orig_filename.encode(encoding):
        raise InputError(f"zip member {info.filename!r} has no matching local header", path)
    return info.header_offset + 30 + name_len + extra_len


def _record_ends(archive: zipfile.ZipFile) -> dict[int, int]:
    """Local header offset -> where the next record (or the central directory) starts."""
    starts = sorted({info.header_offset for info in archive.infolist()})
    return dict(zip(starts, [*starts[1:], archive.start_dir], strict=True))


def _zip_locator(
    archive: zipfile.ZipFile, prefix: str, handle: io.BufferedReader, path: str
) -> LocateStorage:
    size = os.fstat(handle.fileno()).st_size
    ends = _record_ends(archive)

    def locate(ref: StorageRef) -> int:
        name = f"{prefix}/data/{ref.key}"
        try:
            info = archive.getinfo(name)
        except KeyError:
            raise InputError(f"storage {ref.key!r} has no zip member {name!r}", path) from None
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
            raise InputError(f"zip member {name!r} is compressed or encrypted; storages must be stored", path)
        if info.file_size < ref.nbytes:
            raise InputError(
                f"zip member {name!r} holds {info.file_size} bytes, its storage needs {ref.nbytes}", path
            )
        offset = _member_data_offset(handle, info, path)
        if offset + max(info.compress_size, ref.nbytes) > ends[info.header_offset]:
            # Two records sharing bytes: what is audited would not be what torch.load reads.
            raise InputError(f"zip member {name!r} overlaps the next record of the archive", path)
        if offset + ref.nbytes > size:
            raise InputError(
                f"truncated: storage {ref.key!r} needs bytes up to {offset + ref.nbytes}, file has {size}",
                path,
            )
        return offset

    return locate


def _read_zip(path: str, handle: io.BufferedReader) -> tuple[object, dict[str, StorageRef], LocateStorage]:
    try:
        archive = zipfile.ZipFile(handle)
        prefix = _zip_prefix(archive, path)
        byteorder = f"{prefix}/byteorder"
        if byteorder in archive.namelist() and _read_member(archive, byteorder, 16, path) != b"little":
            raise UnsupportedFormatError("big-endian checkpoints are not supported", path)
        data = _read_member(archive, f"{prefix}/data.pkl", MAX_PICKLE_BYTES, path)
    except _ZIP_ERRORS as exc:
        raise InputError(f"not a readable zip archive ({exc})", path) from None
    root, storages = load_pickle(io.BytesIO(data), path, f"{prefix}/data.pkl")
    return root, storages, _zip_locator(archive, prefix, handle, path)


def _legacy_header(handle: io.BufferedReader, path: str) -> None:
    magic, _ = load_pickle(handle, path, "the magic number")
    version, _ = load_pickle(handle, path, "the protocol version")
    sys_info, _ = load_pickle(handle, path, "the system info")
    if magic != MAGIC_NUMBER or version != PROTOCOL_VERSION:
        raise InputError(f"not a legacy torch file (magic {magic!r}, protocol {version!r})", path)
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise UnsupportedFormatError("big-endian (or unmarked) legacy checkpoints are not supported", path)


def _legacy_offsets(handle: io.BufferedReader, storages: dict[str, StorageRef], path: str) -> dict[str, int]:
    keys, _ = load_pickle(handle, path, "the storage key list")
    if not (isinstance(keys, list) and all(isinstance(key, str) for key in keys)) or len(set(keys)) != len(
        keys
    ):
        raise InputError("the storage key list is not a list of distinct strings", path)
    size = os.fstat(handle.fileno()).st_size
    position = handle.tell()
    offsets: dict[str, int] = {}
    for key in keys:
        ref = storages.get(key)
        if ref is None:
            raise InputError(f"storage key {key[:40]!r} is listed but no tensor refers to it", path)
        handle.seek(position)
        prefix = handle.read(8)
        numel = struct.unpack("<q", prefix)[0] if len(prefix) == 8 else -1
        if numel != ref.numel:
            raise InputError(f"storage {key!r} at byte {position}: size {numel}, expected {ref.numel}", path)
        offsets[key] = position + 8
        position += 8 + ref.nbytes  # seek past the bytes without reading them
        if position > size:
            raise InputError(f"truncated: storage {key!r} runs to byte {position}, the file has {size}", path)
    return offsets


def _read_legacy(path: str, handle: io.BufferedReader) -> tuple[object, dict[str, StorageRef], LocateStorage]:
    _legacy_header(handle, path)
    root, storages = load_pickle(handle, path, "the object pickle")
    offsets = _legacy_offsets(handle, storages, path)

    def locate(ref: StorageRef) -> int:
        if ref.key not in offsets:
            raise InputError(f"storage {ref.key!r} is referenced but its bytes are not in the file", path)
        return offsets[ref.key]

    return root, storages, locate


def key_name(key: object) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    return reprlib.repr(key)  # bounded depth and length, unlike str() of a hostile key


def _children(value: object) -> Iterator[tuple[str, object]] | None:
    if isinstance(value, dict):
        return ((key_name(key), item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ((str(index), item) for index, item in enumerate(value))
    return None


def flatten(root: object, path: str) -> list[Entry]:
    """Leaves of root with dotted names, in pickle order; cycles and runaway nesting are InputErrors."""
    entries: list[Entry] = []
    open_containers: set[int] = set()
    visits = 0

    def walk(name: str, value: object, depth: int) -> None:
        nonlocal visits
        visits += 1
        if visits > MAX_VISITS:
            raise InputError(f"more than {MAX_VISITS} entries (or shared containers) in the checkpoint", path)
        children = _children(value)
        if children is None:
            entries.append(Entry(name or ROOT_NAME, value))
            return
        if depth > MAX_DEPTH:
            raise InputError(f"containers nested deeper than {MAX_DEPTH} levels at {name!r}", path)
        if id(value) in open_containers:
            raise InputError(f"container {name!r} contains itself", path)
        open_containers.add(id(value))
        for key, item in children:
            walk(f"{name}.{key}" if name else key, item, depth + 1)
        open_containers.discard(id(value))

    walk("", root, 0)
    return entries


def _skip_reason(value: object) -> str:
    if isinstance(value, Opaque):
        return f"{value.kind} leaf"
    if isinstance(value, DtypeToken):
        return "torch.dtype leaf"
    if isinstance(value, StorageRef):
        return "bare storage leaf (not a tensor)"
    if isinstance(value, TensorRecord) and value.dtype not in ITEMSIZE:
        return f"tensor of dtype {value.dtype}, which tieaudit cannot view"
    if isinstance(value, TensorRecord):
        return f"tensor with {'/'.join(sorted(value.flags))} bit set: stored bytes are not its values"
    return f"{'None' if value is None else type(value).__name__} leaf"


def _check_view(name: str, record: TensorRecord, path: str) -> None:
    size = itemsize(record.dtype)
    last = sum((dim - 1) * stride for dim, stride in zip(record.shape, record.strides, strict=True))
    numel_zero = any(dim == 0 for dim in record.shape)
    end = record.offset * size if numel_zero else (record.offset + last + 1) * size
    if end > record.storage.nbytes:
        raise InputError(
            f"tensor {name!r} reaches byte {end} of storage {record.storage.key!r}, "
            f"which holds {record.storage.nbytes}",
            path,
        )


def _storage_infos(
    storages: dict[str, StorageRef], tensors: list[TensorInfo], locate: LocateStorage, file: str
) -> dict[str, StorageInfo]:
    # An untyped storage (float8, uint16, ...) takes the dtype of the first tensor viewing it.
    viewed_as: dict[str, str] = {}
    for tensor in tensors:
        viewed_as.setdefault(tensor.storage_id, tensor.dtype)
    return {
        key: StorageInfo(
            key, file, locate(ref), ref.nbytes, ref.dtype if ref.typed else viewed_as.get(key, "uint8")
        )
        for key, ref in storages.items()
    }


def build_checkpoint(
    path: str, root: object, storages: dict[str, StorageRef], locate: LocateStorage
) -> Checkpoint:
    """Turn the unpickled object into a Checkpoint: tensors, storages located in the file, skipped leaves."""
    file = os.path.basename(path)
    tensors: list[TensorInfo] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for entry in flatten(root, path):
        record = entry.value
        if entry.name in seen:
            skipped.append(Skipped(entry.name, "name already used by an earlier entry"))
        elif isinstance(record, TensorRecord) and not record.flags and record.dtype in ITEMSIZE:
            offset = record.offset * itemsize(record.dtype)
            check_viewable(entry.name, record.shape, record.strides, itemsize(record.dtype), offset, path)
            _check_view(entry.name, record, path)
            info = TensorInfo(
                entry.name, record.dtype, record.shape, record.strides, record.storage.key, offset, file
            )
            tensors.append(info)
        else:
            skipped.append(Skipped(entry.name, _skip_reason(record)))
        seen.add(entry.name)
    return Checkpoint(
        path=path,
        format="torch",
        tensors=tuple(tensors),
        storages=_storage_infos(storages, tensors, locate, file),
        store=ByteStore(os.path.dirname(os.path.abspath(path))),
        skipped=tuple(skipped),
        files=(file,),
    )


class CappedReader(io.BufferedReader):
    """A file whose reads stop at its end.

    The legacy format hands the file itself to the unpickler: a length prefix claiming more bytes
    than the file holds then fails as truncated instead of having the claimed size allocated first.
    """

    def __init__(self, raw: io.FileIO) -> None:
        super().__init__(raw)
        self.end = os.fstat(raw.fileno()).st_size

    def read(self, size: int | None = -1) -> bytes:
        if size is not None and size > 0:
            size = min(size, max(0, self.end - self.tell()))
        return super().read(size)


def open_capped(path: str) -> CappedReader:
    """path opened for reading, with reads capped at the end of the file."""
    raw = io.FileIO(path, "r")
    try:
        return CappedReader(raw)
    except BaseException:
        raw.close()
        raise


class TorchReader(Reader):
    """torch.save files, zip or legacy, recognised by content rather than suffix."""

    format = "torch"

    def sniff(self, path: str, head: bytes) -> bool:
        return _is_zip(path, head) or _is_legacy(head)

    def read(self, path: str) -> Checkpoint:
        try:
            with open_capped(path) as handle:
                head = handle.read(64)
                handle.seek(0)
                if head.startswith(ZIP_MAGIC):
                    root, storages, locate = _read_zip(path, handle)
                elif _is_legacy(head):
                    root, storages, locate = _read_legacy(path, handle)
                else:
                    raise UnsupportedFormatError("not a torch.save file (neither zip nor legacy magic)", path)
                return build_checkpoint(path, root, storages, locate)
        except IsADirectoryError:
            raise InputError("is a folder, not a torch.save file", path) from None
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
