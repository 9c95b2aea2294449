"""What ``torch.load(weights_only=False)`` unpickles from a pre-0.4 tar checkpoint, walked; nothing runs.

torch 2.13's ``legacy_load`` (``torch/serialization.py``) lists the archive (``torch_tar``), then
calls ``pickle.load`` on three members, in this order, with the full unpickler:

- ``storages`` (extracted): a count; per storage a ``(key, location, storage type)`` pickle, then an
  8-byte element count and the elements (their size: the storage type's dtype); then a list of views;
- ``tensors`` (extracted): a count; per tensor a ``(key, storage id, tensor type)`` pickle, then a
  4-byte dimension count, 4 bytes skipped, the sizes, strides and offset as 8-byte integers;
- ``pickle`` (``extractfile``): the object, with a persistent_load for storages and tensors.

``sys_info`` is never unpickled. A missing member is a KeyError, and a pickle the unpickler fails on
or bytes past a member's end end torch.load there: nothing after them is unpickled. Every pickle is
walked (``pickle_walk``); a count and a storage type are read with tieaudit's pickle VM (inert,
torch's weights_only opcodes). Where tieaudit cannot follow (a VM refusal, a walk past its bounds, a
link or device member whose bytes torch reads from outside the archive, more than MAX_TAR_RECORDS
records) the rest of that member is not walked, the later members still are, and the file is never
passed. When the listing fails, torch reads the file from byte 0 as a legacy stream: that is walked
too, always.
"""

from __future__ import annotations

import mmap
import os
import tarfile
from dataclasses import dataclass, field

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import ITEMSIZE
from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.formats.pickle_globals import Named
from tieaudit.formats.pickle_vm import Truncated
from tieaudit.formats.pickle_walk import Walk, walk_pickle, walk_pickles
from tieaudit.formats.torch_pickle import MAX_PICKLE_BYTES, load_pickle
from tieaudit.formats.torch_records import StorageType
from tieaudit.formats.torch_tar import MAX_TAR_MEMBERS, Listing, TarMember, TarRefused, list_members, shown
from tieaudit.formats.walked import (
    UNFINISHED,
    UnwalkedPickle,
    code_checkpoint,
    merge_named,
    runs_code,
)

__all__ = ["MAX_RECORD_PICKLE_BYTES", "MAX_TAR_RECORDS", "TAR_REFUSED", "TarScan", "read_tar", "scan_tar"]

MAX_TAR_RECORDS = 1_000_000
"""Storages or tensors one member may count: one per parameter and buffer of a torch < 0.4 model,
which had thousands."""
MAX_RECORD_PICKLE_BYTES = 64 << 10
"""Longest count or storage record pickle read for its value: torch wrote about 60 bytes."""
TAR_REFUSED = "it is a pre-0.4 tar checkpoint, which torch.load(weights_only=True) refuses"
"""Why tieaudit reads no tensors from one (``PickleGlobal.refused``)."""
NO_CODE = (
    "a pre-0.4 torch tar checkpoint: torch.load(weights_only=True) refuses it and tieaudit reads no "
    "tensors from it; the pickles torch.load(weights_only=False) would unpickle from it name no code"
)
NOT_TORCH = (
    "a tar archive without torch's 'storages' member: torch.load(weights_only=True) refuses any tar "
    "archive, and weights_only=False fails on it unpickling nothing"
)
_PLAIN = (type(None), bool, int, float, str, bytes, tuple, list, dict)
"""Values whose ``_dtype`` or ``__index__`` torch asks for in vain: the load fails there."""


class _Stop(Exception):
    """torch.load fails here: nothing after it is unpickled."""


class _Lost(Exception):
    """tieaudit cannot follow the member past here (why: the message)."""


@dataclass
class TarScan:
    """What walking a tar file found."""

    named: dict[str, Named] = field(default_factory=dict)
    """Every global the pickles torch.load(weights_only=False) would unpickle name."""
    lost: list[str] = field(default_factory=list)
    """Where tieaudit could not follow what torch reads (then code cannot be ruled out)."""
    reason: str = NO_CODE
    """Why the file is refused (or skipped in a folder) when it names no code and nothing was lost."""

    @property
    def audited(self) -> bool:
        """``check`` audits it: it names code, or tieaudit could not walk all of it."""
        return runs_code(self.named) or bool(self.lost)

    @property
    def plain(self) -> bool:
        """It names no code, walked as far as torch reads it: skipped in a folder (``reason``)."""
        return not self.audited


