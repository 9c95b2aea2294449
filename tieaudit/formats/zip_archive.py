"""A strict zip reader: only archives laid out the way torch.save writes them, read the way torch does.

torch reads its archives with miniz (``caffe2/serialize/inline_container.cc``), Python's zipfile
reads them another way: zipfile shifts every offset by data prepended to the archive and tolerates
gaps, miniz takes offsets as written; miniz finds members case-insensitively, zipfile exactly.
Rather than choose one reading, this module accepts only archives on which every reader agrees:

- the records tile the file: the first local header at byte 0, each member's data (and its data
  descriptor, when flagged) followed directly by the next local header, the central directory
  right after the last member, then the zip64 end records when present and the end record, which
  ends the file (nothing prepended, appended, glued or uncovered);
- local and central headers agree (name, flags, method, sizes or a matching data descriptor);
- no two names fold to the same name under miniz's case-insensitive lookup;
- every count, size and offset is checked against the file's size and a named limit before use.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.escape import printable

MAX_MEMBERS = 1_000_000
"""Members in one archive: one per storage, so a 1 TB training checkpoint has a few hundred thousand."""
MAX_CENTRAL_DIRECTORY_BYTES = 256 << 20
"""Size of the central directory: a million members with 200-byte names fit."""
MAX_INFLATION_RATIO = 8
"""How many times its compressed size a deflated member may inflate to. torch.save never compresses;
a re-zipped data.pkl deflates 1.2 to 5 times (the corpus, 10000-name state dicts), a zip bomb a
thousand times. Keeps a 64 KB archive's pickle under about 0.5 MB."""
INFLATION_SLACK = 4096
"""Bytes any deflated member may inflate to whatever its ratio (tiny records compress well)."""

PRELOAD_BYTES = 16 << 20
"""A records region (everything before the central directory) this small is read at once."""

LOCAL_MAGIC = b"PK\x03\x04"
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_END = struct.Struct("<4sHHHHIIH")
_END64 = struct.Struct("<4sQHHIIQQQQ")
_LOCATOR = struct.Struct("<4sIQI")
_FLAGS_ALLOWED = 0x0002 | 0x0004 | 0x0008 | 0x0800
"""Deflate options, data descriptor, UTF-8 names: encryption, patches and masking are refused."""
_DESCRIPTOR = 0x0008
_MARKER32 = 0xFFFFFFFF
_AMBIGUOUS = "torch and tieaudit could read different data"


def shown(name: bytes) -> str:
    """A member name as a user reads it (undecodable bytes and control characters escaped)."""
    return printable(name.decode("utf-8", "surrogateescape"))


@dataclass(frozen=True, kw_only=True)
class ZipMember:
    """One member, located and checked."""

    name: bytes
    """The name as stored (bytes: torch compares bytes)."""
    method: int
    """0 stored, 8 deflated."""
    flags: int
    """General purpose bits."""
    crc: int
    """CRC-32 the headers declare (torch does not check it)."""
    compressed_size: int
    """Bytes of (compressed) data in the file."""
    size: int
    """Bytes once inflated."""
    header_offset: int
    """Where its local header starts."""
    data_offset: int
    """Where its data starts."""


@dataclass(frozen=True)
class ZipArchive:
    """Members in central-directory order, and miniz's case-insensitive lookup."""

    members: tuple[ZipMember, ...]
    """As the central directory lists them (torch takes its prefix from the first)."""
    folded: dict[bytes, ZipMember]
    """Members by ASCII-lowercased name, as miniz's ``mz_zip_reader_locate_file`` finds them."""

    def find(self, name: str) -> ZipMember | None:
        """The member torch finds for name (case-insensitively), or None."""
        return self.folded.get(name.encode("utf-8", "surrogatepass").lower())


def pread(fd: int, size: int, offset: int) -> bytes:
    """Exactly size bytes at offset, or fewer only at the end of the file."""
    chunks = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 30), offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


ReadAt = Callable[[int, int], bytes]
"""(size, offset) -> the bytes there (fewer only at the end of the file)."""


def _reader(fd: int, records_end: int) -> ReadAt:
    """Reads of the records region: from one read of it when small (many small members cost one
    system call, not three each), else one pread per header."""
    if records_end > PRELOAD_BYTES:
        return lambda size, offset: pread(fd, size, offset)
    region = pread(fd, records_end, 0)
    return lambda size, offset: region[offset : offset + size]


