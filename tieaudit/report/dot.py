"""The alias graph for Graphviz: names point at their storage; declared ties and copies as edges;
an ONNX initializer read as embedding and head points at its consumers, edges labelled by role."""

from __future__ import annotations

import json

from tieaudit.audit import Audit
from tieaudit.core.records import Consumer
from tieaudit.core.units import human_bytes

_ROLE_COLOR = {"embedding": "blue", "head": "darkgreen"}


def _quote(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid DOT quoted id


def render_dot(audit: Audit) -> str:
    """A digraph: boxes are storages shared by several names, ellipses are names."""
    ckpt = audit.graph.checkpoint
    lines = [
        "digraph tieaudit {",
        "  rankdir=LR;",
        f"  label={_quote(ckpt.path)}; labelloc=t;",
        "  node [fontname=Helvetica, fontsize=10]; edge [fontname=Helvetica, fontsize=9];",
    ]
    drawn: set[str] = set()

    def name_node(name: str, stored: bool = True) -> str:
        node = _quote("t:" + name)
        if node not in drawn:
            drawn.add(node)
            style = "" if stored else ", style=dashed, fontcolor=gray40"
            lines.append(f"  {node} [label={_quote(name if stored else name + ' (not stored)')}{style}];")
        return node

    def consumer_node(consumer: Consumer) -> str:
        node = _quote(f"n:{consumer.graph}/{consumer.node}")
        if node not in drawn:
            drawn.add(node)
            where = "" if consumer.graph == "main" else f"\n(in {consumer.graph})"
            label = _quote(f"{consumer.op_type} {consumer.node}{where}")
            lines.append(f"  {node} [shape=box, style=rounded, label={label}];")
        return node

    for group in audit.graph.groups:
        storage = _quote("s:" + group.storage_id)
        label = f"storage {group.storage_id}\\n{human_bytes(group.nbytes)}"
        lines.append(f'  {storage} [shape=box, style=filled, fillcolor=lightblue, label="{label}"];')
        aliases = set(group.aliases)
        lines.extend(
            f"  {name_node(name)} -> {storage} "
            f"[label={_quote('Identity alias' if name in aliases else group.relation)}];"
            for name in group.names
        )
    for tie in audit.graph.consumer_ties:
        initializer = _quote("t:" + tie.initializer)
        label = _quote(f"{tie.initializer}\n{human_bytes(tie.nbytes)}, read as embedding and head")
        drawn.add(initializer)
        lines.append(f"  {initializer} [shape=box, style=filled, fillcolor=palegreen, label={label}];")
        for consumer in tie.consumers:
            color = _ROLE_COLOR.get(consumer.role, "gray40")
            edge = _quote(f"{consumer.role} (input {consumer.slot})")
            lines.append(f"  {initializer} -> {consumer_node(consumer)} [color={color}, label={edge}];")
            for reached in consumer.reaches:
                edge = _quote(f"head (input {reached.slot})")
                source, target = consumer_node(consumer), consumer_node(reached)
                lines.append(f"  {source} -> {target} [color={_ROLE_COLOR['head']}, label={edge}];")
    stored = ckpt.names
    for state in audit.graph.ties:
        target = name_node(state.tie.dropped, state.tie.dropped in stored)
        source = name_node(state.tie.kept, state.tie.kept in stored)
        color = "darkgreen" if state.shared_storage else "orange"
        lines.append(
            f"  {target} -> {source} [style=dashed, color={color}, "
            f"label={_quote('tied by ' + state.tie.declared_by)}];"
        )
    for finding in audit.findings:
        first, *others = finding.names
        for other in others:
            label = f"{finding.rule} {finding.relation or finding.kind}"
            lines.append(f"  {name_node(other)} -> {name_node(first)} [color=red, label={_quote(label)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
