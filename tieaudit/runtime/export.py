"""torch model -> ONNX with the tie kept, checked end to end.

Export with the dynamo exporter into a staging folder beside OUT, audit the result with tieaudit's
detector, re-tie any copy with the ONNX retie writer (the exporter's optimizer folds Transpose(E)
into a copy for small matrices), compare ONNX Runtime's outputs with torch's on the example inputs,
run the static runtime check, and only then move OUT (and OUT.data) into place. torch,
transformers and onnxruntime are imported here, on use, never by ``import tieaudit``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tieaudit.core.errors import TieauditError, UsageError, one_line
from tieaudit.graph.detect import ALL_RELATIONS, CopyGroup
from tieaudit.repair.plan import Decision
from tieaudit.rules.finding import Finding
from tieaudit.runtime.export_source import ExportSource, load_source, parameter_sizes, require_export

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ATOL = 1e-4
EXTERNAL_DATA_ABOVE = 1 << 30
"""Parameter bytes above which the export keeps weights in OUT.data (a protobuf stops at 2 GB)."""


class ExportError(TieauditError):
    """The exporter, the re-tie or ONNX Runtime failed on this model."""


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What ``tieaudit export`` did and checked."""

    source: str
    out: str
    written: bool
    """OUT (and OUT.data) were moved into place: every check passed."""
    description: str
    """The source, e.g. the model class and example input shapes."""
    parameter_bytes: int
    """torch parameter bytes, each parameter once (tied names count once)."""
    parameter_initializer_bytes: int
    """Bytes of OUT's initializers named after a parameter (any of its tied names)."""
    initializer_bytes: int
    """Bytes of every initializer in OUT."""
    parameters_not_stored: tuple[str, ...]
    """Parameters no initializer is named after (merged or folded by the exporter)."""
    retied: tuple[Decision, ...]
    """Copies of the exported model turned back into one initializer."""
    remaining: tuple[CopyGroup, ...]
    """Copies left in OUT (the tie check fails when any)."""
    max_abs_diff: float
    """Largest |ONNX Runtime - torch| over every output element."""
    atol: float
    runtime: tuple[Finding, ...]
    """TIE005: copies ONNX Runtime makes under its default session options."""
    runtime_error: str | None

    @property
    def parity_ok(self) -> bool:
        """ONNX Runtime's outputs within atol of torch's."""
        return self.max_abs_diff <= self.atol

    @property
    def passed(self) -> bool:
        """Parity, no copy left, runtime check ran."""
        return self.parity_ok and not self.remaining and self.runtime_error is None


def _check_out(out: str) -> None:
    for path in (out, out + ".data"):
        if os.path.exists(path) or os.path.islink(path):
            raise UsageError("already exists; remove it or choose another OUT", path)
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise UsageError("the folder for OUT does not exist", out)


def _torch_export(source: ExportSource, path: str, opset: int | None) -> None:
    import contextlib
    import io
    import logging
    import warnings

    import torch

    large = sum(parameter_sizes(source.module).values()) > EXTERNAL_DATA_ABOVE
    # The exporter prints progress, graphs and warnings; the summary (or one error line) is the output.
    logging.disable(logging.CRITICAL)
    noise = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                source.module,
                source.inputs,
                path,
                dynamo=True,
                external_data=large,
                opset_version=opset,
                input_names=list(source.input_names) or None,
                output_names=list(source.output_names) or None,
                dynamic_shapes=source.dynamic_shapes,
            )
    except Exception as exc:  # the exporter raises many kinds; each is this model's problem, not ours
        root: BaseException = exc
        while root.__cause__ is not None:  # the exporter wraps torch.export's error: name the cause
            root = root.__cause__
        first = next((line for line in str(root).splitlines() if line.strip()), "")
        what = f"{type(root).__name__}: {one_line(Exception(first))}"
        raise ExportError(f"torch.onnx.export(dynamo=True) failed: {what}") from exc
    finally:
        logging.disable(logging.NOTSET)


def _torch_outputs(source: ExportSource) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        result = source.module(*source.inputs)
    flat = [result] if isinstance(result, torch.Tensor) else list(torch.utils._pytree.tree_leaves(result))
    return [t.detach().float().numpy() for t in flat if isinstance(t, torch.Tensor)]


