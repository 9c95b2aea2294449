"""Writes a .pt checkpoint whose copies are views of the kept tensor again (the torch extra).

The input is loaded with ``torch.load(weights_only=True)``, so no pickle code runs; a zip archive
is memory-mapped, a legacy (pre-1.6) file cannot be and is read into memory. Each dropped entry is
replaced in its container by the kept tensor itself (equal) or by ``kept.t()`` (transposed), so
``torch.save`` writes the kept storage once and ``torch.load`` gives one storage back. A training
checkpoint's optimizer state follows the re-tied equal copies (``repair.optimizer_plan``);
everything else (epoch, nested containers, non-tensor leaves, dtypes, strides, storage offsets) is
saved as loaded, and each storage is recorded at the location the input recorded for it (``cuda:0``
stays ``cuda:0``, though it was loaded onto the CPU: ``repair.torch_locations``). The output is
always torch.save's zip format, also when the input was a legacy file.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError, MissingExtra, UnsupportedFormatError, one_line
from tieaudit.core.escape import printable, quoted
from tieaudit.core.extras import require
from tieaudit.core.records import Checkpoint
from tieaudit.formats.torch_file import ROOT_NAME, ZIP_MAGIC
from tieaudit.formats.torch_file import key_name as key_name  # the reader's naming, shared on purpose
from tieaudit.repair.interface import Writer
from tieaudit.repair.optimizer_plan import apply_edits
from tieaudit.repair.plan import Decision, RetiePlan
from tieaudit.repair.torch_locations import StorageLocations
from tieaudit.repair.torch_sink import save

VisitLeaf = Callable[[str, Any], Any]
"""Called with each leaf's dotted name and value; returns the value to put in its place."""


def torch_module(path: str) -> Any:
    """The torch module; MissingExtra (exit 2, nothing written) when the extra is missing."""
    try:
        require("writing PyTorch files", ("torch",))
    except MissingExtra as exc:
        raise MissingExtra(exc.message, path) from None
    import torch

    return torch


def load_weights(path: str, locations: StorageLocations | None = None) -> Any:
    """torch.load with weights_only, memory-mapped when the file is a zip archive, every storage on
    the CPU; locations, when given, notes the location the file records for each storage (for
    ``torch_sink.save`` to record it again)."""
    torch = torch_module(path)

    with open(path, "rb") as handle:
        zipped = handle.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    where: Any = "cpu" if locations is None else locations.restore
    try:
        return torch.load(path, weights_only=True, mmap=zipped, map_location=where)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as exc:
        raise InputError(
            f"torch.load(weights_only=True) cannot load it ({one_line(exc, 200)})", path
        ) from None


def refuse_placeholders(ckpt: Checkpoint, files: Iterable[str]) -> None:
    """Refuse to rewrite a file whose pickle names globals tieaudit read only as inert placeholders:
    writing goes through torch.load(weights_only=True), which refuses them, and tieaudit never
    imports them to load the file another way."""
    wanted = set(files)
    inert = list(
        dict.fromkeys(g.name for g in ckpt.pickle_globals if g.verdict != "allowed" and g.file in wanted)
    )
    if inert:
        shown = printable(", ".join(inert[:5]) + (f" and {len(inert) - 5} more" if len(inert) > 5 else ""))
        raise UnsupportedFormatError(
            f"cannot rewrite it: its pickle names {shown}, which tieaudit reads only as inert "
            "placeholders (torch.load(weights_only=True) refuses them and tieaudit never imports them); "
            "save the tensors without these objects, then retie that file",
            ckpt.path,
        )


def _is_container(torch: Any, value: object) -> bool:
    # The reader keeps torch.Size as one opaque leaf, so it is not walked here either.
    return isinstance(value, (dict, list, tuple)) and not isinstance(value, torch.Size)


def walk_leaves(torch: Any, root: Any, visit: VisitLeaf) -> Any:
    """Visit every leaf under the reader's dotted name, in pickle order; returns the new root.

    Dicts and lists are updated in place; a tuple holding a replaced leaf is rebuilt (the reader
    admits no tuple type but plain tuples and torch.Size, which is a leaf).
    """

    def walk(name: str, value: Any) -> Any:
        if not _is_container(torch, value):
            new = visit(name or ROOT_NAME, value)
            attached(name, new)
            return new
        if isinstance(value, dict):
            for key, item in list(value.items()):
                new = walk(f"{name}.{key_name(key)}" if name else key_name(key), item)
                if new is not item:
                    value[key] = new
            attached(name, value)
            return value
        items = [walk(f"{name}.{index}" if name else str(index), item) for index, item in enumerate(value)]
        changed = [index for index, (new, old) in enumerate(zip(items, value, strict=True)) if new is not old]
        if isinstance(value, list):
            for index in changed:
                value[index] = items[index]
            return value
        return tuple(items) if changed else value

    def attached(name: str, owner: Any) -> None:
        # Attributes loading set (a tensor's, an OrderedDict's), walked as the reader walks them:
        # under the owner's name, and only where they hold a tensor.
        attributes = _attributes(torch, owner)
        if attributes and _holds_tensor(torch, attributes):
            for key, item in list(attributes.items()):
                new = walk(f"{name}.{key_name(key)}" if name else key_name(key), item)
                if new is not item:
                    attributes[key] = new

    return walk("", root)


