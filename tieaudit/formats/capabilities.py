"""What each format can record of a copy, and what its usual loaders restore by themselves.

By default retie applies only the relations the format's loaders restore: equal copies everywhere;
transposed copies as views in .pt and as a Transpose node in ONNX. Transposed or cast copies in
safetensors are restored only by ``tieaudit.load_tied``; a cast cannot be a view in .pt.
"""

from __future__ import annotations

from tieaudit.core.records import Format
from tieaudit.graph.detect import ALL_RELATIONS

DEFAULT_RELATIONS: dict[Format, frozenset[str]] = {
    "safetensors": frozenset({"equal"}),
    "hf-dir": frozenset({"equal"}),
    "torch": frozenset({"equal", "transposed"}),
    "onnx": frozenset({"equal", "transposed"}),
    "gguf": frozenset({"equal"}),
}
REPRESENTABLE: dict[Format, frozenset[str]] = {
    "safetensors": ALL_RELATIONS,
    "hf-dir": ALL_RELATIONS,
    "torch": frozenset({"equal", "transposed"}),
    "onnx": ALL_RELATIONS,
    "gguf": frozenset({"equal"}),
}
WHY_NOT_DEFAULT = {
    "transposed": "a transposed copy in safetensors is restored only by tieaudit.load_tied "
    "(other loaders would see a missing tensor); ask with --relations equal,transposed",
    "cast": "a cast copy is restored only by tieaudit.load_tied (or a Cast node in ONNX); "
    "ask with --relations equal,cast",
}

OUT_SUFFIXES: dict[Format, tuple[str, ...]] = {
    "safetensors": (".safetensors",),
    "torch": (".pt", ".pth", ".bin", ".ckpt", ".pth.tar", ".tar"),  # .tar: .pth.tar, as check finds it
    "onnx": (".onnx",),
    "gguf": (".gguf",),
}
"""The suffixes a file of each format may be written under (those check audits it by), the usual
first: retie's OUT must end in one, and a suggested OUT keeps the input's or takes the first."""
FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".tar", ".onnx", ".gguf")
"""Names of checkpoint files: a model folder written under one would pass for a file."""


def retied_name(name: str, format: Format) -> str:
    """NAME-retied with the format's suffix kept where the name has one (model.pth.tar ->
    model-retied.pth.tar), the format's usual suffix added where it has none (weights ->
    weights-retied.safetensors), and a folder's whole name kept (llama-3.2 -> llama-3.2-retied)."""
    if format == "hf-dir":
        return f"{name}-retied"
    suffix = next((s for s in OUT_SUFFIXES[format] if name.endswith(s) and len(name) > len(s)), None)
    if suffix is None:
        return f"{name}-retied{OUT_SUFFIXES[format][0]}"
    return f"{name[: -len(suffix)]}-retied{suffix}"
