"""torch model -> ONNX with the tie kept, checked end to end.

Export with the dynamo exporter into a staging folder beside OUT, audit the result with tieaudit's
detector, re-tie any copy with the ONNX retie writer (the exporter's optimizer folds Transpose(E)
into a copy for small matrices), compare ONNX Runtime's outputs with torch's on the example inputs,
run the static runtime check, and only then move OUT (and OUT.data) into place. A seq2seq LM is
two files (``runtime.export_parts``), each exported, audited, re-tied and checked alone; OUT is then
the folder holding them. torch, transformers and onnxruntime are imported here, on use, never by
``import tieaudit``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tieaudit.core.errors import TieauditError, UsageError, one_line
from tieaudit.core.units import checked_seconds, checked_tolerance
from tieaudit.graph.detect import ALL_RELATIONS, CopyGroup
from tieaudit.repair.plan import Decision
from tieaudit.rules.finding import Finding
from tieaudit.runtime.export_parts import ExportSource, parameter_names, parameter_sizes
from tieaudit.runtime.export_source import load_source, require_export

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ATOL = 1e-4
EXTERNAL_DATA_ABOVE = 1 << 30
"""Parameter bytes above which the export keeps weights in OUT.data (a protobuf stops at 2 GB)."""


class ExportError(TieauditError):
    """The exporter, the re-tie or ONNX Runtime failed on this model."""


@dataclass(frozen=True, kw_only=True)
class ExportedFile:
    """One ONNX file of the export and what was checked on it."""

    path: str
    """Where it is published: OUT, or OUT/<part file> for a model exported as several files."""
    parameter_initializer_bytes: int
    """Bytes of its initializers named after a parameter (any of its tied names)."""
    initializer_bytes: int
    """Bytes of every initializer in it."""
    retied: tuple[Decision, ...]
    """Copies in the exported file turned back into one initializer."""
    remaining: tuple[CopyGroup, ...]
    """Copies left (the tie check fails when any)."""
    max_abs_diff: float
    """Largest |ONNX Runtime - torch| over its output elements, on its example inputs."""
    runtime: tuple[Finding, ...]
    """TIE005: copies ONNX Runtime makes under its default session options."""
    runtime_error: str | None


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What ``tieaudit export`` did and checked; the totals are over every file."""

    source: str
    out: str
    written: bool
    """OUT (and OUT.data) were moved into place: every check passed."""
    kind: str
    """causal LM, masked LM, seq2seq LM (from config.json's architectures) or module:function."""
    model_class: str
    """The class exported (the first of config.json's architectures export supports)."""
    description: str
    """The source, e.g. the model class and example input shapes."""
    files: tuple[ExportedFile, ...]
    """One per ONNX file, in export order."""
    parameter_bytes: int
    """torch parameter bytes, each parameter once (tied names count once)."""
    parameter_initializer_bytes: int
    """Bytes of the initializers named after a parameter, summed over the files."""
    parameter_bytes_repeated: int
    """Of those, the bytes of parameters stored in more than one file (each file loads alone)."""
    initializer_bytes: int
    """Bytes of every initializer, summed over the files."""
    parameters_not_stored: tuple[str, ...]
    """Parameters no initializer of any file is named after (merged or folded by the exporter)."""
    atol: float

    @property
    def retied(self) -> tuple[Decision, ...]:
        """Copies re-tied, over every file."""
        return tuple(d for f in self.files for d in f.retied)

    @property
    def remaining(self) -> tuple[CopyGroup, ...]:
        """Copies left, over every file."""
        return tuple(g for f in self.files for g in f.remaining)

    @property
    def max_abs_diff(self) -> float:
        """Largest |ONNX Runtime - torch| over every file's outputs."""
        return max((f.max_abs_diff for f in self.files), default=0.0)

    @property
    def runtime(self) -> tuple[Finding, ...]:
        """TIE005 findings, over every file."""
        return tuple(r for f in self.files for r in f.runtime)

    @property
    def runtime_error(self) -> str | None:
        """The runtime check's failures, one per failing file; None when it ran on every file."""
        errors = [f"{f.path}: {f.runtime_error}" if len(self.files) > 1 else f.runtime_error
                  for f in self.files if f.runtime_error is not None]  # fmt: skip
        return "; ".join(errors) if errors else None

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


