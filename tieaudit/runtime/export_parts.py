"""What ``tieaudit export`` turns into ONNX: one model, exported as one file or as several parts.

A causal or masked LM and a ``module:function`` factory are one part, written to OUT. A seq2seq LM
is two parts, written into the folder OUT under the names optimum gives them (``encoder_model.onnx``,
``decoder_model.onnx``), so ONNX Runtime and optimum load them as they load optimum's exports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class ExportSource:
    """One ONNX file to export: a torch module ready for torch.onnx.export."""

    module: torch.nn.Module
    """In eval mode."""
    inputs: tuple[Any, ...]
    """Example inputs (positional)."""
    input_names: tuple[str, ...]
    """ONNX input names (empty: the exporter's)."""
    output_names: tuple[str, ...]
    """ONNX output names (empty: the exporter's)."""
    dynamic_shapes: Any
    """torch.export dynamic shapes, or None for the example shapes only."""
    description: str
    """One line for the summary."""
    file: str = ""
    """The file's name inside the folder OUT; empty for a one-file export (written to OUT itself)."""


@dataclass(frozen=True, kw_only=True)
class ExportModel:
    """The model behind the parts: what was loaded, as which kind, and its parameters."""

    kind: str
    """causal LM, masked LM, seq2seq LM, or module:function."""
    model_class: str
    """The class that was built: from config.json's architectures, or the factory's module's."""
    parts: tuple[ExportSource, ...]
    """One part per ONNX file, in the order they are exported."""
    description: str
    """One line for the summary."""

    @property
    def folder_out(self) -> bool:
        """OUT is a folder holding the parts' files (more than one file)."""
        return any(part.file for part in self.parts)


def parameter_sizes(module: torch.nn.Module) -> dict[int, int]:
    """id(parameter) -> bytes, each parameter once however many names it has (a tie counts once)."""
    return {id(p): p.numel() * p.element_size() for p in module.parameters()}


def parameter_names(parts: tuple[ExportSource, ...]) -> dict[str, int]:
    """Every name of every parameter the parts' modules hold -> id(parameter) (tied names included)."""
    names: dict[str, int] = {}
    for part in parts:
        names.update((n, id(p)) for n, p in part.module.named_parameters(remove_duplicate=False))
    return names
