"""What the runtime check reads from ONNX graphs: the model's facts, and ONNX Runtime's own copies.

The copies are found in the optimized model ONNX Runtime saves (``optimized_model_filepath``),
read with tieaudit's ONNX reader and searched with its detector: an initializer there that the
input model does not have, holding the values of one it does, is a copy ONNX Runtime made
(constant folding of Transpose(E), a Cast, ...). Prepacking is not visible in the saved model: it
is predicted from the consumers (an initializer packed for a MatMul and still read by a Gather is
held twice) and confirmed by the memory measurement. The synthetic inputs are runtime_inputs'.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tieaudit.core.errors import InputError, UsageError, one_line
from tieaudit.core.records import Checkpoint
from tieaudit.formats import open_checkpoint
from tieaudit.graph import DEFAULT_MIN_BYTES
from tieaudit.graph.detect import ALL_RELATIONS, CopyGroup, find_copies, lookup_tables
from tieaudit.runtime.inputs import InputSpec, input_specs
from tieaudit.runtime.probe import DEFAULT_FOLD_LIMIT

__all__ = ["InputSpec", "ModelFacts", "StaticView", "analyse_optimized", "input_specs", "read_model"]

PREPACKED_SLOTS = {"MatMul": 1, "FusedMatMul": 1, "Gemm": 1}
"""Operators whose constant B input ONNX Runtime's CPU kernels pack (MLAS) at session creation."""


@dataclass(frozen=True, kw_only=True)
class RuntimeDuplicate:
    """A second copy of an input initializer that ONNX Runtime holds in memory."""

    original: str
    """The input model's initializer."""
    copy: str | None
    """The new initializer in the optimized model; None for a prepacked buffer (never saved)."""
    relation: str | None
    """equal, transposed or cast (copy relative to original); None for a prepacked buffer."""
    mechanism: str
    """constant-folding or prepacking."""
    nbytes: int
    """Bytes of the extra copy."""
    consumers: tuple[str, ...]
    """Nodes reading the copy (or packing the original), as ``OpType node``."""


@dataclass(frozen=True, kw_only=True)
class Recomputed:
    """A Transpose or Cast of an initializer left in the graph: a temporary copy on every run."""

    initializer: str
    """The initializer it reads."""
    op_type: str
    """Transpose or Cast."""
    node: str
    """The node's name."""
    nbytes: int
    """Bytes of the initializer (the temporary is as large)."""


@dataclass(frozen=True)
class StaticView:
    """ONNX Runtime's copies under one configuration, from its optimized model."""

    duplicates: tuple[RuntimeDuplicate, ...]
    """Copies ORT holds besides the input's initializers."""
    recomputed: tuple[Recomputed, ...]
    """Per-run temporaries of whole initializers."""

    @property
    def duplicate_bytes(self) -> int:
        """Bytes of every extra copy."""
        return sum(d.nbytes for d in self.duplicates)


def shared_initializers(ckpt: Checkpoint, min_bytes: int = DEFAULT_MIN_BYTES) -> dict[str, tuple[str, ...]]:
    """Matrices read by two or more nodes (where a runtime copy can appear) -> their readers.

    Vectors are left out: the exporter shares one LayerNorm ones-vector among many nodes, and no
    runtime copies a vector for a matrix kernel.
    """
    matrices = {t.name for t in ckpt.tensors if len(t.shape) >= 2 and t.nbytes >= min_bytes}
    return {
        name: tuple(f"{u.op_type} {u.node}" for u in uses)
        for name, uses in ckpt.consumers.items()
        if len(uses) >= 2 and name in matrices
    }


def _folded(
    group: CopyGroup, originals: frozenset[str], stored: Mapping[str, int], *, ckpt: Checkpoint
) -> list[RuntimeDuplicate]:
    """Members ORT created beyond the copies the input already stored, named against an input initializer.

    stored: input initializer -> size of its copy group in the input (TIE001's business, not ours):
    ORT folding Transpose(E_copy) into a new initializer and dropping E_copy adds no copy.
    """
    relation = {m.name: m.relation for m in group.members}
    names = group.names
    anchor = group.kept if group.kept in originals else next((n for n in names if n in originals), names[0])
    before = max((stored.get(n, 1) for n in names if n in originals), default=1)
    created = [n for n in names if n not in originals and n != anchor]
    duplicates = []
    for name in created[max(0, len(created) - (len(names) - before)) :]:
        # Relations are stated against group.kept; when the anchor is another name, compose through kept.
        if anchor == group.kept:
            rel = relation[name]
        elif name == group.kept:
            rel = relation[anchor]
        else:
            flips = (relation[name] == "transposed") != (relation[anchor] == "transposed")
            casts = "cast" in (relation[name], relation[anchor])
            rel = "cast" if casts else "transposed" if flips else "equal"
        readers = tuple(f"{u.op_type} {u.node}" for u in ckpt.consumers.get(name, ()))
        duplicates.append(
            RuntimeDuplicate(
                original=anchor,
                copy=name,
                relation=rel,
                mechanism="constant-folding",
                nbytes=ckpt.tensor(name).nbytes,
                consumers=readers,
            )
        )
    return duplicates


