"""retie of a training checkpoint: the optimizer state follows the re-tied copies.

In the tied model a copy group is one parameter, at the place of its member that comes first in
``parameters()`` order; it keeps one optimizer state, the kept name's (``--keep`` chooses), the
others are discarded and every later position moves down (``param_groups``' ``params`` and
``param_names``, the ``state`` keys). Where the states of the copies differ (Adam moments of two
parameters trained apart), retie refuses and names both choices. Only equal copies are followed:
a transposed copy stays a parameter of its own in any module that holds it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import UsageError
from tieaudit.core.escape import printable
from tieaudit.core.training import OptimizerRecord, OptimizerSlot, ParamKey, TrainingLayout
from tieaudit.formats.training import find_optimizers, state_tensor_name
from tieaudit.graph.compare import BlockComparer, equal_bytes
from tieaudit.graph.optimizer_map import OptimizerMap, map_optimizer


@dataclass(frozen=True, kw_only=True)
class OptimizerEdit:
    """What retie does to one optimizer for one re-tied copy group."""

    path: str
    """The optimizer state dict's dotted path."""
    kept_slot: ParamKey
    """The key that stays: the group's first member in parameters() order."""
    source: ParamKey
    """The key whose state the kept slot holds afterwards: the kept name's."""
    dropped: tuple[ParamKey, ...]
    """Keys removed from param_groups and state."""
    kept_name: str
    """The model name whose state is kept."""


def _slot(record: OptimizerRecord, key: ParamKey) -> OptimizerSlot | None:
    return next((s for s in record.slots if s.key == key), None)


def same_state(opened: OpenCheckpoint, first: OptimizerSlot | None, second: OptimizerSlot | None) -> bool:
    """Whether two parameters' states are bit for bit equal (no state at all counts as equal)."""
    if first is None or second is None:
        return first is second
    if set(first.tensors) != set(second.tensors):
        return False
    ckpt, comparer = opened.checkpoint, BlockComparer()
    return all(
        equal_bytes(opened, ckpt.tensor(name), ckpt.tensor(second.tensors[entry]), comparer=comparer)
        for entry, name in first.tensors.items()
    )


