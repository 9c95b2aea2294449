"""What a rewrite saves: the bytes of the storages no name views any more.

A storage is written whole while any tensor views it: ``torch.save`` writes the flat buffer of an
LSTM's ``flatten_parameters`` whole for each of its four views, whichever of them a copy drops.
So the bytes a re-tie saves are never the dropped tensors' sizes but the sizes of the storages all
of whose names are dropped (safetensors and ONNX hold one region per tensor, where the two agree).
Names of one storage are views of one buffer, never copies of each other: equal values there waste
nothing. Metadata only: no tensor bytes are read here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from tieaudit.core.records import Checkpoint


class StorageUse:
    """Which names view each storage of one checkpoint, and what dropping some of them frees."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        viewers: dict[str, list[str]] = defaultdict(list)
        for tensor in checkpoint.tensors:
            viewers[tensor.storage_id].append(tensor.name)
        self.viewers: dict[str, tuple[str, ...]] = {key: tuple(names) for key, names in viewers.items()}
        """Storage id -> the names viewing it, in stored order (storages no read tensor views are
        absent: nothing tieaudit drops can free them)."""
        self.storage_of: dict[str, str] = {t.name: t.storage_id for t in checkpoint.tensors}
        """Name -> the storage it views."""
        self.nbytes: dict[str, int] = {key: s.nbytes for key, s in checkpoint.storages.items()}
        """Storage id -> its bytes."""
        same_view: dict[tuple[object, ...], list[str]] = defaultdict(list)
        for tensor in checkpoint.tensors:
            key = (tensor.storage_id, tensor.byte_offset, tensor.dtype, tensor.shape, tensor.strides)
            same_view[key].append(tensor.name)
        self._same_view = {name: names for names in same_view.values() if len(names) > 1 for name in names}

    def freed(self, dropped: Iterable[str]) -> list[str]:
        """The storages every name of which is in dropped: what a rewrite no longer writes."""
        gone = set(dropped)
        return [key for key, names in self.viewers.items() if all(name in gone for name in names)]

    def saved(self, dropped: Iterable[str]) -> int:
        """Bytes a rewrite that drops these names saves: its freed storages' sizes."""
        return sum(self.nbytes[key] for key in self.freed(dropped))

    def droppable(self, candidates: Iterable[str]) -> set[str]:
        """The candidates whose storage a rewrite can drop: every other name viewing it is a
        candidate too. Dropping any other candidate saves nothing (its storage stays whole for the
        names that stay); since a name views one storage, one pass decides every storage."""
        chosen = set(candidates)
        return {name for name in chosen if all(n in chosen for n in self.viewers[self.storage_of[name]])}

    def shares_with_others(self, name: str, group: frozenset[str]) -> bool:
        """name's storage is also viewed by another tensor outside group (not merely another name of
        name's own view): it is written whatever the group becomes, so the name a re-tie keeps is
        best one there."""
        own = self._same_view.get(name, ())
        return any(other not in group and other not in own for other in self.viewers[self.storage_of[name]])

    def aliases(self, name: str) -> list[str]:
        """The other names viewing name's bytes exactly as name does: one tensor under several names
        (the copy search compares one of them; a rewrite drops them all or frees nothing)."""
        return [other for other in self._same_view.get(name, ()) if other != name]
