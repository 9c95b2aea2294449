"""Whether ``torch.load`` takes a file for torch.save data, by its content alone (any name).

torch.load never looks at a name (but ``.safetensors``): a file starting with a zip local header
is opened as an archive, whose ``data.pkl`` it reads; any other file is first opened as a tar
archive (torch's pre-0.4 format, ``torch_tar``), then read as the legacy stream, whose first pickle
must be the magic number. A pickle that is not such a stream (a ``vocab.pkl``, an sklearn model)
torch.load refuses, "Invalid magic number", after unpickling it: it is not a checkpoint. So a file
is torch's when

- it starts with a zip local header and its archive names a ``<folder>/data.pkl`` (torch.save's
  layout; a malformed archive whose last MiB names one counts too, so that reading it says what
  is wrong), or
- it is no zip and its first 512 bytes are a tar header Python's tarfile accepts (its checksum
  matches; tarfile needs no ``ustar`` magic), which torch.load opens as a tar archive, or
- its first pickle, read by tieaudit's pickle VM with torch's weights_only opcodes (no code runs:
  a global outside the allowlist is an inert placeholder, so a magic-number pickle that also names
  code is still found), is torch's legacy MAGIC_NUMBER, however it is spelled (``PROTO`` or not,
  values pushed before it, a memo put after it). The legacy reader bounds that pickle by
  MAX_HEADER_PICKLE_BYTES, and so does this look: a first pickle longer than that is no torch file
  here nor there.

Reading stays cheap: the 64-byte head, then the central directory of a zip, the first 512 bytes
of any other file, or at most MAX_HEADER_PICKLE_BYTES of a file that starts like a pickle (most
files fail on their first bytes).
"""

from __future__ import annotations

import os

from tieaudit.core.errors import InputError
from tieaudit.formats.pickle_vm import Truncated
from tieaudit.formats.torch_legacy import MAGIC_NUMBER, MAX_HEADER_PICKLE_BYTES
from tieaudit.formats.torch_pickle import load_pickle
from tieaudit.formats.torch_tar import OPEN_BYTES, TAR_BLOCK, is_tar_header, opens_as_tar
from tieaudit.formats.zip_archive import LOCAL_MAGIC as ZIP_MAGIC  # not from magic, which imports this
from tieaudit.formats.zip_archive import pread, read_archive

LEGACY_MAGIC = b"\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")
"""The LONG1 opcode pickling MAGIC_NUMBER, which every legacy file torch wrote starts with (after PROTO)."""
SNIFF_TAIL_BYTES = 1 << 20
"""Bytes at the end of a malformed zip searched for a data.pkl name when sniffing."""
_WINDOWS = (4 << 10, MAX_HEADER_PICKLE_BYTES)
"""Bytes of a file read in turn for its first pickle when the 64-byte head does not hold it."""


def is_torch_zip(path: str, head: bytes) -> bool:
    """A zip (at byte 0, as torch.load checks) whose archive holds a ``<folder>/data.pkl``."""
    if not head.startswith(ZIP_MAGIC):
        return False
    name_len = int.from_bytes(head[26:28], "little") if len(head) >= 30 else 0
    if head[30 : 30 + name_len].lower().endswith(b"/data.pkl"):
        return True  # torch writes data.pkl first; no need to read the archive
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            try:
                archive = read_archive(handle.fileno(), size, path)
            except InputError:
                # Malformed (glued, prepended, ...): still torch's if its end names a data.pkl, so
                # that reading it says what is wrong rather than "not a checkpoint".
                tail = pread(handle.fileno(), min(size, SNIFF_TAIL_BYTES), size - min(size, SNIFF_TAIL_BYTES))
                return b"/data.pkl" in tail.lower()
    except OSError:
        return False
    return any(name.count(b"/") == 1 and name.endswith(b"/data.pkl") for name in archive.folded)


def is_torch_tar(path: str, head: bytes) -> bool:
    """A file that is no zip which tarfile opens (its first 512 bytes are a header whose checksum
    matches, and a GNU long name record's next header too): torch.load opens it as a pre-0.4 tar
    archive (weights_only refuses it; ``torch_tar_walk`` reads it)."""
    if not head or head.startswith(ZIP_MAGIC):
        return False
    try:
        with open(path, "rb") as handle:
            block = pread(handle.fileno(), TAR_BLOCK, 0)
            if not is_tar_header(block):
                return False  # most files end here, after one 512-byte read
            return opens_as_tar(pread(handle.fileno(), OPEN_BYTES, 0))
    except OSError:
        return False


def is_legacy_stream(path: str, head: bytes) -> bool:
    """A file (not a zip) whose first pickle is torch's legacy magic number."""
    if head.startswith(LEGACY_MAGIC) or (head[:1] == b"\x80" and head[2:].startswith(LEGACY_MAGIC)):
        return True  # what torch.save writes: no need to run the VM
    if not head or head.startswith(ZIP_MAGIC):
        return False
    data = head
    for window in (len(head), *_WINDOWS):
        if window > len(head):
            try:
                with open(path, "rb") as handle:
                    data = pread(handle.fileno(), window, 0)
            except OSError:
                return False
        try:
            value, _, _ = load_pickle(data, path, "the first pickle", layout="plain", referenced={})
        except Truncated:
            if len(data) < window:
                return False  # the file ends inside its first pickle
            continue
        except InputError:
            return False
        return type(value) is int and value == MAGIC_NUMBER
    return False  # no STOP within MAX_HEADER_PICKLE_BYTES: the legacy reader would refuse it too


def is_torch_content(path: str, head: bytes) -> bool:
    """torch.load takes the file for torch.save data (a zip archive, a tar archive, or the legacy stream)."""
    return is_torch_zip(path, head) or is_torch_tar(path, head) or is_legacy_stream(path, head)