def _prepacked(ckpt: Checkpoint, min_bytes: int) -> list[RuntimeDuplicate]:
    """Initializers packed for a MatMul/Gemm B input while another node still reads the original."""
    found = []
    for tensor in ckpt.tensors:
        uses = ckpt.consumers.get(tensor.name, ())
        packing = [u for u in uses if PREPACKED_SLOTS.get(u.op_type) == u.slot]
        if not packing or tensor.dtype != "float32" or len(tensor.shape) != 2 or tensor.nbytes < min_bytes:
            continue
        # Each packing kernel keeps its own packed buffer; the original is freed when nothing else reads it.
        extra = len(packing) - (0 if len(packing) < len(uses) else 1)
        if extra > 0:
            readers = tuple(f"{u.op_type} {u.node}" for u in packing)
            found.append(
                RuntimeDuplicate(
                    original=tensor.name,
                    copy=None,
                    relation=None,
                    mechanism="prepacking",
                    nbytes=extra * tensor.nbytes,
                    consumers=readers,
                )
            )
    return found


def _recomputed(ckpt: Checkpoint, min_bytes: int) -> list[Recomputed]:
    sizes = {t.name: t.nbytes for t in ckpt.tensors}
    return [
        Recomputed(initializer=name, op_type=u.op_type, node=u.node, nbytes=sizes[name])
        for name, uses in ckpt.consumers.items()
        for u in uses
        if u.op_type in ("Transpose", "Cast") and u.slot == 0 and sizes.get(name, 0) >= min_bytes
    ]


def analyse_optimized(
    optimized_path: str,
    originals: frozenset[str],
    stored: Mapping[str, int],
    *,
    prepacking: bool,
    min_bytes: int = DEFAULT_MIN_BYTES,
) -> StaticView:
    """ORT's copies in the optimized model at optimized_path, named against the input's initializers."""
    with open_checkpoint(optimized_path) as opened:
        ckpt = opened.checkpoint
        groups = find_copies(opened, ALL_RELATIONS, min_bytes, lookup_names=lookup_tables(ckpt))
        duplicates = [d for g in groups for d in _folded(g, originals, stored, ckpt=ckpt)]
        if prepacking:
            duplicates += _prepacked(ckpt, min_bytes)
        return StaticView(tuple(duplicates), tuple(_recomputed(ckpt, min_bytes)))


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """What the runtime check knows about the input model before any probe."""

    path: str
    """Absolute path handed to ONNX Runtime."""
    originals: frozenset[str]
    """The input's initializer names."""
    shared: Mapping[str, tuple[str, ...]]
    """Matrices read by two or more nodes -> their readers."""
    sizes: Mapping[str, int]
    """Initializer name -> bytes."""
    stored: Mapping[str, int]
    """Initializer -> size of the copy group it belongs to in the input (copies stored in the file)."""
    external: bool
    """Some initializer lives in external data."""
    inputs: tuple[InputSpec, ...]
    """Synthetic inputs."""
    weight_bytes: int
    """Bytes ONNX Runtime is handed: the .onnx file and the external data its initializers read."""

    @property
    def input_bytes(self) -> int:
        """Bytes of every synthetic input."""
        return sum(s.nbytes for s in self.inputs)

    @property
    def largest_shared(self) -> int:
        """Bytes of the largest initializer read by two or more nodes (0 when none)."""
        return max((self.sizes[n] for n in self.shared), default=0)

    @property
    def fold_limit(self) -> int:
        """Default fold limit: 1 MiB, or half the largest shared matrix when that is smaller."""
        return min(DEFAULT_FOLD_LIMIT, self.largest_shared // 2) if self.shared else DEFAULT_FOLD_LIMIT


def read_model(path: str, dims: Mapping[str, int], *, with_inputs: bool = True) -> ModelFacts:
    """The facts the runtime check needs, read once with tieaudit's reader before any probe.

    with_inputs=False: no synthetic inputs (a probe that only creates the session needs none).
    """
    from tieaudit.formats.onnx_model import load_skeleton

    with open_checkpoint(path) as opened:  # also confines external data before ORT is handed the model
        ckpt = opened.checkpoint
        if ckpt.format != "onnx":
            raise UsageError(f"runtime needs an ONNX model, this is {ckpt.format}", path)
        # the graph's inputs only: the skeleton's parse leaves the weights' bytes in the file
        inputs = input_specs(load_skeleton(path)[0], ckpt, dims, path=path) if with_inputs else ()
        # embedded bytes are served from the model file itself: only other files are external data
        outside = [s for s in ckpt.storages.values() if s.file != ckpt.files[0]]
        external = bool(outside)
        try:
            model_bytes = os.path.getsize(path)
        except OSError as exc:
            raise InputError(f"cannot read the model: {one_line(exc)}", path) from None
        weights = model_bytes + sum(s.nbytes for s in outside)
        sizes = {t.name: t.nbytes for t in ckpt.tensors}
        groups = find_copies(opened, ALL_RELATIONS, DEFAULT_MIN_BYTES, lookup_names=lookup_tables(ckpt))
        stored = {name: len(g.names) for g in groups for name in g.names}
        shared = shared_initializers(ckpt)
        return ModelFacts(
            path=os.path.abspath(path),
            originals=ckpt.names,
            shared=shared,
            sizes=sizes,
            stored=stored,
            external=external,
            inputs=inputs,
            weight_bytes=weights,
        )
