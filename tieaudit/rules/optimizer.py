"""TIE007 optimizer-state-split: optimizer state that does not match the model's ties.

One parameter, one state. A tied pair (one storage, or one name dropped as the loader restores it)
is one parameter: two states for it make ``optimizer.load_state_dict`` on the tied model fail (a
group's size differs) — an error, as are more states than parameters and a state whose shape is
not its parameter's (load succeeds, the first step fails). A copy (TIE001) or a declared tie stored
apart (TIE002) with a state for each copy loads, but trains the two apart: a warning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from tieaudit.core.records import Checkpoint
from tieaudit.core.shell import advice, tieaudit_command
from tieaudit.core.training import OptimizerRecord, ParamKey
from tieaudit.graph.optimizer_map import OptimizerMap, Shape
from tieaudit.rules.copies import group_relation
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE007

TieKind = Literal["tied", "copy", "diverged"]


@dataclass(frozen=True, kw_only=True)
class TieSet:
    """Names of the model part that are, or are declared to be, one parameter."""

    params: frozenset[int]
    """Indexes into ``OptimizerMap.params`` (one for a tie stored once)."""
    names: tuple[str, ...]
    """The stored names."""
    kind: TieKind
    """tied (one storage), copy (equal, transposed or cast values stored apart) or diverged
    (declared one, values differ)."""
    why: str
    """What makes them one, for the message."""


def tie_sets(audited: Audited, omap: OptimizerMap) -> list[TieSet]:
    """The model part's ties, copies and declared ties stored apart, as parameter indexes."""
    index = {name: i for i, p in enumerate(omap.params) for name in p.names}
    sets = [
        TieSet(params=frozenset({i}), names=p.names, kind="tied", why="share one storage")
        for i, p in enumerate(omap.params)
        if len(p.names) > 1
    ]
    copied: set[frozenset[int]] = set()
    for group in audited.copies:
        names = tuple(n for n in group.names if n in index)
        found = frozenset(index[n] for n in names)
        if len(found) > 1:
            copied.add(found)
            relation = group_relation(group)
            sets.append(TieSet(params=found, names=names, kind="copy", why=f"are {relation} copies"))
    for state in audited.graph.ties:
        pair = (state.tie.dropped, state.tie.kept)
        found = frozenset(index[n] for n in pair if n in index)
        if len(found) == 2 and found not in copied:
            copied.add(found)
            why = f"are declared one by {state.tie.where} but stored apart with different values"
            sets.append(TieSet(params=found, names=pair, kind="diverged", why=why))
    return sets


def keys_of(tie: TieSet, omap: OptimizerMap) -> tuple[ParamKey, ...] | None:
    """The optimizer keys that belong to the tie's parameters; None when the mapping cannot tell."""
    keys = omap.optimizer.keys
    if omap.method in ("names", "order") and not omap.problem:
        return tuple(k for k in keys if omap.owner.get(k) in tie.params)
    shapes = {omap.params[i].shape for i in tie.params}
    holders = {i for i, p in enumerate(omap.params) if p.shape in shapes}
    if holders != tie.params:  # other parameters share the shape: the states cannot be told apart
        return None
    return tuple(k for k in keys if omap.shape_of(k) in shapes)


def _shown(keys: tuple[ParamKey, ...]) -> str:
    return ", ".join(str(k) for k in keys[:6]) + (", ..." if len(keys) > 6 else "")


def _state_names(record: OptimizerRecord, keys: tuple[ParamKey, ...]) -> list[str]:
    wanted = set(keys)
    return [name for slot in record.slots if slot.key in wanted for name in slot.tensors.values()]


def _state_bytes(ckpt: Checkpoint, record: OptimizerRecord, keys: tuple[ParamKey, ...]) -> int:
    return sum(ckpt.tensor(name).nbytes for name in _state_names(record, keys))