def _attributes(torch: Any, value: Any) -> dict[Any, Any] | None:
    """The attributes torch.load set on value (its ``__dict__``): a tensor's, a dict subclass's."""
    if isinstance(value, torch.Tensor) or (isinstance(value, dict) and type(value) is not dict):
        return getattr(value, "__dict__", None)
    return None


def _holds_tensor(torch: Any, value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    items = value.values() if isinstance(value, dict) else value if _is_container(torch, value) else ()
    attributes = _attributes(torch, value)
    return any(_holds_tensor(torch, item) for item in items) or bool(
        attributes and _holds_tensor(torch, attributes)
    )


def named_tensors(torch: Any, root: Any, path: str) -> dict[str, Any]:
    """Tensors by dotted name; two leaves of one name are an InputError, as in the reader (which
    refuses the file before any writing: never one of them kept silently)."""
    seen: set[str] = set()
    tensors: dict[str, Any] = {}

    def record(name: str, value: Any) -> Any:
        if name in seen:
            raise InputError(f"torch.load gives two entries named {quoted(name)}", path)
        seen.add(name)
        if isinstance(value, torch.Tensor):
            tensors[name] = value
        return value

    walk_leaves(torch, root, record)
    return tensors


def stand_in(torch: Any, kept: Any, dropped: Any, *, transposed: bool) -> Any:
    """What takes the dropped entry's place: kept itself, or its transpose as a view of its storage.

    The entry's type, requires_grad and attributes stay as they were: a Parameter stays a Parameter
    (sharing kept's storage), a plain tensor of a state dict stays a plain tensor.
    """
    view = kept.detach().t() if transposed else kept
    if type(view) is type(dropped) and view.requires_grad == dropped.requires_grad and not dropped.__dict__:
        return view
    if isinstance(dropped, torch.nn.Parameter):
        made = torch.nn.Parameter(view.detach(), requires_grad=dropped.requires_grad)
    else:
        made = view.detach().requires_grad_(dropped.requires_grad)
    made.__dict__.update(dropped.__dict__)  # the dropped entry's attributes stay with its name
    return made


def _check(decision: Decision, tensors: dict[str, Any], path: str) -> None:
    assert decision.relation != "cast", "a cast copy cannot be a view in .pt (REPRESENTABLE excludes it)"
    assert decision.transposed == (decision.relation == "transposed"), decision
    for name in (decision.kept, decision.dropped):
        if name not in tensors:
            raise InputError(f"torch.load gives no tensor named {name!r}, which the reader found", path)
    kept, dropped = tensors[decision.kept], tensors[decision.dropped]
    shape = tuple(reversed(kept.shape)) if decision.transposed else tuple(kept.shape)
    if (shape, kept.dtype) != (tuple(dropped.shape), dropped.dtype):
        raise InputError(f"{decision.dropped} and {decision.kept} differ in shape or dtype in torch", path)


def retied(torch: Any, root: Any, plan: RetiePlan, *, path: str) -> Any:
    """root with every applied decision's dropped entry replaced by its stand-in."""
    tensors = named_tensors(torch, root, path)
    replacements: dict[str, Any] = {}
    for decision in plan.applied:
        _check(decision, tensors, path)
        kept, dropped = tensors[decision.kept], tensors[decision.dropped]
        replacements[decision.dropped] = stand_in(torch, kept, dropped, transposed=decision.transposed)

    def replace(name: str, value: Any) -> Any:
        return replacements.get(name, value)

    return walk_leaves(torch, root, replace)


class TorchWriter(Writer):
    """torch.save output: dropped names reference the kept tensor's storage."""

    format = "torch"

    def write(self, opened: OpenCheckpoint, plan: RetiePlan, out: str) -> list[str]:
        """Load the file with weights_only, re-tie the plan's copies, torch.save to out (zip format)."""
        ckpt = opened.checkpoint
        refuse_placeholders(ckpt, ckpt.files)
        torch = torch_module(ckpt.path)

        locations = StorageLocations()  # each storage recorded where the input recorded it
        root = retied(torch, load_weights(ckpt.path, locations), plan, path=ckpt.path)
        apply_edits(root, plan.optimizer_edits)
        save(torch, root, out, inputs=[ckpt.path], locations=locations)  # input pages released as written
        return [out]