def _groups(applied: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """kept name -> its equal copies re-tied to it."""
    groups: dict[str, list[str]] = {}
    for kept, dropped in applied:
        groups.setdefault(kept, []).append(dropped)
    return groups


def _member_keys(omap: OptimizerMap, members: list[str]) -> tuple[dict[str, list[ParamKey]], bool, bool]:
    """Each member's optimizer keys, whether the mapping is certain, and whether the optimizer may
    hold state for a member at all (uncertain: some state has a member's shape or none)."""
    index = {name: i for i, p in enumerate(omap.params) for name in p.names}
    by_param: dict[int, list[ParamKey]] = {}
    for key, param in omap.owner.items():
        by_param.setdefault(param, []).append(key)
    keys = {n: by_param.get(index[n], []) for n in members}
    certain = omap.method in ("names", "order") and not omap.problem
    shapes = {omap.params[index[n]].shape for n in members}
    uncertain_hold = any(s.shape is None or s.shape in shapes for s in omap.optimizer.slots)
    return keys, certain, any(keys.values()) or (not certain and uncertain_hold)


def _edit(
    opened: OpenCheckpoint, omap: OptimizerMap, kept: str, *, copies: list[str], chosen: bool
) -> OptimizerEdit | None:
    """The edit for one copy group (chosen: --keep named kept, so differing states are no question)."""
    record, where = omap.optimizer, printable(omap.optimizer.path or "the optimizer")
    index = {name: i for i, p in enumerate(omap.params) for name in p.names}
    members = [n for n in [kept, *copies] if n in index]
    keys, certain, holds = _member_keys(omap, members)
    if not holds:
        return None  # no member is in this optimizer (frozen, or another optimizer's)
    if opened.checkpoint.format != "torch":
        holder = printable(record.file) if record.file else where
        raise UsageError(
            f"retie would re-tie {printable(copies[0])} to {printable(kept)}, which may have state in "
            f"{holder}; retie of a Trainer checkpoint folder does not rewrite the optimizer state yet, so "
            "nothing was written (retie the weights in a folder without it)"
        )
    if not certain or any(len(k) != 1 for k in keys.values()):
        raise UsageError(
            f"retie drops {printable(copies[0])}, a copy of {printable(kept)}, but the states of {where} "
            f"cannot be matched to its parameters ({omap.problem or 'not one state per copy'}); "
            "nothing was written"
        )
    first = min(members, key=lambda n: index[n])
    source = keys[kept][0]
    for other in [] if chosen else copies:
        if not same_state(opened, _slot(record, source), _slot(record, keys[other][0])):
            raise UsageError(
                f"{printable(kept)} and {printable(other)} have different state in {where} (keys "
                f"{printable(str(source))} and {printable(str(keys[other][0]))}); retie keeps one: --keep "
                f"{printable(kept)} discards {printable(other)}'s, --keep {printable(other)} discards "
                f"{printable(kept)}'s"
            )
    dropped = tuple(keys[n][0] for n in members if n != first)
    return OptimizerEdit(
        path=record.path, kept_slot=keys[first][0], source=source, dropped=dropped, kept_name=kept
    )


def optimizer_edits(
    opened: OpenCheckpoint, applied: Sequence[tuple[str, str]], *, keep: str | None = None
) -> tuple[OptimizerEdit, ...]:
    """The optimizer edits for the applied equal (kept, dropped) pairs; UsageError where the states
    cannot be matched, or the copies' states differ and --keep (keep) does not say whose to keep,
    or the optimizer is a folder's file, which retie does not rewrite (nothing is written then)."""
    ckpt = opened.checkpoint
    layout = ckpt.training
    if layout is None or not layout.optimizers or not applied:
        return ()
    model = set(layout.model_names)
    pairs = [(k, d) for k, d in applied if k in model and d in model]
    edits: list[OptimizerEdit] = []
    for record in layout.optimizers:
        omap = map_optimizer(ckpt, layout, record)
        for kept, copies in _groups(pairs).items():
            edit = _edit(opened, omap, kept, copies=copies, chosen=kept == keep)
            if edit is not None:
                edits.append(edit)
    return tuple(edits)


def renamed_states(layout: TrainingLayout, edits: Sequence[OptimizerEdit]) -> dict[str, str | None]:
    """Original state tensor name -> its name after the edits (None: discarded), for verification."""
    renamed: dict[str, str | None] = {}
    for record in layout.optimizers:
        mine = [e for e in edits if e.path == record.path]
        if mine:
            renamed.update(_renamed_one(record, mine))
    return renamed


def new_key(key: ParamKey, dropped: Sequence[ParamKey]) -> ParamKey:
    """A key after the dropped ones are removed: positions move down, names stay."""
    if isinstance(key, str):
        return key
    ints = sorted(k for k in dropped if isinstance(k, int))
    return key - bisect.bisect_left(ints, key)


def _renamed_one(record: OptimizerRecord, edits: Sequence[OptimizerEdit]) -> Iterator[tuple[str, str | None]]:
    dropped = [k for e in edits for k in e.dropped]
    moved = {e.source: e.kept_slot for e in edits}
    lost = {e.kept_slot for e in edits if e.source != e.kept_slot} | (set(dropped) - set(moved))
    for slot in record.slots:
        for entry, name in slot.tensors.items():
            if slot.key in moved:
                target: ParamKey | None = moved[slot.key]
            else:
                target = None if slot.key in lost else slot.key
            new = None if target is None else state_tensor_name(record.path, new_key(target, dropped), entry)
            yield name, new


def apply_edits(root: object, edits: Sequence[OptimizerEdit]) -> None:
    """Carry the edits out on the loaded checkpoint (``torch.load``'s plain dicts and lists)."""
    live = dict(find_optimizers(root))
    for path in dict.fromkeys(e.path for e in edits):
        optimizer = live[path]
        mine = [e for e in edits if e.path == path]
        dropped = [k for e in mine for k in e.dropped]
        state = optimizer["state"]
        assert isinstance(state, dict)
        for edit in mine:
            if edit.source != edit.kept_slot and edit.source in state:
                state[edit.kept_slot] = state[edit.source]
        for group in optimizer["param_groups"]:  # type: ignore[attr-defined]
            places = [i for i, key in enumerate(group["params"]) if key in dropped]
            for field in ("params", "param_names"):
                if isinstance(group.get(field), list):
                    group[field] = [v for i, v in enumerate(group[field]) if i not in places]
            group["params"] = [new_key(k, dropped) for k in group["params"]]
        kept = {new_key(k, dropped): v for k, v in state.items() if k not in dropped}
        state.clear()
        state.update(kept)
