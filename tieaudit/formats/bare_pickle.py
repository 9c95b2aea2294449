"""Bare pickles: ``pickle.dump`` output (not torch.save data) under any name, which
``torch.load(weights_only=False)`` unpickles before it fails.

torch.load takes a file that is not a zip for the legacy stream and unpickles its first pickle
with the full unpickler before comparing it with the magic number ("Invalid magic number"): a
``model.pt``, ``weights.pkl`` or ``checkpoint`` written by ``pickle.dump`` runs whatever it names
first. Such a file is walked with ``pickle_walk`` (every opcode of protocols 0 to 5, nothing
imported or called, at most MAX_SCAN_BYTES read through a memory map) and judged by torch's verdict
on each global it names:

- it names a global outside torch's weights_only allowlist (``runs-code``): it is audited as a
  checkpoint of format ``pickle``, with no tensors and those globals, so TIE010 names each one and
  what loading would do with it;
- its pickle ends with STOP and names nothing else (a vocab.pkl of dicts and strings): plain data,
  skipped with ``PLAIN_DATA`` (or refused with it when named on the command line);
- it breaks before naming anything (a text file, a truncated or garbled file): no pickle at all;
- tieaudit cannot walk it to its end without finding code (longer than MAX_SCAN_BYTES, or past the
  walk's stack and memo bounds), or an opcode reads across the end of a FRAME (read one way or
  another depending on buffering): audited and refused with one line, never passed.

The checkpoint, the refusal and the walk through a memory map are ``walked``'s, shared with the
torch files tieaudit's torch reader refuses and torch's pre-0.4 tar format.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.core.escape import quoted
from tieaudit.core.records import PickleGlobal
from tieaudit.formats.interface import Reader
from tieaudit.formats.pickle_start import starts_like_pickle
from tieaudit.formats.pickle_walk import Walk, walk_pickles
from tieaudit.formats.torch_pickle import MAX_PICKLE_BYTES
from tieaudit.formats.walked import UnwalkedPickle, code_checkpoint, named_globals, refusal, walk_file

__all__ = [
    "MAX_SCAN_BYTES",
    "PLAIN_DATA",
    "BarePickle",
    "BarePickleReader",
    "bare_pickle_globals",
    "refusal",
    "scan",
    "starts_like_pickle",
    "unpickled_by_torch",
]

MAX_SCAN_BYTES = MAX_PICKLE_BYTES
"""Bytes of a bare pickle walked at most (the limit torch.save pickles are read to as well)."""
NOT_TORCH = "it is a pickle, not torch.save data, which torch.load unpickles before it fails"
"""Why tieaudit reads no tensors from a bare pickle (``PickleGlobal.refused``)."""
PLAIN_DATA = "a pickle of plain data, not torch.save data; torch.load refuses it"
"""Why a pickle that names no code is skipped (or refused when named on the command line)."""
LEGACY_REFUSED = (
    "a legacy torch.save stream written with pickle opcodes torch.load(weights_only=True) refuses; "
    "it names no code"
)
"""Why a legacy stream tieaudit's torch reader refuses (as torch's weights_only does) is skipped,
when the full unpickler would find no code in it either."""
TOO_LONG = (
    f"a pickle (not torch.save data) that tieaudit cannot walk to its end: it reads at most "
    f"{MAX_SCAN_BYTES >> 20} MiB of one, with a bounded stack and memo, and found no code before; "
    "torch.load(weights_only=False) would unpickle all of it, so nothing vouches for what it imports"
)
"""The one line for a pickle too long (or too deep) to walk."""
ACROSS_FRAME = (
    "a pickle (not torch.save data) with an opcode that reads across the end of a FRAME, which "
    "pickle.dump never writes and the unpickler reads in one of two ways depending on how the file is "
    "buffered; tieaudit cannot tell what torch.load(weights_only=False) would import from it"
)
"""The one line for a pickle whose reading depends on buffering."""

_HEAD_BYTES = 64
"""Bytes walked before the file is mapped (as many as ``magic.read_head`` reads)."""


@dataclass(frozen=True)
class BarePickle:
    """What the walk of a file that starts like a pickle found."""

    walk: Walk

    @property
    def runs_code(self) -> bool:
        """It names a global outside torch's weights_only allowlist."""
        return bool(self.walk.runs_code)

    @property
    def plain(self) -> bool:
        """Its pickle ends with STOP and names no code."""
        return self.walk.ending == "stop" and not self.runs_code

    @property
    def reason(self) -> str:
        """Why a plain one is skipped: plain data, or a legacy stream torch's weights_only refuses."""
        return LEGACY_REFUSED if self.walk.pickles > 1 else PLAIN_DATA

    @property
    def audited(self) -> bool:
        """``check`` audits it: it names code, or tieaudit could not walk it to its end."""
        return self.runs_code or self.walk.ending in ("unscanned", "ambiguous")