def _fail(message: str, path: str) -> InputError:
    return InputError(message, path)


def _member(name: bytes, problem: str, path: str) -> InputError:
    """An error about one member; the name is escaped only when an error is raised."""
    return InputError(f"zip member {shown(name)!r}{'' if problem.startswith(':') else ' '}{problem}", path)


def _unsafe_member(name: bytes, problem: str, path: str) -> UnsafeInputError:
    return UnsafeInputError(f"zip member {shown(name)!r} {problem}", path)


def _end_records(fd: int, size: int, path: str) -> tuple[int, int, int, int]:
    """(entries, central directory size, its offset, where it must end), from the end records."""
    if size < _END.size + _LOCAL.size:
        raise _fail("too short to be a zip archive", path)
    magic, disk, cd_disk, here, total, cd_size, cd_offset, comment = _END.unpack(
        pread(fd, _END.size, size - 22)
    )
    if magic != b"PK\x05\x06" or comment:
        raise _fail(
            "the zip archive does not end with its end-of-central-directory record (data appended, "
            f"a comment, or two archives glued together); {_AMBIGUOUS}",
            path,
        )
    if disk or cd_disk or here != total:
        raise _fail("a multi-disk zip archive, which torch does not read", path)
    end = size - _END.size
    locator = pread(fd, _LOCATOR.size, end - _LOCATOR.size) if end >= _LOCATOR.size + _END64.size else b""
    if not locator.startswith(b"PK\x06\x07"):
        return total, cd_size, cd_offset, end
    _, locator_disk, record_offset, disks = _LOCATOR.unpack(locator)
    end = end - _LOCATOR.size - _END64.size
    if locator_disk or disks != 1 or record_offset != end:
        raise _fail(
            "the zip64 end record is not where its locator says (data prepended, or two archives glued "
            f"together); {_AMBIGUOUS}",
            path,
        )
    magic, record_size, _, _, disk64, cd_disk64, here64, total64, cd_size64, cd_offset64 = _END64.unpack(
        pread(fd, _END64.size, end)
    )
    if magic != b"PK\x06\x06" or record_size != _END64.size - 12:
        raise _fail(f"the zip64 end record is malformed; {_AMBIGUOUS}", path)
    if disk64 or cd_disk64 or here64 != total64:
        raise _fail("a multi-disk zip archive, which torch does not read", path)
    for short, long, marker in (
        (total, total64, 0xFFFF),
        (cd_size, cd_size64, _MARKER32),
        (cd_offset, cd_offset64, _MARKER32),
    ):
        if short not in (long, marker):
            raise _fail(f"the zip end record and the zip64 end record disagree; {_AMBIGUOUS}", path)
    return total64, cd_size64, cd_offset64, end


def _zip64_fields(extra: bytes, wanted: list[str], path: str, *, name: bytes) -> dict[str, int]:
    """The zip64 extended-information values for the 0xFFFFFFFF fields, in the spec's order."""
    found: dict[str, int] = {}
    position = 0
    while position < len(extra):
        if position + 4 > len(extra):
            raise _fail(f"zip member {shown(name)!r} has a malformed extra field", path)
        field_id, length = struct.unpack_from("<HH", extra, position)
        if position + 4 + length > len(extra):
            raise _fail(f"zip member {shown(name)!r} has a malformed extra field", path)
        if field_id == 1 and not found and wanted:
            if length != 8 * len(wanted):
                raise _fail(f"zip member {shown(name)!r} has a malformed zip64 field", path)
            found = dict(
                zip(wanted, struct.unpack_from(f"<{len(wanted)}Q", extra, position + 4), strict=True)
            )
        position += 4 + length
    if wanted and not found:
        raise _fail(f"zip member {shown(name)!r} lacks the zip64 field its sizes call for", path)
    return found


