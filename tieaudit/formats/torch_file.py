"""PyTorch checkpoints: torch.save's zip archive (torch >= 1.6) and the legacy stream before it.

Read exactly as ``torch.load(weights_only=True)`` reads them, or refused: the archive through
tieaudit's strict zip reader (``zip_archive``) with torch's record rules (the prefix is the first
member's folder, records are found case-insensitively, a ``version`` record is required), the
pickles through tieaudit's own pickle VM with torch's weights_only opcode set and allowlist. No
pickle code runs and torch is never imported; tensors become strided views into storage records
whose bytes are located in the file without being read, so ``Checkpoint.array`` maps them.

A file this reader refuses is not passed on that alone: ``torch.load(weights_only=False)`` unpickles
what the reader stopped at (an opcode torch's weights_only refuses, a malformed persistent id) and
everything after it. So the pickles it got to (the zip's data.pkl, the legacy stream) are walked
whole (``pickle_walk``); when they name a global outside torch's allowlist the file is TIE010's
(``walked.code_checkpoint``: format ``pickle``, no tensors, the refusal kept as the reason), and when
the walk cannot finish it is ``walked.UnwalkedPickle``. A tar archive, torch's pre-0.4 format, is
``torch_tar_walk``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.core.escape import printable
from tieaudit.formats.interface import Reader
from tieaudit.formats.magic import ZIP_MAGIC
from tieaudit.formats.pickle_budget import PICKLE_UNITS_PER_BYTE, PickleBudget
from tieaudit.formats.pickle_vm import MAX_DEPTH, Truncated
from tieaudit.formats.pickle_walk import Walk, walk_pickle
from tieaudit.formats.torch_checkpoint import ROOT_NAME, LocateStorage, build_checkpoint, flatten
from tieaudit.formats.torch_legacy import read_legacy
from tieaudit.formats.torch_pickle import MAX_PICKLE_BYTES, Referenced, load_pickle, truncated_error
from tieaudit.formats.torch_records import StorageRef, key_name
from tieaudit.formats.torch_sniff import is_legacy_stream, is_torch_content, is_torch_tar
from tieaudit.formats.torch_tar_walk import read_tar
from tieaudit.formats.torchscript import is_torchscript, read_torchscript
from tieaudit.formats.training import training_layout
from tieaudit.formats.walked import (
    UNFINISHED,
    UnwalkedPickle,
    code_checkpoint,
    merge_named,
    runs_code,
    walk_file,
)
from tieaudit.formats.zip_archive import (
    ZipArchive,
    ZipMember,
    read_archive,
    read_member,
    shown,
)

__all__ = ["MAX_DEPTH", "MAX_PICKLE_BYTES", "ROOT_NAME", "ZIP_MAGIC", "TorchReader", "flatten", "key_name"]

MIN_REFUSED_WALK_BYTES = 1 << 20
"""Bytes of a refused file's pickles walked at least, whatever its pickle budget has left."""
REFUSED_WALK_UNITS_PER_BYTE = PICKLE_UNITS_PER_BYTE
"""What each further byte walked is charged against the units the file's pickle budget has left
(the rate a byte of file earns it): a pickle refused early is walked whole, one refused for its
budget only MIN_REFUSED_WALK_BYTES more, so the reading and the walk together stay within about one
budget's time (the walk costs up to about 0.5 s of CPU per MB). A pickle longer than that is refused
as not walked to its end (``walked.UnwalkedPickle``), never passed."""
MAX_SMALL_RECORD_BYTES = 4096
"""version, byteorder, .storage_alignment: a few bytes each in every torch.save archive."""
SUPPORTED_VERSIONS = range(1, 11)
"""The archive versions torch 2.13 reads (kMinSupportedFileFormatVersion..kMaxSupportedFileFormatVersion)."""
_VERSION = re.compile(rb"\s*(\d{1,19})\s*")
_AMBIGUOUS = "torch and tieaudit could read different data"
_SCRIPT_REFUSED = (
    "a TorchScript archive (torch.jit.save), not a torch.save checkpoint: transformers loads this "
    "file with torch.load(weights_only=True), which refuses TorchScript archives"
)