def _split(audited: Audited, omap: OptimizerMap, tie: TieSet, *, keys: tuple[ParamKey, ...]) -> Finding:
    ckpt, record = audited.graph.checkpoint, omap.optimizer
    where = record.path or "the optimizer"
    names = [*tie.names, *_state_names(record, keys)]
    with_state = {s.key for s in record.slots if s.tensors} & set(keys)
    entries = f"{where} has {len(keys)} entries for them (parameter keys {_shown(keys)}; "
    entries += f"{len(with_state)} of them hold state)"
    details = {"optimizer": record.path, "states": list(keys), "mapped_by": omap.method}
    extra = _state_bytes(ckpt, record, keys[1:])
    joined = " and ".join(tie.names) if len(tie.names) == 2 else ", ".join(tie.names)
    if tie.kind == "tied":
        return SPLIT.finding(
            names,
            f"{joined} are one parameter (they {tie.why}), but {entries}: load_state_dict into the tied "
            "model fails (a group has fewer parameters than the state lists).",
            wasted_bytes=extra,
            fix="keep one state for the tied parameter and renumber param_groups (retie of the untied "
            "checkpoint does both)",
            details=details,
        )
    fix = None
    if tie.kind == "copy" and ckpt.format == "torch":
        retie = tieaudit_command("retie", ckpt.path, "OUT")
        fix = advice(retie, " (keeps one optimizer state; --keep NAME chooses whose)")
    return SPLIT.finding(
        names,
        f"{joined} {tie.why}, and {entries}: resumed training updates them apart.",
        severity="warning",
        wasted_bytes=extra if tie.kind == "copy" else 0,
        fix=fix,
        details=details,
    )


def _shape_findings(omap: OptimizerMap, explained: set[Shape]) -> Iterator[Finding]:
    """States whose shape no parameter has (by the mapping, else by counting shapes)."""
    record, where = omap.optimizer, omap.optimizer.path or "the optimizer"
    if omap.method in ("names", "order"):
        wrong = [
            (k, i)
            for k, i in omap.owner.items()
            if (s := omap.shape_of(k)) is not None and s != omap.params[i].shape and s not in explained
        ]
        if wrong:
            k, i = wrong[0]
            yield SPLIT.finding(
                [omap.params[i].names[0] for _, i in wrong]
                + _state_names(record, tuple(k for k, _ in wrong)),
                f"{len(wrong)} states of {where} do not have their parameter's shape (key {k}: "
                f"{list(omap.shape_of(k) or ())}, {omap.params[i].names[0]}: {list(omap.params[i].shape)}): "
                "the first optimizer step fails.",
                details={"optimizer": record.path, "states": [k for k, _ in wrong], "mapped_by": omap.method},
            )
        return
    have = Counter(p.shape for p in omap.params)
    held = Counter(s.shape for s in record.slots if s.shape is not None)
    for shape, count in held.items():
        if count > have[shape] and shape not in explained:
            keys = tuple(s.key for s in record.slots if s.shape == shape)
            yield SPLIT.finding(
                _state_names(record, keys),
                f"{where} holds {count} states of shape {list(shape)}, the model part has "
                f"{have[shape]} parameters of that shape: states that match no parameter.",
                details={"optimizer": record.path, "states": list(keys), "mapped_by": omap.method},
            )


def _one_optimizer(audited: Audited, omap: OptimizerMap) -> Iterator[Finding]:
    record = omap.optimizer
    explained: set[Shape] = set()
    tied_error = False
    for tie in tie_sets(audited, omap):
        keys = keys_of(tie, omap)
        if keys is not None and (len(keys) > 1 if tie.kind == "tied" else len(keys) >= len(tie.params)):
            tied_error |= tie.kind == "tied"
            explained |= {omap.params[i].shape for i in tie.params}
            yield _split(audited, omap, tie, keys=keys)
    if len(record.keys) > len(omap.params) and not tied_error:
        where = record.path or "the optimizer"
        yield SPLIT.finding(
            _state_names(record, record.keys[len(omap.params) :])[:20],
            f"{where} lists {len(record.keys)} parameters, the model part has at most {len(omap.params)}: "
            "load_state_dict fails.",
            details={"optimizer": record.path, "parameters": len(record.keys), "model": len(omap.params)},
        )
    yield from _shape_findings(omap, explained)


def optimizer_findings(audited: Audited) -> Iterator[Finding]:
    """TIE007 for every optimizer state dict of a training checkpoint with a recognised model part."""
    for omap in audited.graph.optimizer_maps:
        yield from _one_optimizer(audited, omap)


SPLIT = Rule(text=TIE007, check=optimizer_findings)
