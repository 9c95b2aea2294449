"""The alias graph: which names share one storage, and how their views relate.

Built from reader metadata only; no tensor bytes are read here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

from tieaudit.model import Checkpoint, DeclaredTie, TensorInfo

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


@dataclass(frozen=True)
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
    """The relation of every pair of names."""


@dataclass(frozen=True)
class TieState:
    """A declared tie as the stored tensors realise it."""

    tie: DeclaredTie
    """The declaration."""
    target_stored: bool
    """The target name has its own entry in the files."""
    source_stored: bool
    """The source name has its own entry in the files."""
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
    return "overlapping" if start_a < end_b and start_b < end_a else "disjoint"


def _group(storage_id: str, views: list[TensorInfo], nbytes: int) -> AliasGroup:
    pairs = tuple(PairRelation(a.name, b.name, relate(a, b)) for a, b in combinations(views, 2))
    relation = max((p.relation for p in pairs), key=_PRIORITY.__getitem__)
    return AliasGroup(storage_id, tuple(v.name for v in views), relation, nbytes, pairs)


def tie_states(checkpoint: Checkpoint, ties: tuple[DeclaredTie, ...]) -> tuple[TieState, ...]:
    """Where each declared tie stands in the stored tensors."""
    storage_of = {t.name: t.storage_id for t in checkpoint.tensors}
    states = []
    for tie in ties:
        target, source = storage_of.get(tie.target), storage_of.get(tie.source)
        shared = target is not None and target == source
        states.append(TieState(tie, target is not None, source is not None, shared))
    return tuple(states)


def build_graph(checkpoint: Checkpoint, extra_ties: tuple[DeclaredTie, ...] = ()) -> AliasGraph:
    """Group names by storage and place the declared ties (from the files, plus extra_ties)."""
    by_storage: dict[str, list[TensorInfo]] = defaultdict(list)
    for tensor in checkpoint.tensors:
        by_storage[tensor.storage_id].append(tensor)
    groups = tuple(
        _group(storage_id, views, checkpoint.storages[storage_id].nbytes)
        for storage_id, views in by_storage.items()
        if len(views) > 1
    )
    return AliasGraph(checkpoint, groups, tie_states(checkpoint, checkpoint.declared_ties + extra_ties))
