"""torch's pre-0.4 tar checkpoints, listed as Python's tarfile lists them: read-only, bounded, not extracted.

torch.load hands a file that is no zip to ``_legacy_load``, which first tries
``tarfile.open(fileobj=f, mode="r:")`` (torch 2.13, ``torch/serialization.py``, ``legacy_load``).
That succeeds when the first 512 bytes are a header whose checksum tarfile accepts (no ``ustar``
magic is needed), and then ``torch.load(weights_only=True)`` refuses the file at once ("Cannot use
``weights_only=True`` with files saved in the legacy .tar format"). ``weights_only=False`` goes on
and unpickles three members (``torch_tar_walk``); ``sys_info`` is never unpickled. When listing the
members fails (``tarfile.ReadError``: a member runs past the end of the file, a GNU long name is
followed by no header), torch reads the file as the legacy stream instead, from byte 0.

The archive is listed as tarfile lists it, through a memory map: each header with tarfile's own
512-byte parser (``TarInfo.frombuf``), offsets as tarfile advances them, the list ending where
tarfile's ends (a zero block, a bad header), the last member of a name winning. Every size read from
the file is checked against the file before it is used; GNU long names are read up to
MAX_TAR_NAME_BYTES; PAX headers and sparse members (which Python versions parse differently) are
refused by name, and so is an archive of more than MAX_TAR_MEMBERS members.
"""

from __future__ import annotations

import mmap
import tarfile
from dataclasses import dataclass, field

from tieaudit.core.errors import InputError
from tieaudit.core.escape import printable

__all__ = [
    "MAX_TAR_MEMBERS",
    "MAX_TAR_NAME_BYTES",
    "TAR_BLOCK",
    "Listing",
    "TarMember",
    "TarRefused",
    "OPEN_BYTES",
    "is_tar_header",
    "list_members",
    "opens_as_tar",
    "shown",
]

TAR_BLOCK = tarfile.BLOCKSIZE
"""A tar header, and the unit member data is padded to (512 bytes)."""
MAX_TAR_MEMBERS = 4096
"""Members listed in one archive: torch < 0.4 wrote four (sys_info, pickle, tensors, storages). The
member torch reads is a name's last occurrence, so past this the listing cannot say which it is."""
MAX_TAR_NAME_BYTES = 4096
"""Longest GNU long name (or long link name) record read: PATH_MAX; tarfile itself reads any length."""
MAX_GNU_RECORDS = 2
"""GNU long name records in a row before one member: GNU tar writes at most a long link name and a
long name."""
OPEN_BYTES = MAX_GNU_RECORDS * (2 * TAR_BLOCK + MAX_TAR_NAME_BYTES) + TAR_BLOCK
"""Bytes that decide whether tarfile opens a file: its first header, with the GNU long name records
(each a header and at most MAX_TAR_NAME_BYTES, padded) before it."""
_ENCODING = ("utf-8", "surrogateescape")
"""How tarfile decodes names by default (the file system encoding, with surrogateescape)."""
_GNU_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_REFUSED_TYPES = {
    tarfile.GNUTYPE_SPARSE: "a GNU sparse member",
    tarfile.XHDTYPE: "a PAX extended header",
    tarfile.XGLTYPE: "a PAX global header",
    tarfile.SOLARIS_XHDTYPE: "a Solaris extended header",
}
"""Header types whose processing differs between Python versions (PAX records, sparse maps)."""


class TarRefused(InputError):
    """The archive holds something tieaudit does not list (a limit, a PAX header, a sparse member)."""


class _HeaderEnd(Exception):
    """No header here (a zero block, a bad checksum, the end of the file): tarfile's list ends."""


class _ListingFails(Exception):
    """tarfile raises ReadError while listing (torch then reads the file as a legacy stream)."""


@dataclass(frozen=True, kw_only=True)
class TarMember:
    """One member as tarfile lists it."""

    name: str
    """Its name as tarfile decodes it (utf-8, surrogateescape)."""
    type: bytes
    """The header's type byte (tarfile's, after its V7 directory rule)."""
    header: int
    """Where its (first) header starts."""
    data: int
    """Where its data starts."""
    size: int
    """Its size field, in bytes (non-negative: a negative one is refused)."""

    @property
    def end(self) -> int:
        return self.data + self.size

    def kind(self) -> str:
        """``regular`` (what tarfile extracts as a file, unknown types included), ``folder``, ``link``
        or ``device`` (character, block, FIFO)."""
        if self.type == tarfile.DIRTYPE:
            return "folder"
        if self.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            return "link"
        if self.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
            return "device"
        return "regular"


@dataclass
class Listing:
    """The members tarfile lists, by name (the last of a name), and whether listing them fails."""

    members: dict[str, TarMember] = field(default_factory=dict)
    failed: str = ""
    """Why tarfile's listing raises ReadError ("" when it lists to the end)."""


def shown(name: str) -> str:
    """A member name for a message, quoted, escaped (``core.escape.printable``), cut to 120 characters."""
    return "'" + printable(name if len(name) <= 120 else name[:120] + "...") + "'"


