"""The alias graph: which names share one storage, and how their views relate.

Built from reader metadata only; no tensor bytes are read here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from tieaudit.core.records import Checkpoint, DeclaredTie, TensorInfo
from tieaudit.graph.consumer_ties import ConsumerTie, consumer_ties
from tieaudit.graph.optimizer_map import OptimizerMap, optimizer_maps

Relation = Literal["identical", "transposed", "overlapping", "disjoint"]

# When a group mixes relations, it is labelled by the one that matters most.
_PRIORITY: dict[Relation, int] = {"overlapping": 3, "transposed": 2, "identical": 1, "disjoint": 0}


@dataclass(frozen=True)
class PairRelation:
    """How two views of one storage relate."""

    first: str
    """One name."""
    second: str
    """The other name."""
    relation: Relation
    """identical, transposed (2-D, reversed shape and strides), overlapping or disjoint."""


@dataclass(frozen=True, kw_only=True)
class AliasGroup:
    """Two or more names viewing one storage."""

    storage_id: str
    """The shared storage."""
    names: tuple[str, ...]
    """Names in stored order."""
    relation: Relation
    """The most significant relation among the pairs."""
    nbytes: int
    """Bytes of the shared storage (stored once)."""
    pairs: tuple[PairRelation, ...]
    """Pairs of names whose views touch: each further name of a view as identical to the view's
    first name, then every pair of distinct views that share bytes (transposed or overlapping).
    Names not paired here view disjoint bytes. At most MAX_LISTED_PAIRS are listed."""
    pairs_truncated: bool = False
    """True when more pairs of touching views exist than MAX_LISTED_PAIRS (the relation still counts them)."""
    aliases: tuple[str, ...] = ()
    """Names among ``names`` that are ONNX Identity outputs: another name for a tensor viewing this
    storage (paired with it as identical), not stored themselves."""


@dataclass(frozen=True, kw_only=True)
class TieState:
    """A declared tie as the stored tensors realise it."""

    tie: DeclaredTie
    """The declaration."""
    dropped_stored: bool
    """The dropped name has its own entry in the files."""
    kept_stored: bool
    """The kept name has its own entry in the files."""
    shared_storage: bool
    """Both are stored and view the same storage (a real tie on disk)."""


@dataclass(frozen=True)
class AliasGraph:
    """Storages, alias groups and declared ties of one checkpoint."""

    checkpoint: Checkpoint
    """What the reader found."""
    groups: tuple[AliasGroup, ...]
    """Storages viewed by two or more names."""
    ties: tuple[TieState, ...]
    """Declared ties and how the files realise them."""

    @cached_property
    def consumer_ties(self) -> tuple[ConsumerTie, ...]:
        """ONNX: tensors read both as embedding and as head (a tie kept by one shared initializer)."""
        return consumer_ties(self.checkpoint)

    @cached_property
    def optimizer_maps(self) -> tuple[OptimizerMap, ...]:
        """A training checkpoint's optimizer states matched to model parameters, once per audit
        (the TIE007 rule and the reports read the same match; an order fit can take seconds)."""
        return optimizer_maps(self.checkpoint)

    @property
    def stored_bytes(self) -> int:
        """Bytes of every storage, each counted once."""
        return sum(s.nbytes for s in self.checkpoint.storages.values())

    def group_of(self, name: str) -> AliasGroup | None:
        """The alias group holding name, if any."""
        for group in self.groups:
            if name in group.names:
                return group
        return None


def relate(first: TensorInfo, second: TensorInfo) -> Relation:
    """How two views of the same storage relate."""
    same_start = first.byte_offset == second.byte_offset and first.dtype == second.dtype
    if same_start and first.shape == second.shape and first.strides == second.strides:
        return "identical"
    if (
        same_start
        and len(first.shape) == 2
        and first.shape == second.shape[::-1]
        and first.strides == second.strides[::-1]
    ):
        return "transposed"
    start_a, end_a = first.byte_span()
    start_b, end_b = second.byte_span()
    both_view_bytes = start_a < end_a and start_b < end_b  # an empty view touches nothing
    return "overlapping" if both_view_bytes and start_a < end_b and start_b < end_a else "disjoint"


MAX_LISTED_PAIRS = 10_000
"""Touching pairs listed per storage: a 64 KB pickle can point thousands of names at one storage,
and listing every pair of them would be quadratic in the report (the relation is still exact)."""


def _view_key(tensor: TensorInfo) -> tuple[object, ...]:
    return (tensor.byte_offset, tensor.dtype, tensor.shape, tensor.strides)


def _touching(views: list[TensorInfo]) -> list[tuple[TensorInfo, TensorInfo]]:
    """Pairs of distinct views whose byte spans intersect, found by a sweep over their starts:
    cost follows the pairs found (disjoint slices of a fused matrix cost n log n), up to the cap."""
    found: list[tuple[TensorInfo, TensorInfo]] = []
    active: list[tuple[int, TensorInfo]] = []  # (end, view) of views whose span may still intersect
    for view in sorted(views, key=lambda v: v.byte_span()):
        start, end = view.byte_span()
        active = [(e, v) for e, v in active if e > start]
        found.extend((other, view) for _, other in active if start < end)
        if len(found) > MAX_LISTED_PAIRS:
            break
        if end > start:
            active.append((end, view))
    return found


def _group(
    storage_id: str, tensors: list[TensorInfo], nbytes: int, *, aliases: list[tuple[str, str]]
) -> AliasGroup:
    by_view: dict[tuple[object, ...], list[TensorInfo]] = defaultdict(list)
    for tensor in tensors:
        by_view[_view_key(tensor)].append(tensor)
    pairs = [
        PairRelation(same[0].name, other.name, "identical") for same in by_view.values() for other in same[1:]
    ]
    pairs += [PairRelation(target, alias, "identical") for alias, target in aliases]
    touching = _touching([same[0] for same in by_view.values()])
    pairs += [PairRelation(a.name, b.name, relate(a, b)) for a, b in touching]
    disjoint: Relation = "disjoint"
    relation = max((p.relation for p in pairs), key=_PRIORITY.__getitem__, default=disjoint)
    listed = tuple(pairs[:MAX_LISTED_PAIRS])
    names = tuple(t.name for t in tensors) + tuple(alias for alias, _ in aliases)
    return AliasGroup(
        storage_id=storage_id,
        names=names,
        relation=relation,
        nbytes=nbytes,
        pairs=listed,
        pairs_truncated=len(pairs) > MAX_LISTED_PAIRS,
        aliases=tuple(alias for alias, _ in aliases),
    )


def _identity_aliases(checkpoint: Checkpoint) -> dict[str, list[tuple[str, str]]]:
    """Storage id -> (alias, tensor) for ONNX Identity outputs naming a stored tensor (an output
    spelled like a stored name is that tensor, as loaders see it, and no second name)."""
    by_storage: dict[str, list[tuple[str, str]]] = defaultdict(list)
    stored = checkpoint.names
    for alias, target in checkpoint.aliases.items():
        if target in stored and alias not in stored:
            by_storage[checkpoint.tensor(target).storage_id].append((alias, target))
    return by_storage


def tie_states(checkpoint: Checkpoint, ties: tuple[DeclaredTie, ...]) -> tuple[TieState, ...]:
    """Where each declared tie stands in the stored tensors."""
    storage_of = {t.name: t.storage_id for t in checkpoint.tensors}
    states = []
    for tie in ties:
        target, source = storage_of.get(tie.dropped), storage_of.get(tie.kept)
        shared = target is not None and target == source
        states.append(
            TieState(
                tie=tie,
                dropped_stored=target is not None,
                kept_stored=source is not None,
                shared_storage=shared,
            )
        )
    return tuple(states)


def build_graph(checkpoint: Checkpoint, extra_ties: tuple[DeclaredTie, ...] = ()) -> AliasGraph:
    """Group names by storage (ONNX Identity outputs with the tensor they name) and place the
    declared ties (from the files, plus extra_ties)."""
    by_storage: dict[str, list[TensorInfo]] = defaultdict(list)
    for tensor in checkpoint.tensors:
        by_storage[tensor.storage_id].append(tensor)
    aliases = _identity_aliases(checkpoint)
    groups = tuple(
        _group(storage_id, views, checkpoint.storages[storage_id].nbytes, aliases=aliases.get(storage_id, []))
        for storage_id, views in by_storage.items()
        if len(views) + len(aliases.get(storage_id, ())) > 1
    )
    return AliasGraph(checkpoint, groups, tie_states(checkpoint, checkpoint.declared_ties + extra_ties))