def scan(path: str, head: bytes, size: int, *, until_code: bool = False) -> BarePickle | None:
    """The walk of a file (head: its first bytes, size: its size), or None when it does not start
    like a pickle. Most files end within head; the rest are walked through a memory map.
    ``until_code``: stop at the first global that runs code (enough to tell ``audited``)."""
    if not starts_like_pickle(head):
        return None
    walk = walk_pickles(head, len(head), size, until_code=until_code)
    if walk.ending == "unscanned" and len(head) < size and not (until_code and walk.runs_code):
        walk = walk_file(path, limit=MAX_SCAN_BYTES, until_code=until_code)
    return BarePickle(walk)


def unpickled_by_torch(path: str, head: bytes, size: int) -> str:
    """What torch.load takes the file (head: its first bytes, size: its size) for: "torch.save data",
    or "a pickle naming 'os.system'" when it unpickles one that names code before it fails (or "a
    pickle tieaudit cannot walk to its end"); empty when neither: what a file of another format
    must not also be."""
    from tieaudit.formats.torch_sniff import is_torch_content

    if is_torch_content(path, head):
        return "torch.save data"
    found = scan(path, head, size, until_code=True)
    if found is None or not found.audited:
        return ""
    code = [name for name, named in found.walk.named.items() if named.verdict == "runs-code"]
    if not code:
        return "a pickle tieaudit cannot walk to its end"
    return f"a pickle naming {', '.join(map(quoted, code))}"


def _unwalked(found: BarePickle, path: str) -> None:
    """Refuse a pickle naming no code that tieaudit could not walk to its end (never passed)."""
    if found.walk.ending == "ambiguous":
        raise UnwalkedPickle(ACROSS_FRAME, path)
    if found.walk.ending == "unscanned":
        raise UnwalkedPickle(TOO_LONG, path)


def bare_pickle_globals(path: str, file: str) -> tuple[PickleGlobal, ...]:
    """The globals a file names when it is a pickle naming code that is not torch.save data (as
    ``file``, its name in a folder), or none: for a folder reader that found no torch.save data in
    it. A pickle it cannot walk to its end is refused (``UnwalkedPickle``), never passed over."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD_BYTES)
            size = os.fstat(handle.fileno()).st_size
        found = scan(path, head, size)
    except (OSError, InputError):
        return ()  # the folder reader lists the file as not read
    if found is None:
        return ()
    if not found.runs_code:
        _unwalked(found, path)
        return ()
    return named_globals(found.walk.named, file, refused=NOT_TORCH)


class BarePickleReader(Reader):
    """A pickle that is not torch.save data: read for the globals it names, no tensors."""

    format = "pickle"

    def __init__(self) -> None:
        self._scanned: dict[str, BarePickle | None] = {}

    def _scan(self, path: str, head: bytes) -> BarePickle | None:
        if path not in self._scanned:
            try:
                size = os.stat(path).st_size
            except OSError as exc:
                raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
            self._scanned[path] = scan(path, head, size)
        return self._scanned[path]

    def sniff(self, path: str, head: bytes) -> bool:
        found = self._scan(path, head)
        return found is not None and (found.audited or found.plain)

    def read(self, path: str) -> OpenCheckpoint:
        if path not in self._scanned:  # read without sniff
            try:
                with open(path, "rb") as handle:
                    head = handle.read(_HEAD_BYTES)
            except OSError as exc:
                raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
            self._scan(path, head)
        found = self._scanned[path]
        if found is None or not (found.audited or found.plain):
            raise UnsupportedFormatError("not a pickle torch.load unpickles", path)
        if found.runs_code:
            return code_checkpoint(path, found.walk.named, refused=NOT_TORCH)
        _unwalked(found, path)
        raise UnsupportedFormatError(found.reason, path)
