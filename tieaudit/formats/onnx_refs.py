"""Which ONNX model a raw file is the external data of, for a file no reader takes.

A ``.bin`` or ``.data`` file beside an ``.onnx`` model holds the model's initializers' bytes and
means nothing alone. When one is named where a checkpoint is expected, the models beside it and in
the folder above (external data lies in the model's folder or below it) are read as the ONNX
reader reads them, protobuf only (``onnx_model.load_skeleton``: no external data loaded, embedded
weights stepped over), and every tensor's location (``onnx_tensors.every_tensor``) compared with
the file. Locations the reader would refuse (``..``, absolute paths) name nothing here.
"""

from __future__ import annotations

import os

from tieaudit.core.errors import InputError

MAX_MODELS_LOOKED_AT = 16
"""ONNX models read to find the one a raw file belongs to (beside it, then one folder up): an
export folder holds a handful (model, decoder, decoder with past, quantised variants)."""
MAX_MODEL_BYTES = 256 << 20
"""Largest ONNX model read for that: a model with external data keeps only its graph in the
protobuf (a few MiB for a 7B model); a larger one embeds its weights and references no file."""


def _candidates(path: str) -> list[str]:
    """The .onnx files in path's folder, then in the folder above, at most MAX_MODELS_LOOKED_AT."""
    folder = os.path.dirname(os.path.abspath(path))
    found: list[str] = []
    for where in dict.fromkeys((folder, os.path.dirname(folder))):
        try:
            names = sorted(os.listdir(where))
        except OSError:
            continue
        for name in names:
            candidate = os.path.join(where, name)
            if name.lower().endswith(".onnx") and os.path.isfile(candidate):
                found.append(candidate)
    return found[:MAX_MODELS_LOOKED_AT]


def _references(model_path: str, target: str) -> bool:
    """Whether a tensor of the model at model_path keeps its bytes in the file target (real path)."""
    from tieaudit.formats.onnx_external import location_parts
    from tieaudit.formats.onnx_model import load_skeleton
    from tieaudit.formats.onnx_proto import EXTERNAL
    from tieaudit.formats.onnx_tensors import every_tensor

    try:
        if os.path.getsize(model_path) > MAX_MODEL_BYTES:
            return False
        model = load_skeleton(model_path)[0]
    except (OSError, InputError):
        return False
    base = os.path.dirname(model_path)
    for where, proto in every_tensor(model):
        if proto.data_location != EXTERNAL:
            continue
        location = next((e.value for e in reversed(proto.external_data) if e.key == "location"), "")
        try:
            parts = location_parts(where, location, model_path)
        except (InputError, TypeError):  # refused by the reader, or not text
            continue
        if os.path.realpath(os.path.join(base, *parts)) == target:
            return True
    return False


def external_data_of(path: str) -> tuple[str, ...]:
    """The ONNX models beside path (or one folder up) whose tensors keep their bytes in path,
    spelled relative to path as given (``model.onnx``, ``dir/model.onnx``, ``dir/../model.onnx``
    normalised)."""
    try:
        import google.protobuf  # type: ignore[import-untyped,unused-ignore]  # noqa: F401  (the reader's own dependency: without it nothing is explained)
    except ImportError:
        return ()
    target = os.path.realpath(path)
    given = os.path.dirname(path)
    here = os.path.dirname(os.path.abspath(path))
    users = [candidate for candidate in _candidates(path) if _references(candidate, target)]
    return tuple(os.path.normpath(os.path.join(given, os.path.relpath(m, here))) for m in users)
