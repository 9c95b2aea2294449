"""The consumer map of an ONNX model: every node input slot that reads a stored tensor.

Names are resolved the way ONNX scoping does (a subgraph sees its outer graphs' values), seeing
through Identity nodes: an Identity output is another name for its input.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tieaudit.core.errors import InputError
from tieaudit.core.records import Consumer

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto

_ONNX_DOMAINS = ("", "ai.onnx")

Scope = ChainMap[str, "str | None"]
"""Value name -> tensor name it refers to (None: a value that is not a stored tensor).

One map per graph, chained to the enclosing graphs' maps: a subgraph sees outer values.
"""


def text(value: str | bytes, what: str, path: str) -> str:
    """A protobuf string field as str: protobuf hands out bytes when the field is not valid UTF-8."""
    if isinstance(value, bytes):
        raise InputError(f"{what} {value[:40]!r} is not valid UTF-8", path)
    return value


def subgraphs(node: NodeProto, node_path: str) -> Iterator[tuple[str, GraphProto]]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield f"{node_path}/{attr.name}", attr.g
        for index, graph in enumerate(attr.graphs):
            yield f"{node_path}/{attr.name}[{index}]", graph


def is_op(node: NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in _ONNX_DOMAINS


def resolve_identities(graph: GraphProto, scope: Scope, path: str) -> dict[str, str]:
    """Point every Identity output whose chain starts at a stored tensor at that tensor (in scope);
    returns those aliases, output name -> tensor name."""
    source_of = {
        text(node.output[0], "value name", path): text(node.input[0], "value name", path)
        for node in graph.node
        if is_op(node, "Identity") and node.input and node.output
    }
    resolved: dict[str, str | None] = {}
    aliases: dict[str, str] = {}

    def target_of(name: str) -> str | None:
        # Follow the chain to its first non-Identity value once, whatever the node order
        # (sweeping the node list until nothing changes is quadratic on a reversed chain).
        chain: dict[str, None] = {}
        while name in source_of and name not in resolved and name not in chain:
            chain[name] = None
            name = source_of[name]
        if name in resolved:
            end = resolved[name]
        else:
            end = None if name in chain else scope.get(name)  # a cycle ends nowhere
        for step in chain:
            resolved[step] = end
        return end

    for output in source_of:
        target = target_of(output)
        if target is not None and scope.get(output) != target:
            scope[output] = aliases[output] = target
    return aliases


class ConsumerMap:
    """Tensor name -> the node input slots reading it, gathered graph by graph."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.uses: dict[str, list[Consumer]] = {}

    def add_tensor(self, name: str) -> None:
        """A stored tensor, read by no node so far."""
        self.uses[name] = []

    def record(self, node: NodeProto, index: int, scope: Scope, *, graph_label: str) -> str:
        """Record node's reads of stored tensors; returns the node's name (``#index`` when unnamed)."""
        node_name = text(node.name, "node name", self.path) or f"#{index}"
        op_type = text(node.op_type, "operator type", self.path)
        for slot, value in enumerate(node.input):
            target = scope.get(value) if value else None
            if target is not None:
                use = Consumer(node=node_name, op_type=op_type, slot=slot, graph=graph_label)
                self.uses[target].append(use)
        return node_name

    def frozen(self) -> dict[str, tuple[Consumer, ...]]:
        return {name: tuple(uses) for name, uses in self.uses.items()}