def _central_members(directory: bytes, count: int, path: str) -> list[tuple[ZipMember, bool]]:
    """Members as the central directory declares them (data offsets not yet known)."""
    members: list[tuple[ZipMember, bool]] = []
    position = 0
    for _ in range(count):
        if position + _CENTRAL.size > len(directory):
            raise _fail("the zip central directory is shorter than its entry count", path)
        fields = _CENTRAL.unpack_from(directory, position)
        magic, _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len, comment_len = fields[:13]
        disk, _, external, offset = fields[13:]
        start = position + _CENTRAL.size
        position = start + name_len + extra_len + comment_len
        if magic != b"PK\x01\x02" or position > len(directory):
            raise _fail("the zip central directory is malformed", path)
        name = directory[start : start + name_len]
        wanted = [k for k, v in (("size", usize), ("csize", csize), ("offset", offset)) if v == _MARKER32]
        if wanted or extra_len:
            extra = directory[start + name_len : start + name_len + extra_len]
            big = _zip64_fields(extra, wanted, path, name=name)
            usize, csize, offset = big.get("size", usize), big.get("csize", csize), big.get("offset", offset)
        _check_entry(name, flags, method, disk=disk, external=external, csize=csize, usize=usize, path=path)
        member = ZipMember(
            name=name,
            method=method,
            flags=flags,
            crc=crc,
            compressed_size=csize,
            size=usize,
            header_offset=offset,
            data_offset=-1,
        )
        members.append((member, bool(wanted)))
    if position != len(directory):
        raise _fail("the zip central directory has bytes no entry covers", path)
    return members


def _check_entry(
    name: bytes, flags: int, method: int, *, disk: int, external: int, csize: int, usize: int, path: str
) -> None:
    if not name or b"\x00" in name:
        raise _member(name, f"has an empty name or a NUL byte in it; {_AMBIGUOUS}", path)
    dotdot = b".." in name and b".." in name.replace(b"\\", b"/").split(b"/")
    if name.startswith((b"/", b"\\")) or dotdot or (len(name) > 1 and name[1:2] == b":"):
        raise _unsafe_member(name, "leaves the archive (absolute path or '..')", path)
    if name.endswith(b"/") or external & 0x10:
        raise _member(name, "is marked as a folder; torch would read no bytes for it", path)
    if flags & 1:
        raise _member(name, "is encrypted", path)
    if flags & ~_FLAGS_ALLOWED:
        raise _member(name, f"uses zip features torch.save never writes (flags 0x{flags:04x})", path)
    if method not in (0, 8):
        raise _member(name, f"uses compression method {method}, which torch.save never writes", path)
    if disk:
        raise _fail("a multi-disk zip archive, which torch does not read", path)
    if (method == 0 and csize != usize) or (usize and not csize):
        raise _member(name, "declares sizes that cannot both be right", path)


def _local(read: ReadAt, member: ZipMember, zip64: bool, *, size: int, path: str) -> ZipMember:
    """The member with its data offset, after checking its local header agrees with the central one."""
    if member.header_offset + _LOCAL.size + len(member.name) > size:
        raise _member(member.name, "starts past the end of the file", path)
    raw = read(_LOCAL.size + len(member.name), member.header_offset)
    magic, _, flags, method, _, _, crc, csize, usize, name_len, extra_len = _LOCAL.unpack_from(raw)
    if magic != LOCAL_MAGIC or raw[_LOCAL.size :] != member.name or name_len != len(member.name):
        raise _member(member.name, f"has no matching local header; {_AMBIGUOUS}", path)
    if flags != member.flags or method != member.method:
        raise _member(member.name, f": local and central headers disagree; {_AMBIGUOUS}", path)
    declared = (crc, csize, usize)
    expected = (member.crc, member.compressed_size, member.size)
    if (csize, usize) == (_MARKER32, _MARKER32) and zip64:
        extra = read(extra_len, member.header_offset + _LOCAL.size + name_len)
        big = _zip64_fields(extra, ["size", "csize"], path, name=member.name)
        declared = (crc, big["csize"], big["size"])
    if declared != expected and not (flags & _DESCRIPTOR and declared == (0, 0, 0)):
        raise _member(member.name, f": local and central headers disagree on its size; {_AMBIGUOUS}", path)
    return dataclasses.replace(member, data_offset=member.header_offset + _LOCAL.size + name_len + extra_len)


def _descriptor_ok(read: ReadAt, member: ZipMember, gap: int) -> bool:
    """Whether the gap after member's data holds exactly its data descriptor."""
    raw = read(gap, member.data_offset + member.compressed_size)
    if gap in (16, 24) and raw.startswith(b"PK\x07\x08"):
        raw = raw[4:]
    if len(raw) == 12:
        return struct.unpack("<III", raw) == (member.crc, member.compressed_size, member.size)
    return len(raw) == 20 and struct.unpack("<IQQ", raw) == (member.crc, member.compressed_size, member.size)