def _stored(path: str, aliases: Mapping[str, int]) -> tuple[int, int, frozenset[int], tuple[CopyGroup, ...]]:
    """(parameter initializer bytes, all initializer bytes, ids of the parameters stored, copies left)."""
    from tieaudit.formats import open_checkpoint
    from tieaudit.graph.detect import find_copies, lookup_tables

    with open_checkpoint(path) as opened:
        ckpt = opened.checkpoint
        stored_ids = frozenset(aliases[t.name] for t in ckpt.tensors if t.name in aliases)
        param_bytes = sum(t.nbytes for t in ckpt.tensors if t.name in aliases)
        total = sum(t.nbytes for t in ckpt.tensors)
        remaining = find_copies(opened, ALL_RELATIONS, lookup_names=lookup_tables(ckpt))
    return param_bytes, total, stored_ids, tuple(remaining)


def _export_file(
    part: ExportSource, *, raw: str, staged: str, shown: str, opset: int | None, runtime_timeout: float
) -> tuple[ExportedFile, frozenset[int]]:
    """Export part to raw, re-tie it into staged, check it; (its record, ids of the parameters it stores)."""
    from tieaudit.repair.retie import retie
    from tieaudit.runtime.measure import runtime_findings

    os.mkdir(os.path.dirname(raw))
    _torch_export(part, raw, opset)
    plan = retie(raw, staged, relations=frozenset(ALL_RELATIONS), write_unchanged=True).plan
    shutil.rmtree(os.path.dirname(raw))
    param_bytes, total, stored_ids, remaining = _stored(staged, parameter_names((part,)))
    max_diff = _parity(part, staged, _torch_outputs(part))
    runtime: tuple[Finding, ...] = ()
    runtime_error = None
    try:
        runtime = tuple(runtime_findings(staged, runtime_timeout, shown_path=shown))
    except TieauditError as exc:
        runtime_error = exc.message
    exported = ExportedFile(
        path=shown,
        parameter_initializer_bytes=param_bytes,
        initializer_bytes=total,
        retied=plan.applied,
        remaining=remaining,
        max_abs_diff=max_diff,
        runtime=runtime,
        runtime_error=runtime_error,
    )
    return exported, stored_ids


def export_model(
    source: str,
    out: str,
    *,
    opset: int | None = None,
    dims: Mapping[str, int] | None = None,
    atol: float = DEFAULT_ATOL,
    runtime_timeout: float = 300.0,
) -> ExportResult:
    """Export source to out with the tie kept; out is written only when every check passes.

    A model exported as several files (a seq2seq LM) is written into the folder out."""
    from tieaudit.repair.publish import publish, resolve

    atol = checked_tolerance(atol, "--atol")
    runtime_timeout = checked_seconds(runtime_timeout, "--timeout")
    _check_out(out)
    require_export(source)
    loaded = load_source(source, dims or {})
    if loaded.folder_out and out.lower().endswith(".onnx"):
        names = ", ".join(p.file for p in loaded.parts)
        message = f"a {loaded.kind} is exported as {names}: OUT is the folder for them, not a .onnx file"
        raise UsageError(message, out)
    sizes: dict[int, int] = {}
    for part in loaded.parts:
        sizes.update(parameter_sizes(part.module))
    folder, base = os.path.split(os.path.abspath(out))
    stage = tempfile.mkdtemp(prefix=f".{base}.tieaudit-export-", dir=folder)
    try:
        final_stage = os.path.join(stage, "out")
        os.mkdir(final_stage)
        if loaded.folder_out:
            os.mkdir(os.path.join(final_stage, base))
        files: list[ExportedFile] = []
        stored: dict[int, int] = {}  # id(parameter) -> files storing it
        for index, part in enumerate(loaded.parts):
            exported, stored_ids = _export_file(
                part,
                raw=os.path.join(stage, f"exported-{index}", "exported.onnx"),
                staged=os.path.join(final_stage, base, *[part.file] if part.file else []),
                shown=os.path.join(out, part.file) if part.file else out,
                opset=opset,
                runtime_timeout=runtime_timeout,
            )
            files.append(exported)
            for ident in stored_ids:
                stored[ident] = stored.get(ident, 0) + 1
        first_name: dict[int, str] = {}
        for name, ident in parameter_names(loaded.parts).items():
            first_name.setdefault(ident, name)
        result = ExportResult(
            source=source,
            out=out,
            written=False,
            kind=loaded.kind,
            model_class=loaded.model_class,
            description=loaded.description,
            files=tuple(files),
            parameter_bytes=sum(sizes.values()),
            parameter_initializer_bytes=sum(f.parameter_initializer_bytes for f in files),
            parameter_bytes_repeated=sum(sizes[i] * (n - 1) for i, n in stored.items()),
            initializer_bytes=sum(f.initializer_bytes for f in files),
            parameters_not_stored=tuple(first_name[i] for i in sizes if i not in stored),
            atol=atol,
        )
        if result.passed:
            publish(final_stage, out=resolve(out, "OUT"), out_given=out)
            result = replace(result, written=True)
        return result
    finally:
        shutil.rmtree(stage, ignore_errors=True)
