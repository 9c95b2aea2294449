"""Format readers, chosen by content (magic bytes, zip layout, protobuf), not by suffix."""

from __future__ import annotations

import importlib
import os
import stat
from collections.abc import Iterator

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import ExternalDataError, InputError, UnsupportedFormatError
from tieaudit.formats.hf.variants import weights_target
from tieaudit.formats.interface import Reader
from tieaudit.formats.magic import read_head, refuse_head

# (module, class): imported one at a time, in this order, so a safetensors audit never pays
# for the zip, pickle or protobuf machinery of the others (and never imports onnx or torch).
_FILE_READERS = (
    ("tieaudit.formats.safetensors", "SafetensorsReader"),
    ("tieaudit.formats.torch_file", "TorchReader"),
    ("tieaudit.formats.onnx_model", "OnnxReader"),
    ("tieaudit.formats.gguf", "GgufReader"),
    ("tieaudit.formats.bare_pickle", "BarePickleReader"),  # last: what no reader above takes
)
_FOLDER_READERS = (("tieaudit.formats.hf_reader", "HfDirReader"),)


def _readers(folder: bool) -> Iterator[Reader]:
    for module, name in _FOLDER_READERS if folder else _FILE_READERS:
        yield getattr(importlib.import_module(module), name)()


def open_checkpoint(path: str, *, bare_pickles: bool = False) -> OpenCheckpoint:
    """Sniff path's format and read it: the records, and the open maps of its bytes (close it).

    A file tieaudit reads no tensors from but whose pickles name code (format ``pickle``, no
    tensors: a bare pickle, a torch file its reader refuses, a pre-0.4 tar; ``formats.walked``) is
    returned only to audits (``bare_pickles``); anything else that reads a checkpoint refuses it,
    naming what it would run."""
    if not os.path.exists(path):
        raise InputError("no such file or folder", path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from exc
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        # A FIFO or a device: opening one can block forever or never end.
        raise InputError("not a regular file or folder (a FIFO, socket or device)", path)
    head, size = (b"", 0) if os.path.isdir(path) else read_head(path)
    if not os.path.isdir(path):
        if not head:
            raise InputError("file is empty", path)
        refuse_head(path, head, size)  # an LFS pointer, NumPy, ...: named, before any reader tries
    for reader in _readers(os.path.isdir(path) or weights_target(path)):
        if reader.sniff(path, head):
            opened = reader.read(path)
            if opened.checkpoint.format == "pickle" and not bare_pickles:
                from tieaudit.formats.walked import refusal

                opened.close()
                raise UnsupportedFormatError(refusal(opened.checkpoint), path)
            return opened
    from tieaudit.formats.onnx_refs import external_data_of

    models = external_data_of(path)
    if models:
        raise ExternalDataError(
            f"is external data of {' and '.join(models)} (referenced by its initializers); audit {models[0]}",
            path,
            models=models,
        )
    raise UnsupportedFormatError(
        "not a checkpoint tieaudit reads (PyTorch .pt/.pth/.bin, safetensors, ONNX, GGUF, "
        "or a Hugging Face model folder)",
        path,
    )
