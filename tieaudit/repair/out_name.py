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
from tieaudit.formats.capabilities import FILE_SUFFIXES, OUT_SUFFIXES

_CALLED: dict[Format, str] = {
    "safetensors": "safetensors",
    "torch": "PyTorch",
    "onnx": "ONNX",
    "gguf": "GGUF",
}


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
        shown = [
            s for s in accepted if not any(s != t and s.endswith(t) for t in accepted)
        ]  # .tar covers .pth.tar
        expected = f"one of {', '.join(shown)}" if len(shown) > 1 else shown[0]
        raise UsageError(
            f"IN is a {_CALLED[format]} file and OUT is written in the same format: end OUT's name in "
            f"{expected} (or pass --force-format to keep this name)",
            out,
        )