def _prefix(archive: ZipArchive, path: str) -> str:
    """torch's archive name: the first central-directory entry's name up to its first '/'."""
    first = archive.members[0].name if archive.members else b""
    if b"/" not in first:
        raise InputError(f"zip member {shown(first)!r} is not in a folder; torch reads no such archive", path)
    prefix = first.split(b"/", 1)[0] + b"/"
    for member in archive.members:  # torch's get_all_records refuses any other name
        if not member.name.startswith(prefix):
            raise InputError(f"zip member {shown(member.name)!r} is outside the archive's folder", path)
    try:
        return prefix.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"the archive's folder {shown(prefix)!r} is not UTF-8", path) from None


def _record(archive: ZipArchive, prefix: str, name: str) -> ZipMember | None:
    return archive.find(prefix + name)


def _small(fd: int, member: ZipMember, path: str) -> bytes:
    return read_member(fd, member, MAX_SMALL_RECORD_BYTES, path=path)


def _check_records(fd: int, archive: ZipArchive, prefix: str, *, path: str) -> None:
    """The records torch.load reads before data.pkl, with torch's rules."""
    version = _record(archive, prefix, ".data/version") or _record(archive, prefix, "version")
    if version is None:
        raise InputError("the archive has no version record, which torch.load requires", path)
    match = _VERSION.fullmatch(_small(fd, version, path))
    if match is None or int(match.group(1)) not in SUPPORTED_VERSIONS:
        raise InputError(
            f"archive version record {shown(_small(fd, version, path)[:40])!r} is not one torch reads", path
        )
    byteorder = _record(archive, prefix, "byteorder")
    if byteorder is not None and _small(fd, byteorder, path) != b"little":
        raise UnsupportedFormatError(
            "big-endian (or unmarked byte order) checkpoints are not supported", path
        )
    alignment = _record(archive, prefix, ".storage_alignment")
    if alignment is not None:
        try:
            int(_small(fd, alignment, path))
        except ValueError:
            raise InputError(
                "the .storage_alignment record is not a number (torch.load fails on it)", path
            ) from None


def _zip_locator(archive: ZipArchive, prefix: str, path: str) -> LocateStorage:
    def locate(ref: StorageRef) -> int:
        name = f"{prefix}data/{ref.key}"
        member = archive.find(name)
        quoted = repr(printable(name[:200]))
        if member is None:
            raise InputError(f"storage {printable(ref.key[:40])!r} has no zip member {quoted}", path)
        if member.method != 0:
            raise InputError(f"zip member {quoted} is compressed; storages must be stored to be mapped", path)
        if member.size != ref.nbytes:
            raise InputError(
                f"zip member {quoted} holds {member.size} bytes, its storage needs {ref.nbytes} "
                "(torch.load refuses any difference)",
                path,
            )
        return member.data_offset

    return locate


@dataclass(kw_only=True)
class _Reached:
    """How far the reader got: the pickles torch.load(weights_only=False) would unpickle, to walk
    when the reader refuses the file."""

    data_pkl: bytes | None = None
    """The zip's data.pkl, once read."""
    unpickled: bool = False
    """The VM read every pickle to its STOP: every global they name is in ``referenced`` (the
    refusal came after, from the records they hold), so there is nothing more to walk."""
    legacy: bool = False
    """The file is a legacy stream (walked from byte 0)."""
    budget: PickleBudget | None = None
    """The file's pickle budget: what it has left bounds the walk."""
    tar: bool = False
    """The file is a tar archive (``torch_tar_walk`` walks it and judges it itself)."""


