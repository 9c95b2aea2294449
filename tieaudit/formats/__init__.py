"""Format readers, chosen by content (magic bytes, zip layout, protobuf), not by suffix."""

from __future__ import annotations

import importlib
import os
import stat
from collections.abc import Iterator

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UnsupportedFormatError
from tieaudit.formats.interface import Reader

HEAD_BYTES = 64


# (module, class): imported one at a time, in this order, so a safetensors audit never pays
# for the zip, pickle or protobuf machinery of the others (and never imports onnx or torch).
_FILE_READERS = (
    ("tieaudit.formats.safetensors", "SafetensorsReader"),
    ("tieaudit.formats.torch_file", "TorchReader"),
    ("tieaudit.formats.onnx_model", "OnnxReader"),
)
_FOLDER_READERS = (("tieaudit.formats.hf_dir", "HfDirReader"),)


def _readers(folder: bool) -> Iterator[Reader]:
    for module, name in _FOLDER_READERS if folder else _FILE_READERS:
        yield getattr(importlib.import_module(module), name)()


def read_head(path: str) -> bytes:
    """The first bytes of a file, with errors worded for users."""
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except IsADirectoryError:
        return b""
    except PermissionError as exc:
        raise InputError("permission denied", path) from exc
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc


def open_checkpoint(path: str) -> OpenCheckpoint:
    """Sniff path's format and read it: the records, and the open maps of its bytes (close it)."""
    if not os.path.exists(path):
        raise InputError("no such file or folder", path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        # A FIFO or a device: opening one can block forever or never end.
        raise InputError("not a regular file or folder (a FIFO, socket or device)", path)
    head = b"" if os.path.isdir(path) else read_head(path)
    if not os.path.isdir(path) and not head:
        raise InputError("file is empty", path)
    for reader in _readers(os.path.isdir(path)):
        if reader.sniff(path, head):
            return reader.read(path)
    raise UnsupportedFormatError(
        "not a checkpoint tieaudit reads (PyTorch .pt/.pth/.bin, safetensors, ONNX, "
        "or a Hugging Face model folder)",
        path,
    )