def _header(block: bytes) -> tarfile.TarInfo:
    """tarfile's own parse of a 512-byte header (checksum, octal and base-256 fields, ustar prefix)."""
    try:
        return tarfile.TarInfo.frombuf(block, *_ENCODING)
    except tarfile.HeaderError:
        raise _HeaderEnd from None


def is_tar_header(block: bytes) -> bool:
    """block (a file's first 512 bytes) is a header tarfile accepts: the file may be a tar archive."""
    try:
        _header(block)
    except _HeaderEnd:
        return False
    return True


def opens_as_tar(start: bytes) -> bool:
    """``tarfile.open(mode="r:")`` succeeds on a file starting with start (at least OPEN_BYTES of
    it, or all of it): its first member's header, and a GNU long name record's next header, parse.
    Then torch.load opens it as a tar archive (a zip aside); otherwise it reads the legacy stream.
    A first header tieaudit refuses (PAX, sparse, over a limit) counts as a tar: refused, not passed."""
    try:
        _Lister(start, len(start), "").member(0)
    except (_HeaderEnd, _ListingFails):
        return False
    except TarRefused:
        return True
    return True


def _blocks(count: int) -> int:
    return -(-count // TAR_BLOCK) * TAR_BLOCK


class _Lister:
    """Lists one archive mapped in data (size bytes)."""

    def __init__(self, data: mmap.mmap | bytes, size: int, path: str) -> None:
        self.data = data
        self.size = size
        self.path = path

    def _refuse(self, what: str, at: int) -> TarRefused:
        return TarRefused(f"a tar archive with {what} at byte {at}, which tieaudit does not read", self.path)

    def member(self, at: int, records: int = 0) -> tuple[TarMember, int]:
        """The member whose header (or first GNU long name record) starts at byte at, and where
        tarfile looks for the next header (its data padded to 512 bytes past its header)."""
        info = _header(bytes(self.data[at : at + TAR_BLOCK]) if at < self.size else b"")
        if info.size < 0:
            raise self._refuse(f"a negative size field ({info.size})", at)
        if info.type in _REFUSED_TYPES:
            raise self._refuse(_REFUSED_TYPES[info.type], at)
        if info.type in _GNU_LONG:
            return self._gnu_long(info, at, records)
        data = at + TAR_BLOCK
        regular = info.isreg() or info.type not in tarfile.SUPPORTED_TYPES
        following = data + _blocks(info.size) if regular else data
        return TarMember(name=info.name, type=info.type, header=at, data=data, size=info.size), following

    def _gnu_long(self, info: tarfile.TarInfo, at: int, records: int) -> tuple[TarMember, int]:
        """tarfile's _proc_gnulong: the record's bytes, then the next header, which takes the name."""
        if records >= MAX_GNU_RECORDS:
            raise self._refuse(f"more than {MAX_GNU_RECORDS} GNU long name records in a row", at)
        if info.size > MAX_TAR_NAME_BYTES:
            limit = f"over MAX_TAR_NAME_BYTES, {MAX_TAR_NAME_BYTES}"
            raise self._refuse(f"a GNU long name record of {info.size} bytes ({limit})", at)
        start = at + TAR_BLOCK
        raw = bytes(self.data[start : min(start + _blocks(info.size), self.size)])
        try:
            following, offset = self.member(start + len(raw), records + 1)
        except _HeaderEnd:
            raise _ListingFails(f"the GNU long name record at byte {at} is followed by no header") from None
        if info.type == tarfile.GNUTYPE_LONGNAME:
            name = raw.split(b"\0", 1)[0].decode(*_ENCODING)
            if following.type == tarfile.DIRTYPE:
                name = name.removesuffix("/")
            following = TarMember(
                name=name, type=following.type, header=at, data=following.data, size=following.size
            )
        return following, offset

    def listing(self) -> Listing:
        """Every member, as tarfile's getmembers lists them (and whether that raises ReadError)."""
        found = Listing()
        offset = listed = 0
        while True:
            try:
                member, following = self.member(offset)
            except _HeaderEnd:
                if offset == 0:
                    found.failed = "its first block is no tar header"
                return found  # tarfile's list ends at a zero block or a bad header
            except _ListingFails as failed:
                found.failed = str(failed)
                return found
            listed += 1
            if listed > MAX_TAR_MEMBERS:
                raise self._refuse(f"more than {MAX_TAR_MEMBERS} members (MAX_TAR_MEMBERS)", member.header)
            found.members.pop(member.name, None)  # the last of a name wins, and lists last
            found.members[member.name] = member
            if following > self.size:
                found.failed = (
                    f"member {shown(member.name)} runs to byte {following}, past the end of the file "
                    f"({self.size} bytes)"
                )
                return found
            offset = following


def list_members(data: mmap.mmap | bytes, size: int, path: str) -> Listing:
    """The archive's members as tarfile lists them; TarRefused for what tieaudit does not list."""
    return _Lister(data, size, path).listing()
