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
}
REPRESENTABLE: dict[Format, frozenset[str]] = {
    "safetensors": ALL_RELATIONS,
    "hf-dir": ALL_RELATIONS,
    "torch": frozenset({"equal", "transposed"}),
    "onnx": ALL_RELATIONS,
}
WHY_NOT_DEFAULT = {
    "transposed": "a transposed copy in safetensors is restored only by tieaudit.load_tied "
    "(other loaders would see a missing tensor); ask with --relations equal,transposed",
    "cast": "a cast copy is restored only by tieaudit.load_tied (or a Cast node in ONNX); "
    "ask with --relations equal,cast",
}