def _read_zip(
    fd: int, archive: ZipArchive, prefix: str, *, path: str, referenced: Referenced, budget: PickleBudget,
    reached: _Reached,
) -> tuple[object, dict[str, StorageRef], LocateStorage]:
    member = _record(archive, prefix, "data.pkl")
    if member is None:
        raise InputError(f"the archive has no {prefix}data.pkl record", path)
    what = shown(member.name)
    data = read_member(fd, member, MAX_PICKLE_BYTES, path=path)
    reached.data_pkl = data
    try:
        root, storages, _ = load_pickle(data, path, what, referenced=referenced, budget=budget)
    except Truncated:
        raise truncated_error(what, path) from None
    return root, storages, _zip_locator(archive, prefix, path)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: unpickling allocates one container per opcode or so, and
    the collector's passes over them would double the time (cycles a pickle makes are collected
    once it is running again)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _walk_reached(path: str, reached: _Reached) -> Walk | None:
    """The walk of the pickles the reader got to (None: it refused the file before any)."""
    if reached.unpickled:
        return Walk(ending="stop")
    left = reached.budget.left if reached.budget is not None else 0
    limit = min(MAX_PICKLE_BYTES, MIN_REFUSED_WALK_BYTES + max(left, 0) // REFUSED_WALK_UNITS_PER_BYTE)
    if reached.data_pkl is not None:
        walk, data = Walk(), reached.data_pkl
        end = min(len(data), limit)
        walk_pickle(data, 0, end, size=len(data), walk=walk, persistent=True)  # torch's persistent_load
        return walk
    return walk_file(path, limit=limit) if reached.legacy else None


def refused_read(exc: InputError, path: str, *, referenced: Referenced, reached: _Reached) -> OpenCheckpoint:
    """What a file the reader refuses is: TIE010's checkpoint when the pickles it reached name code
    (walked whole, with what the reader met before refusing), else the refusal, or UnwalkedPickle
    when the walk cannot finish."""
    walk = _walk_reached(path, reached)
    if walk is None:
        raise exc
    named = dict(walk.named)
    merge_named(named, referenced)
    if runs_code(named):
        return code_checkpoint(path, named, refused=f"the torch reader refuses it: {exc.message}")
    if walk.ending in UNFINISHED:
        raise UnwalkedPickle(
            f"{exc.message}; and tieaudit cannot walk its pickle to its end without finding code (too "
            "long or deep, or an opcode reads across the end of a FRAME), so nothing vouches for what "
            "torch.load(weights_only=False) would import",
            path,
        )
    raise exc


class TorchReader(Reader):
    """torch.save files, zip or legacy, recognised by content rather than suffix; and TorchScript
    archives, which torch.load hands to torch.jit.load (``torchscript``), unless a caller loads
    only what torch.load(weights_only=True) loads (``torchscript=False``: a model folder's weights,
    a Trainer folder's files, which transformers reads so)."""

    format = "torch"

    def __init__(self, *, torchscript: bool = True) -> None:
        self.torchscript = torchscript

    def sniff(self, path: str, head: bytes) -> bool:
        return is_torch_content(path, head)  # by content, as torch.load: any name

    def read(self, path: str) -> OpenCheckpoint:
        referenced: Referenced = {}
        reached = _Reached()
        try:
            with open(path, "rb") as handle, _collector_paused():
                fd = handle.fileno()
                size = os.fstat(fd).st_size
                head = os.pread(fd, 64, 0)
                # One budget for the file: its pickles, then flattening what they made.
                budget = reached.budget = PickleBudget(size)
                if head.startswith(ZIP_MAGIC):
                    archive = read_archive(fd, size, path)
                    prefix = _prefix(archive, path)
                    _check_records(fd, archive, prefix, path=path)
                    if is_torchscript(archive, prefix):
                        if not self.torchscript:
                            raise UnsupportedFormatError(_SCRIPT_REFUSED, path)
                        return read_torchscript(
                            fd, path, archive=archive, prefix=prefix, referenced=referenced, budget=budget
                        )
                    root, storages, locate = _read_zip(
                        fd, archive, prefix, path=path, referenced=referenced, budget=budget, reached=reached
                    )
                elif is_torch_tar(path, head):  # torch.load tries tar before the legacy stream
                    reached.tar = True
                    return read_tar(path)
                elif is_legacy_stream(path, head):
                    reached.legacy = True
                    root, storages, locate = read_legacy(fd, size, path, referenced=referenced, budget=budget)
                else:
                    raise UnsupportedFormatError("not a torch.save file (neither zip nor legacy magic)", path)
                reached.unpickled = True
                opened = build_checkpoint(
                    path, root, storages, locate=locate, referenced=referenced, budget=budget
                )
                layout = training_layout(root, opened.checkpoint.names)
                if layout is not None:
                    opened.checkpoint = dataclasses.replace(opened.checkpoint, training=layout)
                return opened
        except InputError as exc:
            if reached.tar:
                raise
            return refused_read(exc, path, referenced=referenced, reached=reached)
        except IsADirectoryError:
            raise InputError("is a folder, not a torch.save file", path) from None
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
