"""The alias graph for Graphviz: names point at their storage; declared ties and copies as edges."""

from __future__ import annotations

import json

from tieaudit.audit import Audit
from tieaudit.core.units import human_bytes


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

    for group in audit.graph.groups:
        storage = _quote("s:" + group.storage_id)
        label = f"storage {group.storage_id}\\n{human_bytes(group.nbytes)}"
        lines.append(f'  {storage} [shape=box, style=filled, fillcolor=lightblue, label="{label}"];')
        lines.extend(
            f"  {name_node(name)} -> {storage} [label={_quote(group.relation)}];" for name in group.names
        )
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
