"""The consumer map of an ONNX model: every node input slot that reads a stored tensor, and its use.

Names are resolved the way ONNX scoping does (a subgraph sees its outer graphs' values), seeing
through Identity nodes: an Identity output is another name for its input. Each read gets a role:
a Gather's data input is a lookup table (``embedding``), a MatMul's or Gemm's A or B input a matrix
product (``head``), also when the tensor reaches it through Transpose and Identity nodes (the
dynamo exporter writes a tied head as Transpose -> MatMul of the embedding). Chains are followed
in node order, which ONNX requires to be topological; in a file that is not, a chain read before
it is written is not followed (the read keeps role ``other``; no tensor or consumer is missed).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from tieaudit.core.errors import InputError
from tieaudit.core.records import Consumer, ConsumerRole

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto

_ONNX_DOMAINS = ("", "ai.onnx")

Scope = ChainMap[str, "str | None"]
"""Value name -> tensor name it refers to (None: a value that is not a stored tensor).

One map per graph, chained to the enclosing graphs' maps: a subgraph sees outer values.
"""

Chains = ChainMap[str, "tuple[str, int] | None"]
"""Value name -> (tensor, index of its consumer) for the output of a Transpose/Identity chain that
starts at that consumer's read of a stored tensor; None for every other value a graph defines
(so an inner name hides an outer chain). Chained to the enclosing graphs' maps like Scope."""

_PASS_THROUGH = ("Transpose", "Identity")
"""Operators whose output a matrix product reads as the same matrix (or its transpose)."""


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


def _role(node: NodeProto, slot: int) -> ConsumerRole:
    """The use of input slot of node, as far as the node alone tells (a chain's end is found later)."""
    if is_op(node, "Gather") and slot == 0:
        return "embedding"
    if (is_op(node, "MatMul") or is_op(node, "Gemm")) and slot in (0, 1):
        return "head"
    return "alias" if is_op(node, "Identity") else "other"


class ConsumerMap:
    """Tensor name -> the node input slots reading it, gathered graph by graph."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.uses: dict[str, list[Consumer]] = {}
        self.chains: Chains = ChainMap()
        self.reached: dict[tuple[str, int], list[Consumer]] = {}

    def add_tensor(self, name: str) -> None:
        """A stored tensor, read by no node so far."""
        self.uses[name] = []

    @contextmanager
    def graph(self, graph: GraphProto) -> Iterator[None]:
        """Record a (sub)graph's nodes within this block: its inputs and initializers hide outer chains."""
        self.chains = self.chains.new_child({value.name: None for value in graph.input})
        self.chains.update((init.name, None) for init in graph.initializer)
        try:
            yield
        finally:
            self.chains = self.chains.parents

    def record(self, node: NodeProto, index: int, scope: Scope, *, graph_label: str) -> str:
        """Record node's reads of stored tensors; returns the node's name (``#index`` when unnamed)."""
        node_name = text(node.name, "node name", self.path) or f"#{index}"
        op_type = text(node.op_type, "operator type", self.path)
        passes = any(is_op(node, op) for op in _PASS_THROUGH)
        output_chain: tuple[str, int] | None = None
        for slot, value in enumerate(node.input):
            target = scope.get(value) if value else None
            origin = self.chains.get(value) if value and target is None else None
            if target is None and origin is None:
                continue
            role = _role(node, slot)
            use = Consumer(node=node_name, op_type=op_type, slot=slot, graph=graph_label, role=role)
            if target is not None:
                if passes and slot == 0:
                    output_chain = (target, len(self.uses[target]))
                self.uses[target].append(use)
            elif origin is not None and role == "head":
                self.reached.setdefault(origin, []).append(use)
            elif passes and slot == 0:
                output_chain = origin
        for output in node.output:
            self.chains[output] = None
        if output_chain is not None and node.output:
            self.chains[node.output[0]] = output_chain
        return node_name

    def frozen(self) -> dict[str, tuple[Consumer, ...]]:
        """Tensor name -> its consumers, a chain's first node with the matrix products it reaches."""
        return {
            name: tuple(
                replace(use, role="head", reaches=tuple(self.reached[name, index]))
                if (name, index) in self.reached
                else use
                for index, use in enumerate(uses)
            )
            for name, uses in self.uses.items()
        }
