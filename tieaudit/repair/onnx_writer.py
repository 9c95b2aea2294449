"""ONNX retie writer: one stored initializer per copy group, the copies rebuilt by the graph.

- equal: the copy's initializer is removed and every node input reading it (subgraphs included)
  reads the kept initializer; an output of the copy's own graph keeps its name via Identity.
- transposed: the copy becomes ``Transpose(kept, perm=[1,0])`` at the start of its graph, so its
  consumers are unchanged. MatMul -> Gemm(transB=1) was not chosen: Gemm needs a 2-D input and
  a language-model head multiplies a 3-D activation. The file stores the matrix once; ONNX
  Runtime's constant folding (on by default) materialises the transpose again in memory at
  session creation (``tieaudit runtime`` measures it and names the session options that stop it).
- cast: the copy becomes ``Cast(kept, to=<its dtype>)``.

Each removed copy is recorded in ``metadata_props["tieaudit.ties"]`` as JSON ``{dropped: {"source",
"relation", "dtype"}}``. Tensors the input kept in external data are written to one new file,
``OUT.data`` beside OUT (page-aligned, streamed from tieaudit's read-only views); embedded ones
stay embedded unless the protobuf would pass 2 GB. onnx never resolves the input's external data
and the input's data file is never opened for writing. The model is edited as its skeleton
(``formats.onnx_wire``: raw_data as placeholders) and written by ``repair.onnx_stream``, which
copies each embedded tensor's bytes from the input file: the weights are never held in memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, UsageError, one_line
from tieaudit.core.records import TensorInfo
from tieaudit.formats.onnx_consumers import is_op, subgraphs
from tieaudit.formats.onnx_model import ONNX_DTYPES, load_skeleton
from tieaudit.formats.tie_records import TIES_METADATA_KEY, composed_relation
from tieaudit.repair.interface import Writer
from tieaudit.repair.onnx_stream import Piece, inflated, write_inflated
from tieaudit.repair.plan import Decision, RetiePlan

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto

    from tieaudit.formats.onnx_wire import Skeleton

ALIGNMENT = 4096
"""Offset alignment, in the written data file, of every tensor of at least this many bytes (lets
ONNX Runtime map it); smaller tensors are packed, since padding each would cost more than it holds."""
EMBED_BELOW = 1024
"""When a model must move to external data, initializers smaller than this stay embedded (onnx's
default threshold; ONNX Runtime's shape inference cannot read a shape tensor from external data)."""
CHUNK_BYTES = 64 << 20
"""Bytes copied per write when streaming a tensor to the data file."""
_DATA_FIELDS = "raw_data float_data int32_data int64_data double_data uint64_data external_data".split()
_ONNX_TYPE_NAMES = {canonical: onnx_name for onnx_name, canonical in ONNX_DTYPES.items()}


@dataclass(kw_only=True)
class _Site:
    """Where a checkpoint tensor is defined in the model."""

    graph_path: str
    """The defining graph's path, as the reader names it (``main`` for the top graph)."""
    scopes: tuple[str, ...]
    """Paths of the graphs whose values this graph sees: outermost first, itself last."""
    value: str
    """The value name inside the graph."""
    proto: TensorProto
    """The tensor's protobuf (an initializer or a Constant's ``value``)."""
    constant: bool
    """Defined by a Constant node rather than an initializer."""


@dataclass(kw_only=True)
class _Edits:
    """The model being rewritten, its graphs and tensor sites by the reader's names."""

    model: ModelProto
    graphs: dict[str, GraphProto] = field(default_factory=dict)
    sites: dict[str, _Site] = field(default_factory=dict)
    first: dict[str, dict[str, int]] = field(default_factory=dict)
    """Graph path -> node output -> rank: kept Constants (0), then added nodes (1), before the rest."""


def _index(edits: _Edits, graph: GraphProto, path: str, *, scopes: tuple[str, ...], taken: set[str]) -> None:
    """Name every tensor exactly as OnnxReader does (same walk order, same de-duplication)."""
    label = path or "main"
    edits.graphs[label] = graph
    scopes = (*scopes, label)

    def unique(value: str) -> str:
        name = value if value not in taken else f"{label}/{value}"
        base, count = name, 2
        while name in taken:
            name, count = f"{base}#{count}", count + 1
        taken.add(name)
        return name

    for init in graph.initializer:
        edits.sites[unique(init.name)] = _Site(
            graph_path=label, scopes=scopes, value=init.name, proto=init, constant=False
        )
    for node in graph.node:
        if is_op(node, "Constant") and node.output:
            attr = next((a for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if attr is not None:
                edits.sites[unique(node.output[0])] = _Site(
                    graph_path=label, scopes=scopes, value=node.output[0], proto=attr.t, constant=True
                )
    prefix = f"{path}/" if path else ""
    for index, node in enumerate(graph.node):
        for sub_path, subgraph in subgraphs(node, prefix + (node.name or f"#{index}")):
            _index(edits, subgraph, sub_path, scopes=scopes, taken=taken)


def _delete_named(entries: Any, name: str) -> None:
    """Remove the entries of a repeated protobuf field (initializers, value infos...) named name."""
    for i in reversed(range(len(entries))):
        if entries[i].name == name:
            del entries[i]


def _remove(graph: GraphProto, site: _Site) -> None:
    """Delete the tensor's definition (initializer and its pre-IR-4 graph input, or Constant node)."""
    if site.constant:
        del graph.node[
            next(i for i, n in enumerate(graph.node) if is_op(n, "Constant") and n.output[0] == site.value)
        ]
    _delete_named(graph.initializer, site.value)
    _delete_named(graph.input, site.value)


def _repoint(graph: GraphProto, old: str, new: str, *, own: bool) -> None:
    """Every node input reading old, in graph and its subgraphs, reads new (outputs: see _apply)."""
    for node in graph.node:
        for slot, value in enumerate(node.input):
            if value == old:
                node.input[slot] = new
        for _, subgraph in subgraphs(node, ""):
            _repoint(subgraph, old, new, own=False)
    if not own or all(output.name != old for output in graph.output):
        _delete_named(graph.value_info, old)  # it would describe a value that no longer exists


def _apply(edits: _Edits, decision: Decision, dropped_dtype: str) -> None:
    from onnx import TensorProto, helper

    dropped, kept = edits.sites[decision.dropped], edits.sites[decision.kept]
    if kept.graph_path not in dropped.scopes:
        raise UsageError(
            f"cannot re-tie {decision.dropped}: {decision.kept} is defined in {kept.graph_path}, "
            f"which {dropped.graph_path} cannot see; choose another name with --keep"
        )
    if decision.relation == "cast" and decision.transposed:
        raise UsageError(
            f"{decision.dropped} is a transposed cast (not recordable); drop cast from --relations"
        )
    graph = edits.graphs[dropped.graph_path]
    _remove(graph, dropped)
    name = f"tieaudit_retie/{dropped.value}"
    node: NodeProto | None = None
    if decision.relation == "equal":
        _repoint(graph, dropped.value, kept.value, own=True)
        # Only the own graph's outputs can name it: a subgraph output must be made inside the subgraph.
        if any(output.name == dropped.value for output in graph.output):
            node = helper.make_node("Identity", [kept.value], [dropped.value], name=name)
    elif decision.relation == "transposed":
        # Transpose, not MatMul->Gemm(transB=1): Gemm needs a 2-D A and an LM head's MatMul input is 3-D.
        node = helper.make_node("Transpose", [kept.value], [dropped.value], name=name, perm=[1, 0])
    else:
        to = TensorProto.DataType.Value(_ONNX_TYPE_NAMES[dropped_dtype])
        node = helper.make_node("Cast", [kept.value], [dropped.value], name=name, to=to)
    if node is not None:
        graph.node.append(node)
        edits.first.setdefault(dropped.graph_path, {})[dropped.value] = 1
    if kept.constant:  # a Constant has no inputs: moving it first keeps the graph sorted
        edits.first.setdefault(kept.graph_path, {})[kept.value] = 0


def _reorder(edits: _Edits) -> None:
    """Kept Constants first, then the added nodes, then the rest in their order (a stable sort)."""
    for path, ranks in edits.first.items():
        edits.graphs[path].node.sort(
            key=lambda node, ranks=ranks: ranks.get(node.output[0], 2) if node.output else 2
        )


def _compose(name: str, outer: dict[str, str], inner: dict[str, str]) -> dict[str, str]:
    """name = outer(Y) and Y = inner(Z): the record of name as a function of Z."""
    relation = composed_relation(outer["relation"], inner["relation"])
    if relation is None:
        raise UsageError(
            f"{name} is recorded as a {outer['relation']} of a {inner['relation']} copy; cannot chain"
        )
    cast = outer if outer["relation"] == "cast" else inner if inner["relation"] == "cast" else None
    return {"source": inner["source"], "relation": relation, **({"dtype": cast["dtype"]} if cast else {})}


def _record(model: ModelProto, new: dict[str, dict[str, str]]) -> None:
    """Merge new ``{dropped: {"source", "relation", "dtype"}}`` entries into ``tieaudit.ties``."""
    prop = next((p for p in model.metadata_props if p.key == TIES_METADATA_KEY), None)
    record: dict[str, dict[str, str]] = json.loads(prop.value) if prop is not None else {}
    for name, entry in record.items():
        if entry["source"] in new:
            record[name] = _compose(name, entry, new[entry["source"]])
    record.update(new)
    if prop is None:
        prop = model.metadata_props.add()
        prop.key = TIES_METADATA_KEY
    prop.value = json.dumps(record, sort_keys=True)


def _external_count(edits: _Edits) -> int:
    """How many TensorProtos of the model (attributes and sparse parts too) hold external data."""
    count = 0
    for graph in edits.graphs.values():
        sparse = [*graph.sparse_initializer]
        protos = [*graph.initializer]
        for attr in (attr for node in graph.node for attr in node.attribute):
            protos += [attr.t, *attr.tensors]  # an unset attr.t reads as an empty default
            sparse += [attr.sparse_tensor, *attr.sparse_tensors]
        protos += [part for tensor in sparse for part in (tensor.values, tensor.indices)]
        count += sum(proto.data_location == proto.EXTERNAL for proto in protos)
    return count


def _stream(handle: Any, opened: OpenCheckpoint, tensor: TensorInfo) -> None:
    """Write a tensor's bytes in chunks from its read-only view (never one whole copy)."""
    flat = opened.array(tensor).reshape(-1).view(np.uint8)
    for start in range(0, len(flat), CHUNK_BYTES):
        handle.write(flat[start : start + CHUNK_BYTES])


def _externalize(edits: _Edits, opened: OpenCheckpoint, data_path: str, *, everything: bool) -> bool:
    """Write external tensors (with everything: all but small initializers) to a new file; any?"""
    from onnx import TensorProto

    ckpt = opened.checkpoint
    by_name = {t.name: t for t in ckpt.tensors}
    moves = [
        (site.proto, by_name[name])
        for name, site in edits.sites.items()
        if name in by_name
        and (
            site.proto.data_location == TensorProto.EXTERNAL
            or (everything and not site.constant and by_name[name].nbytes >= EMBED_BELOW)
        )
    ]
    unread = _external_count(edits) - sum(p.data_location == TensorProto.EXTERNAL for p, _ in moves)
    if unread:
        raise InputError(
            f"{unread} tensor(s) in external data are of a kind tieaudit does not read "
            "(sparse, segmented or an unsupported type); they cannot be moved beside OUT",
            ckpt.path,
        )
    if not moves:
        return False
    placed: dict[tuple[str, int, int], int] = {}
    location = os.path.basename(data_path)
    with open(data_path, "xb") as handle:
        for proto, tensor in moves:
            key = (tensor.storage_id, tensor.byte_offset, tensor.nbytes)
            if key not in placed:  # initializers sharing one external range keep sharing it
                if tensor.nbytes >= ALIGNMENT:
                    handle.write(b"\0" * (-handle.tell() % ALIGNMENT))
                placed[key] = handle.tell()
                _stream(handle, opened, tensor)
            for field_name in _DATA_FIELDS:
                proto.ClearField(field_name)
            proto.data_location = TensorProto.EXTERNAL
            entries = {"location": location, "offset": placed[key], "length": tensor.nbytes}
            for key_name, value in entries.items():
                entry = proto.external_data.add()
                entry.key, entry.value = key_name, str(value)
    return True


def _pieces(model: ModelProto, found: Skeleton | None) -> tuple[list[Piece], int]:
    """What writing the model takes, and its size: the skeleton's bytes with every placeholder's
    real bytes from the input file; a model parsed whole is its own serialization."""
    serialized = model.SerializeToString()
    return inflated(serialized, found.locate) if found is not None else ([serialized], len(serialized))


class OnnxWriter(Writer):
    """Rewrites an ONNX graph so each copy is computed from the kept initializer."""

    format = "onnx"

    def write(self, opened: OpenCheckpoint, plan: RetiePlan, out: str) -> list[str]:
        ckpt = opened.checkpoint
        import onnx

        # raw_data as placeholders: the weights stay in the file
        model, found = load_skeleton(ckpt.path, for_writing=True)
        edits = _Edits(model=model)
        _index(edits, model.graph, "", scopes=(), taken=set())
        ties: dict[str, dict[str, str]] = {}
        for decision in plan.applied:
            dtype = ckpt.tensor(decision.dropped).dtype
            _apply(edits, decision, dtype)
            del edits.sites[decision.dropped]
            ties[decision.dropped] = {"source": decision.kept, "relation": decision.relation}
            ties[decision.dropped].update({"dtype": dtype} if decision.relation == "cast" else {})
        _reorder(edits)
        if ties:
            _record(model, ties)
        files = [out]
        pieces, size = _pieces(model, found)
        if _externalize(edits, opened, f"{out}.data", everything=size > onnx.checker.MAXIMUM_PROTOBUF):
            files.append(f"{out}.data")
            pieces, _ = _pieces(model, found)  # the moved tensors now name OUT.data
        write_inflated(out, pieces, source=ckpt.path)
        try:
            onnx.checker.check_model(out)  # the path: external data is checked where it now lives
        except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
            raise InputError(f"the rewritten model fails onnx.checker: {one_line(exc)}", out) from exc
        return files
