"""The first bytes each format starts with: what a cheap look at a file's head can tell.

Readers check more (``Reader.sniff``); this is for callers that must not read further, such as
discovery telling a PyTorch ``.bin`` from raw bytes (ONNX external data) without opening it twice,
and for the formats tieaudit recognises but does not read (NumPy, HDF5, ...): a file of one
of them is named as such, never called "not a checkpoint". A Git LFS pointer (a small text file
standing where the weights should be) is recognised here, once, for every reader: ``refuse_head``
runs before any reader sees a file, a shard of a model folder included.
"""

from __future__ import annotations

import os

from tieaudit.core.errors import InputError, LfsPointerError, UnsupportedFormatError
from tieaudit.formats.pickle_start import PICKLE_PROTO
from tieaudit.formats.zip_archive import LOCAL_MAGIC as ZIP_MAGIC

__all__ = [
    "LFS_POINTER",
    "MAX_LFS_POINTER_BYTES",
    "PICKLE_PROTO",
    "GGUF_MAGIC",
    "ZIP_MAGIC",
    "is_lfs_pointer",
    "might_be_torch",
    "read_head",
    "recognised_unsupported",
    "refuse_head",
]

HEAD_BYTES = 64
"""Bytes read to tell a format: every magic below fits."""
# PICKLE_PROTO (formats.pickle_start): a pickle of protocol 2 or later starts with it (torch's
# legacy format). A zip (ZIP_MAGIC, a local file header) is torch.save's format since torch 1.6.

GGUF_MAGIC = b"GGUF"
"""A GGUF file (llama.cpp) starts with it."""
LFS_POINTER = "Git LFS pointer, not the weights: run `git lfs pull`"
"""What a Git LFS pointer is called wherever it is met (an error, or a skip reason)."""
MAX_LFS_POINTER_BYTES = 1024
"""Largest file read as a Git LFS pointer: git-lfs itself never takes a larger blob for one (its
blobSizeCutoff); real pointers are about 130 bytes."""
_LFS_PREFIXES = (b"version https://git-lfs.github.com/spec/", b"version https://hawser.github.com/spec/")
"""The first line of a pointer file (the second: the spec's name before Git LFS 1.0)."""

_BY_MAGIC = (
    (b"\x93NUMPY", "NumPy .npy array"),
    (b"\x89HDF\r\n\x1a\n", "HDF5 (TensorFlow/Keras .h5)"),
)
"""Formats tieaudit does not read, by the bytes they start with."""
_BY_SUFFIX_IN_ZIP = ((".npz", "NumPy .npz archive"), (".keras", "Keras .keras archive"))
"""Zip-based formats tieaudit does not read, by suffix (a zip alone says nothing more)."""
_MSGPACK_MAP = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
"""First byte of a msgpack map (fixmap, map16, map32): a Flax checkpoint is one."""
NOT_SUPPORTED = ": recognised, not supported yet"
"""Said after the format's name."""


def might_be_torch(head: bytes) -> bool:
    """head (4 bytes suffice) starts like a torch.save file: a zip, or a protocol 2-5 pickle."""
    return head.startswith(ZIP_MAGIC) or (len(head) >= 2 and head[0] == PICKLE_PROTO and 2 <= head[1] <= 5)


def is_lfs_pointer(head: bytes, size: int) -> bool:
    """head (at least the first line's 40 bytes) and size are those of a Git LFS pointer file."""
    return size <= MAX_LFS_POINTER_BYTES and head.startswith(_LFS_PREFIXES)


def recognised_unsupported(head: bytes, name: str) -> str | None:
    """'FORMAT: recognised, not supported yet' for a format tieaudit knows and does not read."""
    for magic, label in _BY_MAGIC:
        if head.startswith(magic):
            return label + NOT_SUPPORTED
    if head[4:8] == b"TFL3":  # the FlatBuffer file identifier of TensorFlow Lite models
        return "TensorFlow Lite" + NOT_SUPPORTED
    lowered = name.lower()
    if head.startswith(ZIP_MAGIC):
        for suffix, label in _BY_SUFFIX_IN_ZIP:
            if lowered.endswith(suffix):
                return label + NOT_SUPPORTED
    if lowered.endswith(".msgpack") and head[:1] and head[0] in _MSGPACK_MAP:
        return "Flax msgpack" + NOT_SUPPORTED
    return None


def read_head(path: str) -> tuple[bytes, int]:
    """The first HEAD_BYTES bytes of a file and its size, with errors worded for users."""
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES), os.fstat(handle.fileno()).st_size
    except IsADirectoryError:
        return b"", 0
    except PermissionError as exc:
        raise InputError("permission denied", path) from exc
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc


def refuse_head(path: str, head: bytes, size: int) -> None:
    """Refuse a file no reader should try: a Git LFS pointer, or a format tieaudit does not read
    (unless torch.load would take it: a torch.save zip named ``.npz``, a legacy stream ``.msgpack``,
    or unpickle it: a pickle naming code, named ``.msgpack``)."""
    if is_lfs_pointer(head, size):
        raise LfsPointerError(LFS_POINTER, path)
    recognised = recognised_unsupported(head, os.path.basename(path))
    if recognised is not None:
        from tieaudit.formats.bare_pickle import unpickled_by_torch

        if not unpickled_by_torch(path, head, size):
            raise UnsupportedFormatError(recognised, path)