def _tile(read: ReadAt, members: list[ZipMember], cd_offset: int, *, path: str) -> None:
    """Every byte before the central directory belongs to exactly one record."""
    ordered = sorted(members, key=lambda m: m.header_offset)
    if not ordered or ordered[0].header_offset != 0:
        raise _fail(
            "the zip records do not start at byte 0 (data prepended, or two archives glued together); "
            + _AMBIGUOUS,
            path,
        )
    for member, following in zip(ordered, [*(m.header_offset for m in ordered[1:]), cd_offset], strict=True):
        gap = following - (member.data_offset + member.compressed_size)
        if gap < 0:
            raise _member(member.name, f"overlaps the next record of the archive; {_AMBIGUOUS}", path)
        if gap and not (
            member.flags & _DESCRIPTOR and gap in (12, 16, 20, 24) and _descriptor_ok(read, member, gap)
        ):
            raise _member(member.name, f"is followed by {gap} bytes no record covers; {_AMBIGUOUS}", path)
        if not gap and member.flags & _DESCRIPTOR and member.compressed_size:
            raise _member(member.name, f"lacks the data descriptor its flags announce; {_AMBIGUOUS}", path)


def _fold(members: list[ZipMember], path: str) -> dict[bytes, ZipMember]:
    folded: dict[bytes, ZipMember] = {}
    for member in members:
        key = member.name.lower()  # bytes.lower() folds ASCII only, like miniz's MZ_TOLOWER
        other = folded.setdefault(key, member)
        if other is member:
            continue
        if other.name == member.name:
            raise _fail(f"zip member {shown(member.name)!r} appears more than once; {_AMBIGUOUS}", path)
        raise _fail(
            f"two zip members differ only in letter case ({shown(other.name)!r}, {shown(member.name)!r}); "
            f"{_AMBIGUOUS}",
            path,
        )
    return folded


def read_archive(fd: int, size: int, path: str) -> ZipArchive:
    """The archive in the open file fd of size bytes, or an InputError saying what is wrong."""
    if pread(fd, 4, 0) != LOCAL_MAGIC:
        raise _fail(f"the zip records do not start at byte 0; {_AMBIGUOUS}", path)
    count, cd_size, cd_offset, cd_end = _end_records(fd, size, path)
    if count > MAX_MEMBERS:
        raise _fail(f"the zip archive lists {count} members; at most {MAX_MEMBERS} are read", path)
    if cd_size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise _fail(
            f"the zip central directory is {cd_size} bytes; at most {MAX_CENTRAL_DIRECTORY_BYTES} are read",
            path,
        )
    if cd_offset + cd_size != cd_end or cd_size < count * _CENTRAL.size:
        raise _fail(
            "the zip central directory is not where the end record says (data prepended, or two "
            f"archives glued together); {_AMBIGUOUS}",
            path,
        )
    central = _central_members(pread(fd, cd_size, cd_offset), count, path)
    read = _reader(fd, cd_offset)
    members = []
    for member, zip64 in central:
        if member.header_offset >= cd_offset or member.compressed_size > cd_offset:
            raise _fail(f"zip member {shown(member.name)!r} lies outside the archive's records", path)
        members.append(_local(read, member, zip64, size=cd_offset, path=path))
    _tile(read, members, cd_offset, path=path)
    return ZipArchive(tuple(members), _fold(members, path))


def read_member(fd: int, member: ZipMember, limit: int, *, path: str) -> bytes:
    """The member's bytes (inflated when deflated), refusing more than limit or a likely zip bomb."""
    if member.size > limit:
        raise _member(member.name, f"is larger than {limit} bytes", path)
    if member.method == 0:
        return pread(fd, member.size, member.data_offset)
    if member.compressed_size > limit:
        raise _member(member.name, f"is larger than {limit} bytes", path)
    if member.size > MAX_INFLATION_RATIO * member.compressed_size + INFLATION_SLACK:
        ratio = member.size // max(member.compressed_size, 1)
        raise _member(
            member.name,
            f"claims to inflate {ratio} times its compressed size (more than {MAX_INFLATION_RATIO}); "
            "refusing a likely zip bomb",
            path,
        )
    inflater = zlib.decompressobj(-15)
    try:
        data = inflater.decompress(pread(fd, member.compressed_size, member.data_offset), member.size + 1)
    except zlib.error as exc:
        raise _member(member.name, f"does not inflate ({exc})", path) from None
    if len(data) != member.size or not inflater.eof:
        raise _member(member.name, f"does not inflate to the {member.size} bytes it declares", path)
    return data
