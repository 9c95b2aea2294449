"""What ``tieaudit export`` exports: a Hugging Face folder or a ``module:function`` factory.

A folder is loaded with transformers' ``AutoModelForCausalLM`` (local files only) and wrapped to
return the logits for ``input_ids`` (int64, [batch, sequence], dynamic); an attention mask of ones
is built inside, which keeps transformers off ``aten::diff``. A ``module:function`` is imported from
the current folder and called with no arguments; it returns ``(module, example_inputs)`` or
``(module, example_inputs, dynamic_shapes)``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tieaudit.core.errors import InputError, UsageError, one_line
from tieaudit.core.extras import require

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class ExportSource:
    """A torch module ready for torch.onnx.export."""

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


def parameter_sizes(module: torch.nn.Module) -> dict[int, int]:
    """id(parameter) -> bytes, each parameter once however many names it has (a tie counts once)."""
    return {id(p): p.numel() * p.element_size() for p in module.parameters()}


def logits_only(model: torch.nn.Module) -> torch.nn.Module:
    """A causal LM as input_ids -> logits, in eval mode. The explicit mask of ones keeps
    transformers off aten::diff, which the TorchScript exporter cannot export."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)
            logits: torch.Tensor = self.m(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
            return logits

    return LogitsOnly().eval()


def _hf_source(folder: str, dims: Mapping[str, int]) -> ExportSource:
    import torch

    # Exporting builds the model, but never with code from the folder and never from the Hub.
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import transformers
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"transformers cannot load it as a causal LM: {one_line(exc, 300)}", folder) from exc
    model: torch.nn.Module = loaded.eval()  # type: ignore[no-untyped-call]

    batch, sequence = dims.get("batch", 1), dims.get("sequence", 8)
    embedding: Any = loaded.get_input_embeddings()
    vocab = int(embedding.weight.shape[0])  # the rows, which may differ from config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, sequence), dtype=torch.int64, generator=generator)
    return ExportSource(
        module=logits_only(model),
        inputs=(ids,),
        input_names=("input_ids",),
        output_names=("logits",),
        dynamic_shapes={"input_ids": {0: "batch", 1: "sequence"}},
        description=f"{type(model).__name__} from {folder}, "
        f"input_ids int64[{batch}, {sequence}], dynamic axes",
    )


def _factory_source(spec: str) -> ExportSource:
    import torch

    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name.isidentifier():
        raise UsageError(f"SOURCE must be a Hugging Face folder or module:function (not {spec!r})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot import {spec}: {exc}") from exc
    try:
        made = factory()
    except Exception as exc:  # the user's code: its failure is an input error, reported in one line
        raise InputError(f"{spec}() raised {type(exc).__name__}: {one_line(exc, 300)}") from exc
    if not isinstance(made, tuple) or len(made) not in (2, 3) or not isinstance(made[0], torch.nn.Module):
        expected = "(module, example_inputs) or (module, example_inputs, dynamic_shapes)"
        raise UsageError(f"{spec}() must return {expected}")
    inputs = made[1] if isinstance(made[1], tuple) else (made[1],)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    shapes = ", ".join(f"{t.dtype}{list(t.shape)}".replace("torch.", "") for t in tensors)
    return ExportSource(
        module=made[0].eval(),
        inputs=inputs,
        input_names=(),
        output_names=(),
        dynamic_shapes=made[2] if len(made) == 3 else None,
        description=f"{type(made[0]).__name__} from {spec}(), inputs {shapes}",
    )


EXPORT_MODULES = ("torch", "onnxscript", "onnxruntime")
"""What every export imports: the exporter, torch.onnx.export's dynamo backend, the parity check."""


def require_export(source: str) -> None:
    """MissingExtra (one line: pip install 'tieaudit[export]') before anything is loaded, when a module
    the export of source needs cannot be imported; a folder needs transformers too."""
    folder = os.path.isdir(source)
    modules = (*EXPORT_MODULES, "transformers") if folder else EXPORT_MODULES
    require("export of a Hugging Face folder" if folder else "export", modules, extra="export")


def load_source(source: str, dims: Mapping[str, int]) -> ExportSource:
    """The module, example inputs and names for source (a folder or module:function)."""
    if os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, "config.json")):
            raise InputError("not a Hugging Face model folder (no config.json)", source)
        return _hf_source(source, dims)
    if ":" in source and not os.path.exists(source):
        return _factory_source(source)
    raise UsageError(f"SOURCE must be a Hugging Face model folder or module:function (not {source!r})")