def _parity(source: ExportSource, path: str, expected: list[np.ndarray]) -> float:
    """Max abs difference between ONNX Runtime (CPU, default options) and torch on the example inputs."""
    import numpy as np
    import onnxruntime as ort
    import torch

    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ExportError(f"onnxruntime cannot load the export: {one_line(exc)}") from exc
    tensors = [t for t in torch.utils._pytree.tree_leaves(source.inputs) if isinstance(t, torch.Tensor)]
    inputs = session.get_inputs()
    if len(inputs) != len(tensors):
        raise ExportError(f"the export has {len(inputs)} inputs for {len(tensors)} example tensors")
    feeds = {i.name: t.detach().numpy() for i, t in zip(inputs, tensors, strict=True)}
    actual = session.run(None, feeds)
    if [a.shape for a in actual] != [e.shape for e in expected]:
        shapes = [list(a.shape) for a in actual], [list(e.shape) for e in expected]
        raise ExportError(f"outputs differ in number or shape: onnx {shapes[0]}, torch {shapes[1]}")
    pairs = zip(actual, expected, strict=True)
    return max((float(np.max(np.abs(a.astype(np.float64) - e))) for a, e in pairs if a.size), default=0.0)


def _stored(
    path: str, aliases: Mapping[str, int], sizes: Mapping[int, int]
) -> tuple[int, int, tuple[str, ...], tuple[CopyGroup, ...]]:
    """(parameter initializer bytes, all initializer bytes, parameters not stored, copies left) of path."""
    from tieaudit.formats import open_checkpoint
    from tieaudit.graph.detect import find_copies, lookup_tables

    with open_checkpoint(path) as opened:
        ckpt = opened.checkpoint
        stored_ids = {aliases[t.name] for t in ckpt.tensors if t.name in aliases}
        param_bytes = sum(t.nbytes for t in ckpt.tensors if t.name in aliases)
        total = sum(t.nbytes for t in ckpt.tensors)
        remaining = find_copies(opened, ALL_RELATIONS, lookup_names=lookup_tables(ckpt))
    first_name: dict[int, str] = {}
    for name, ident in aliases.items():
        first_name.setdefault(ident, name)
    missing = tuple(first_name[i] for i in sizes if i not in stored_ids)
    return param_bytes, total, missing, tuple(remaining)


def export_model(
    source: str,
    out: str,
    *,
    opset: int | None = None,
    dims: Mapping[str, int] | None = None,
    atol: float = DEFAULT_ATOL,
    runtime_timeout: float = 300.0,
) -> ExportResult:
    """Export source to out with the tie kept; out is written only when every check passes."""
    from tieaudit.repair.publish import publish, resolve
    from tieaudit.repair.retie import retie
    from tieaudit.runtime.measure import runtime_findings

    _check_out(out)
    require_export(source)
    loaded = load_source(source, dims or {})
    sizes = parameter_sizes(loaded.module)
    aliases = {name: id(p) for name, p in loaded.module.named_parameters(remove_duplicate=False)}
    folder, base = os.path.split(os.path.abspath(out))
    stage = tempfile.mkdtemp(prefix=f".{base}.tieaudit-export-", dir=folder)
    try:
        raw = os.path.join(stage, "exported", "exported.onnx")
        os.mkdir(os.path.dirname(raw))
        _torch_export(loaded, raw, opset)
        final_stage = os.path.join(stage, "out")
        os.mkdir(final_stage)
        staged = os.path.join(final_stage, base)
        plan = retie(raw, staged, relations=frozenset(ALL_RELATIONS)).plan
        shutil.rmtree(os.path.dirname(raw))
        param_bytes, total, missing, remaining = _stored(staged, aliases, sizes)
        max_diff = _parity(loaded, staged, _torch_outputs(loaded))
        runtime: tuple[Finding, ...] = ()
        runtime_error = None
        try:
            runtime = tuple(runtime_findings(staged, runtime_timeout, shown_path=out))
        except TieauditError as exc:
            runtime_error = exc.message
        result = ExportResult(
            source=source,
            out=out,
            written=False,
            description=loaded.description,
            parameter_bytes=sum(sizes.values()),
            parameter_initializer_bytes=param_bytes,
            initializer_bytes=total,
            parameters_not_stored=missing,
            retied=plan.applied,
            remaining=remaining,
            max_abs_diff=max_diff,
            atol=atol,
            runtime=runtime,
            runtime_error=runtime_error,
        )
        if result.passed:
            publish(final_stage, out=resolve(out, "OUT"), out_given=out)
            result = replace(result, written=True)
        return result
    finally:
        shutil.rmtree(stage, ignore_errors=True)
