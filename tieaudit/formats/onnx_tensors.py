"""Every TensorProto an ONNX model holds, wherever it sits, so that none can name external data
tieaudit has not confined.

tieaudit reads initializers and Constant values as tensors; the rest are never read, but a loader
may open their files all the same: ``onnx.load`` loads external data for every node attribute
tensor (any operator, TENSORS lists, functions' nodes, subgraphs), and ONNX Runtime for sparse
initializers too. ``every_tensor`` walks the places onnx.proto defines (tests compare this list
with the protobuf descriptors, so a new field cannot be missed):

- ``GraphProto.initializer`` and ``GraphProto.sparse_initializer`` (values and indices);
- ``AttributeProto.t``, ``.tensors``, ``.sparse_tensor``, ``.sparse_tensors``, and the graphs in
  ``.g`` and ``.graphs``, on the nodes of every graph and of every ``FunctionProto``, and in a
  function's default attribute values (``FunctionProto.attribute_proto``);
- ``TrainingInfoProto.initialization`` and ``.algorithm`` graphs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from tieaudit.core.escape import quoted

if TYPE_CHECKING:
    from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto


def _name(value: str | bytes) -> str:
    # protobuf hands out bytes for a string field that is not valid UTF-8
    return quoted(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)


def _sparse(label: str, sparse: SparseTensorProto) -> Iterator[tuple[str, TensorProto]]:
    yield f"{label} (values)", sparse.values
    yield f"{label} (indices)", sparse.indices


def _attributes(where: str, attributes: Iterable[AttributeProto]) -> Iterator[tuple[str, TensorProto]]:
    """The tensors held directly by attributes (their subgraphs are walked by the caller)."""
    for attr in attributes:
        label = f"attribute {_name(attr.name)} of {where}"
        if attr.HasField("t"):
            yield label, attr.t
        for tensor in attr.tensors:
            yield label, tensor
        if attr.HasField("sparse_tensor"):
            yield from _sparse(label, attr.sparse_tensor)
        for sparse in attr.sparse_tensors:
            yield from _sparse(label, sparse)


def _subgraphs(where: str, attributes: Iterable[AttributeProto]) -> Iterator[tuple[str, GraphProto]]:
    for attr in attributes:
        # A subgraph is named by its owner alone, so labels stay short however deep it is.
        inner = f"the subgraph {_name(attr.name)} of {where}"
        if attr.HasField("g"):
            yield inner, attr.g
        for graph in attr.graphs:
            yield inner, graph


def every_tensor(model: ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """(where, tensor) for every TensorProto in the model, without recursion."""
    graphs: list[tuple[str, GraphProto]] = [("the main graph", model.graph)]
    for index, info in enumerate(model.training_info):
        graphs.append((f"training_info[{index}].initialization", info.initialization))
        graphs.append((f"training_info[{index}].algorithm", info.algorithm))
    # (where, attributes): every node's, and every function's default attribute values
    owners: list[tuple[str, Iterable[AttributeProto]]] = []
    for function in model.functions:
        where = f"function {_name(function.name)}"
        owners.append((f"{where} (default value)", function.attribute_proto))
        owners.extend(_node_owners(where, function.node))
    while graphs or owners:
        if graphs:
            where, graph = graphs.pop()
            for init in graph.initializer:
                yield f"initializer {_name(init.name)} in {where}", init
            for sparse in graph.sparse_initializer:
                yield from _sparse(f"sparse initializer {_name(sparse.values.name)} in {where}", sparse)
            owners.extend(_node_owners(where, graph.node))
            continue
        where, attributes = owners.pop()
        yield from _attributes(where, attributes)
        graphs.extend(_subgraphs(where, attributes))


def _node_owners(where: str, nodes: Iterable[NodeProto]) -> Iterator[tuple[str, Iterable[AttributeProto]]]:
    for index, node in enumerate(nodes):
        node_name = _name(node.name) if node.name else f"#{index} ({_name(node.op_type)})"
        yield f"node {node_name} in {where}", node.attribute