class _MemberWalk:
    """Walks the pickles of the members torch unpickles, in its order."""

    def __init__(self, data: mmap.mmap, path: str, scan: TarScan) -> None:
        self.data = data
        self.path = path
        self.scan = scan
        self.walk = Walk()
        self.values: dict[bytes, object] = {}
        """Values of the record pickles read so far, by their bytes (a repeated record is read once)."""

    def _pickle(self, pos: int, end: int, what: str, *, persistent: bool = False) -> int:
        """Walk the pickle at pos (the member ends at end): the position after its STOP."""
        after = walk_pickle(
            self.data, pos, min(end, pos + MAX_PICKLE_BYTES), size=end, walk=self.walk, persistent=persistent
        )
        if after >= 0:
            return after
        if self.walk.ending in UNFINISHED:
            raise _Lost(f"{what} is too long or too deep to walk, or reads across the end of a FRAME")
        raise _Stop  # the unpickler fails on it

    def _value(self, pos: int, end: int, what: str) -> tuple[object, int]:
        """The value of the pickle at pos, read by tieaudit's VM, and the position after it."""
        after = self._pickle(pos, end, what)
        if after - pos > MAX_RECORD_PICKLE_BYTES:
            raise _Lost(f"{what} is longer than {MAX_RECORD_PICKLE_BYTES} bytes")
        raw = bytes(self.data[pos:after])
        if raw not in self.values:
            try:
                value, _, stop = load_pickle(raw, self.path, what, layout="plain", referenced={})
            except (InputError, Truncated) as exc:
                why = exc.message if isinstance(exc, InputError) else "truncated"
                raise _Lost(f"tieaudit's pickle VM cannot read {what} ({why})") from None
            if stop != len(raw):
                raise _Lost(f"{what} ends elsewhere for tieaudit's pickle VM")
            self.values[raw] = value
        return self.values[raw], after

    def _count(self, pos: int, end: int, what: str) -> tuple[int, int]:
        value, pos = self._value(pos, end, what)
        if type(value) is bool or type(value) is int:
            if value > MAX_TAR_RECORDS:
                raise _Lost(f"{what} is {value}, over MAX_TAR_RECORDS ({MAX_TAR_RECORDS})")
            return max(int(value), 0), pos
        if isinstance(value, _PLAIN):
            raise _Stop  # range() of it fails
        raise _Lost(f"{what} is no number tieaudit reads")

    def storages(self, member: TarMember) -> None:
        pos, end = member.data, member.end
        count, pos = self._count(pos, end, "the storage count")
        for _ in range(count):
            record, pos = self._value(pos, end, "a storage record")
            pos = self._storage_bytes(record, pos, end)
        self._pickle(pos, end, "the storage views")

    def _storage_bytes(self, record: object, pos: int, end: int) -> int:
        """Past the element count and elements that follow a storage record."""
        kind = record[2] if isinstance(record, (tuple, list)) and len(record) == 3 else record
        if not isinstance(kind, StorageType):
            if isinstance(kind, _PLAIN):
                raise _Stop  # it unpacks into no three values, or its type has no _dtype
            raise _Lost("a storage record's type is no storage class tieaudit reads")
        if not kind.typed or kind.dtype not in ITEMSIZE:
            raise _Lost(f"a storage of dtype {kind.dtype}, which tieaudit does not size")
        if pos + 8 > end:
            raise _Stop
        numel = int.from_bytes(self.data[pos : pos + 8], "little", signed=True)
        if numel < 0:
            raise _Lost(f"a storage of {numel} elements")
        pos += 8 + numel * ITEMSIZE[kind.dtype]
        if pos > end:
            raise _Stop  # torch's read of the elements fails
        return pos

    def tensors(self, member: TarMember) -> None:
        pos, end = member.data, member.end
        count, pos = self._count(pos, end, "the tensor count")
        for _ in range(count):
            pos = self._pickle(pos, end, "a tensor record")
            if pos + 4 > end:
                raise _Stop
            ndim = int.from_bytes(self.data[pos : pos + 4], "little", signed=True)
            pos += 16 + 16 * ndim  # ndim, 4 bytes skipped, sizes, strides, the offset
            if ndim < 0 or pos > end:
                raise _Stop  # struct.unpack fails on a negative count or a short read

    def objects(self, member: TarMember) -> None:
        self._pickle(member.data, member.end, "the object pickle", persistent=True)

    def run(self, listing: Listing) -> None:
        """Walk storages, tensors and pickle as torch.load reads them, until it would fail."""
        for name, extracted, walk in (
            ("storages", True, self.storages),
            ("tensors", True, self.tensors),
            ("pickle", False, self.objects),
        ):
            member = listing.members.get(name)
            if member is None:
                if name == "storages":
                    self.scan.reason = NOT_TORCH
                break  # KeyError: torch.load fails, unpickling nothing more
            kind = member.kind()
            if kind == "folder" or (kind == "device" and not extracted):
                break  # open() of a folder fails; extractfile gives None for these
            try:
                if kind != "regular":
                    raise _Lost(f"it is a {kind} (type {member.type!r}), which torch extracts and opens")
                walk(member)
            except _Stop:
                break
            except _Lost as lost:
                self.scan.lost.append(f"{lost} (member {shown(name)})")
        merge_named(self.scan.named, self.walk.named)


