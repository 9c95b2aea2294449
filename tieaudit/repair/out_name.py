"""OUT's name must say what retie writes into it: the input's format, which retie never converts.

A safetensors file written as ``b.pt`` would be audited by ``check`` as a .pt and fail, and loaded
by no one who trusts the name. Each format has the suffixes ``check`` audits it by; a model folder
is written as a folder, whose name must not look like a checkpoint file. ``--force-format`` takes
OUT's name as it is.
"""

from __future__ import annotations

import os

from tieaudit.core.errors import UsageError
from tieaudit.core.records import Format

OUT_SUFFIXES: dict[Format, tuple[str, ...]] = {
    "safetensors": (".safetensors",),
    "torch": (".pt", ".pth", ".bin", ".ckpt", ".tar"),  # .tar: .pth.tar, as check finds it
    "onnx": (".onnx",),
}
"""The suffixes an output file of each format may end in (those check audits it by, case as written)."""
FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".tar", ".onnx")
"""Names of checkpoint files: a model folder written under one would pass for a file."""
_CALLED: dict[Format, str] = {"safetensors": "safetensors", "torch": "PyTorch", "onnx": "ONNX"}


def check_out_name(format: Format, out: str, *, force: bool) -> None:
    """Raise UsageError when OUT's name does not fit the input's format (force: accept any name)."""
    if force:
        return
    name = os.path.basename(os.path.normpath(out))
    if format == "hf-dir":
        suffix = next((s for s in FILE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            raise UsageError(
                f"IN is a model folder and OUT is written as a folder; name it without the {suffix} "
                "suffix (or pass --force-format to keep this name)",
                out,
            )
        return
    accepted = OUT_SUFFIXES[format]
    if not name.endswith(accepted):
        expected = f"one of {', '.join(accepted)}" if len(accepted) > 1 else accepted[0]
        raise UsageError(
            f"IN is a {_CALLED[format]} file and OUT is written in the same format: end OUT's name in "
            f"{expected} (or pass --force-format to keep this name)",
            out,
        )
