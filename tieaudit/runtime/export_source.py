"""What ``tieaudit export`` exports: a Hugging Face folder or a ``module:function`` factory.

A folder's head class comes from its config.json (``runtime.export_kinds``: causal LM, masked LM,
seq2seq LM). A ``module:function`` is imported from the current folder and called with no
arguments; it returns ``(module, example_inputs)`` or ``(module, example_inputs, dynamic_shapes)``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping

from tieaudit.core.errors import InputError, UsageError, one_line
from tieaudit.core.escape import printable
from tieaudit.core.extras import require
from tieaudit.runtime.export_kinds import hf_model
from tieaudit.runtime.export_parts import ExportModel, ExportSource

EXPORT_MODULES = ("torch", "onnxscript", "onnxruntime")
"""What every export imports: the exporter, torch.onnx.export's dynamo backend, the parity check."""


def require_export(source: str) -> None:
    """MissingExtra (one line: pip install 'tieaudit[export]') before anything is loaded, when a module
    the export of source needs cannot be imported; a folder needs transformers too."""
    folder = os.path.isdir(source)
    modules = (*EXPORT_MODULES, "transformers") if folder else EXPORT_MODULES
    require("export of a Hugging Face folder" if folder else "export", modules, extra="export")


def _factory_source(spec: str) -> ExportModel:
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
    description = f"{type(made[0]).__name__} from {spec}(), inputs {shapes}"
    part = ExportSource(
        module=made[0].eval(),
        inputs=inputs,
        input_names=(),
        output_names=(),
        dynamic_shapes=made[2] if len(made) == 3 else None,
        description=description,
    )
    return ExportModel(
        kind="module:function", model_class=type(made[0]).__name__, parts=(part,), description=description
    )


HF_DIMS = ("batch", "sequence", "decoder_sequence")
"""The --dim names a Hugging Face folder's example inputs take (decoder_sequence: seq2seq only)."""


def _check_dims(dims: Mapping[str, int], known: tuple[str, ...], source: str) -> None:
    """A --dim that sets nothing is a usage error, not silently ignored."""
    unknown = [name for name in dims if name not in known]
    if not unknown:
        return
    names = ", ".join(f"--dim {printable(n)}" for n in unknown)
    if known:
        raise UsageError(
            f"{names} sets nothing: a Hugging Face folder's example sizes are --dim batch, --dim sequence "
            "and, for a seq2seq model, --dim decoder_sequence"
        )
    raise UsageError(f"{names} sets nothing: {source}() brings its own example inputs")


def load_source(source: str, dims: Mapping[str, int]) -> ExportModel:
    """The model, its parts, example inputs and names for source (a folder or module:function)."""
    if os.path.isdir(source):
        if not os.path.isfile(os.path.join(source, "config.json")):
            raise InputError("not a Hugging Face model folder (no config.json)", source)
        _check_dims(dims, HF_DIMS, source)
        return hf_model(source, dims)
    if ":" in source and not os.path.exists(source):
        _check_dims(dims, (), source)
        return _factory_source(source)
    raise UsageError(f"SOURCE must be a Hugging Face model folder or module:function (not {source!r})")