MAX_FALLBACK_BYTES = 256 << 20
"""Tar files up to this size that tieaudit's own listing refuses (PAX headers, sparse members) are
listed by Python's tarfile, the parser torch.load uses, which reads a PAX header whole: bounded by
the file's size."""
NO_STORAGES = (
    "a tar archive with no member named 'storages' (as Python's tarfile lists it): torch.load fails "
    "on it before unpickling anything, so it is not a checkpoint"
)
"""Why a tar archive that is not a torch checkpoint is skipped in a folder (refused when named)."""


def _without_storages(path: str, size: int) -> bool:
    """Python's tarfile, as torch.load opens the file, finds no member 'storages' (the first thing
    torch's tar loader extracts and unpickles) among at most MAX_TAR_MEMBERS; False where that
    cannot be told (too large, too many members, tarfile fails)."""
    if size > MAX_FALLBACK_BYTES:
        return False
    try:
        with tarfile.open(path, mode="r:", format=tarfile.PAX_FORMAT) as archive:
            for _ in range(MAX_TAR_MEMBERS):
                member = archive.next()
                if member is None:
                    return True
                # 'storages' itself, or a name or PAX record another Python version may read as it
                records = member.pax_headers.values()
                if "storages" in member.name or any("storages" in str(v) for v in records):
                    return False
    except (tarfile.TarError, OSError, ValueError, UnicodeError):
        return False
    return False


def scan_tar(path: str) -> TarScan:
    """Walk what torch.load(weights_only=False) unpickles from the tar file at path."""
    scan = TarScan()
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if not size:
                raise InputError("file is empty", path)
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                # what torch reads when the listing fails: the legacy stream, from byte 0
                stream = walk_pickles(data, min(size, MAX_PICKLE_BYTES), size)
                merge_named(scan.named, stream.named)
                if stream.ending in UNFINISHED:
                    scan.lost.append("the file read from byte 0 as a pickle (torch's fallback) is too long")
                try:
                    listing = list_members(data, size, path)
                except TarRefused as refused:
                    if not runs_code(scan.named) and _without_storages(path, size):
                        scan.reason = NO_STORAGES
                        return scan
                    scan.lost.append(refused.message)
                    return scan
                if listing.failed:
                    scan.reason = (
                        f"a tar archive that tarfile cannot list ({listing.failed}): "
                        "torch.load(weights_only=True) refuses it, and weights_only=False fails on it "
                        "or reads it as a legacy stream instead, which names no code"
                    )
                    return scan
                _MemberWalk(data, path, scan).run(listing)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", path) from None
    return scan


def read_tar(path: str) -> OpenCheckpoint:
    """A tar file torch.load opens: TIE010's checkpoint when its pickles name code, else refused."""
    scan = scan_tar(path)
    if runs_code(scan.named):
        return code_checkpoint(path, scan.named, refused=TAR_REFUSED)
    if scan.lost:
        raise UnwalkedPickle(
            f"a pre-0.4 torch tar checkpoint tieaudit cannot read to its end: {scan.lost[0]}; "
            "torch.load(weights_only=False) would unpickle all of it, so nothing vouches for what it imports",
            path,
        )
    raise UnsupportedFormatError(scan.reason, path)
