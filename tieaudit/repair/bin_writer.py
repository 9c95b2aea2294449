"""retie of the weights of a model folder that stores ``pytorch_model.bin`` files (the torch extra).

Each .bin is loaded with ``torch.load(weights_only=True)`` (memory-mapped; no pickle code runs),
each applied copy is replaced by the kept tensor itself or a ``.t()`` view of it
(``torch_writer.retied``), and the result is ``torch.save``d. The dropped name stays in the file
as a view of the kept storage, so ``torch.load`` and ``from_pretrained`` find every name, and the
kept bytes are stored once. A view cannot cross files: a copy whose kept tensor sits in another
shard moves into that shard, and the index's ``weight_map`` follows it. A cast copy cannot be a
view and is never applied here (``plan``'s representable relations).

``from_pretrained`` loads names that share storage in a .bin as one tensor in memory, whatever the
config says; that is why the folder's loader rule (``repair.loaders``) re-ties by default only the
pairs the model class ties.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from tieaudit.core.errors import UnsupportedFormatError
from tieaudit.core.records import Checkpoint
from tieaudit.formats.hf.variants import weights_folder
from tieaudit.formats.hf_dir import WeightSet, confined_path, load_json
from tieaudit.repair.plan import RetiePlan
from tieaudit.repair.torch_locations import StorageLocations
from tieaudit.repair.torch_sink import save
from tieaudit.repair.torch_writer import load_weights, refuse_placeholders, retied, torch_module


def _move(roots: dict[str, Any], name: str, source: str, *, target: str, path: str) -> None:
    """Move a top-level entry of one shard's state dict into another's."""
    origin, destination = roots[source], roots[target]
    if not (isinstance(origin, dict) and name in origin and isinstance(destination, dict)):
        raise UnsupportedFormatError(
            f"{name} must move from {source} to {target} to become a view of the kept tensor, but "
            "it is not an entry of a state dict there",
            path,
        )
    destination[name] = origin.pop(name)


def write_bin_weights(
    ckpt: Checkpoint, weights: WeightSet, plan: RetiePlan, *, out: str
) -> tuple[list[str], dict[str, str]]:
    """Write every .bin of the folder with the plan's copies as views; returns (files written,
    ``{name: file}`` for each name that moved to another shard)."""
    refuse_placeholders(ckpt, weights.files)
    torch = torch_module(ckpt.path)
    folder = weights_folder(ckpt.path)
    holder = {t.name: t.file for t in ckpt.tensors}
    locations = StorageLocations()  # each storage recorded where the input recorded it
    roots = {file: load_weights(confined_path(folder, file), locations) for file in weights.files}
    moved: dict[str, str] = {}
    for decision in plan.applied:
        source, target = holder[decision.dropped], holder[decision.kept]
        if source != target:
            _move(roots, decision.dropped, source, target=target, path=ckpt.path)
            moved[decision.dropped] = target
    written = []
    for file in weights.files:
        root = roots[file]
        if isinstance(root, dict) and not root:
            continue  # every entry moved to the shard of its kept tensor
        here = tuple(d for d in plan.applied if holder[d.kept] == file)
        root = retied(torch, root, dataclasses.replace(plan, decisions=here), path=os.path.join(folder, file))
        target = os.path.join(out, file)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        inputs = [confined_path(folder, f) for f in weights.files]
        save(torch, root, target, inputs=inputs, locations=locations)
        written.append(target)
    return written, moved


def bin_index(ckpt: Checkpoint, index: str, moved: Mapping[str, str], *, saved: int) -> dict[str, Any]:
    """The index with moved names mapped to their new shard and ``total_size`` less the bytes saved."""
    raw: dict[str, Any] = dict(load_json(weights_folder(ckpt.path), index))
    raw["weight_map"] = {name: moved.get(name, file) for name, file in raw["weight_map"].items()}
    metadata = raw.get("metadata")
    if isinstance(metadata, dict):
        total = metadata.get("total_size")
        if isinstance(total, int) and not isinstance(total, bool):
            raw["metadata"] = {**metadata, "total_size": total - saved}
    return raw
