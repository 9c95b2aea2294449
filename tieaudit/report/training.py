"""A training checkpoint's layout in the reports: which subtree is the model, which the optimizer
state, how its states were matched to parameters, and which training files were not read."""

from __future__ import annotations

from typing import Any

from tieaudit.core.escape import printable
from tieaudit.core.units import plural
from tieaudit.graph.alias import AliasGraph

MAX_LISTED_STATES = 10_000
"""Optimizer keys listed with their parameter in the JSON report (the counts cover them all)."""


def training_dict(graph: AliasGraph) -> dict[str, Any] | None:
    """The JSON report's ``training`` block (None for a checkpoint that is not a training one)."""
    ckpt = graph.checkpoint
    layout = ckpt.training
    if layout is None:
        return None
    maps = {m.optimizer.path: m for m in graph.optimizer_maps}
    optimizers = []
    for record in layout.optimizers:
        entry: dict[str, Any] = {
            "path": record.path,
            "file": record.file or None,
            "groups": len(record.groups),
            "parameters": len(record.keys),
            "states": sum(1 for s in record.slots if s.tensors),
        }
        found = maps.get(record.path)
        if found is not None:
            listed = list(found.owner.items())[:MAX_LISTED_STATES]
            entry["mapped_by"] = found.method
            entry["param_of_key"] = {str(k): found.params[i].names[0] for k, i in listed}
            entry["unmapped"] = found.problem or None
        optimizers.append(entry)
    return {
        "kind": layout.kind,
        "model": layout.model_prefix,
        "model_tensors": len(layout.model_names),
        "parts": [{"path": p.path, "role": p.role, "status": p.status} for p in layout.parts],
        "optimizers": optimizers,
        "notes": list(layout.notes),
    }


def training_lines(graph: AliasGraph, *, brief: bool = False) -> list[str]:
    """Lines for the text reports (escaped): the layout and each optimizer's match (not when brief:
    ``check`` prints only what was not read or recognised), then each file not read."""
    layout = graph.checkpoint.training
    if layout is None:
        return []
    lines = []
    if not brief:
        weights = next((p.path for p in layout.parts if p.role == "model"), "the weights")
        model = "not recognised" if layout.model_prefix is None else (layout.model_prefix or weights)
        lines.append(f"training checkpoint ({layout.kind}): model = {model}")
        maps = {m.optimizer.path: m for m in graph.optimizer_maps}
        for record in layout.optimizers:
            groups = plural(len(record.groups), "group")
            line = (
                f"optimizer = {record.path or '(root)'}: {plural(len(record.keys), 'parameter')} in {groups}"
            )
            found = maps.get(record.path)
            if found is not None and found.owner:
                line += f", {len(found.owner)} matched to model parameters by {found.method}"
            elif found is not None:
                line += ", not matched to model parameters"
            lines.append(line + (f" ({found.problem})" if found is not None and found.problem else ""))
    lines += [f"{p.path} ({p.role}): {p.status}" for p in layout.parts if p.status.startswith("not read")]
    lines += list(layout.notes)
    return [printable(line) for line in lines]
