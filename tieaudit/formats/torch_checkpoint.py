"""From an unpickled torch object to a Checkpoint: leaves under dotted names, views checked.

Nested training checkpoints (``{"model": ..., "optimizer": ...}``) are flattened to dotted names
(``model.lm_head.weight``, ``optimizer.state.0.exp_avg``); leaves that are not viewable tensors
are kept as ``Skipped`` entries with the reason.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tieaudit.bytestore import ByteStore
from tieaudit.dtypes import ITEMSIZE, itemsize
from tieaudit.errors import InputError
from tieaudit.formats.pickle_vm import MAX_DEPTH
from tieaudit.formats.torch_records import DtypeToken, Opaque, StorageRef, TensorRecord
from tieaudit.formats.viewable import check_viewable
from tieaudit.model import Checkpoint, Skipped, StorageInfo, TensorInfo

MAX_VISITS = 1_000_000
"""Values visited while flattening; bounds work on pickles that share one container many times."""
ROOT_NAME = "<root>"
"""Name of the tensor when the checkpoint is a single tensor rather than a container."""

LocateStorage = Callable[[StorageRef], int]
"""Absolute file offset of a storage's first byte; raises InputError when its bytes are not there."""


@dataclass(frozen=True)
class Entry:
    """One leaf of the unpickled object, with its dotted name."""

    name: str
    """Dotted path: dict keys and list indexes joined with ``.``."""
    value: object
    """The leaf: a TensorRecord, or a value that becomes a Skipped entry."""


def key_name(key: object) -> str:
    """A dict key as a part of a dotted name."""
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    return reprlib.repr(key)  # bounded depth and length, unlike str() of a hostile key


def _children(value: object) -> Iterator[tuple[str, object]] | None:
    if isinstance(value, dict):
        return ((key_name(key), item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ((str(index), item) for index, item in enumerate(value))
    return None


def _count(root: object, path: str) -> int:
    """Leaves and containers under root, counting a shared container once per place it appears.

    Each container's count is computed once (by identity), so a pickle that lists one container
    a billion times through memo references is measured without being walked.
    """
    counts: dict[int, int] = {}
    open_containers: set[int] = set()

    def count(name: str, value: object, depth: int) -> int:
        children = _children(value)
        if children is None:
            return 1
        known = counts.get(id(value))
        if known is not None:
            return known
        if depth > MAX_DEPTH:
            raise InputError(f"containers nested deeper than {MAX_DEPTH} levels at {name[:200]!r}", path)
        if id(value) in open_containers:
            raise InputError(f"container {name[:200]!r} contains itself", path)
        open_containers.add(id(value))
        total = 1
        for key, item in children:
            if isinstance(item, (dict, list, tuple)):
                total += count(f"{name}.{key}" if name else key, item, depth + 1)
            else:
                total += 1
            if total > MAX_VISITS:
                raise InputError(
                    f"more than {MAX_VISITS} entries (or shared containers) in the checkpoint", path
                )
        open_containers.discard(id(value))
        counts[id(value)] = total
        return total

    return count("", root, 0)


def flatten(root: object, path: str) -> list[Entry]:
    """Leaves of root with dotted names, in pickle order; cycles and runaway nesting are InputErrors."""
    _count(root, path)  # bounds the walk below: at most MAX_VISITS values, no cycle, bounded depth
    entries: list[Entry] = []

    def walk(name: str, value: object) -> None:
        children = _children(value)
        if children is None:
            entries.append(Entry(name or ROOT_NAME, value))
            return
        for key, item in children:
            walk(f"{name}.{key}" if name else key, item)

    walk("", root)
    return entries


def _skip_reason(value: object) -> str:
    if isinstance(value, Opaque):
        return f"{value.kind} leaf"
    if isinstance(value, DtypeToken):
        return "torch.dtype leaf"
    if isinstance(value, StorageRef):
        return "bare storage leaf (not a tensor)"
    if isinstance(value, TensorRecord) and value.dtype not in ITEMSIZE:
        return f"tensor of dtype {value.dtype}, which tieaudit cannot view"
    if isinstance(value, TensorRecord):
        return f"tensor with {'/'.join(sorted(value.flags))} bit set: stored bytes are not its values"
    return f"{'None' if value is None else type(value).__name__} leaf"


def _check_view(name: str, record: TensorRecord, path: str) -> None:
    size = itemsize(record.dtype)
    last = sum((dim - 1) * stride for dim, stride in zip(record.shape, record.strides, strict=True))
    numel_zero = any(dim == 0 for dim in record.shape)
    end = record.offset * size if numel_zero else (record.offset + last + 1) * size
    if end > record.storage.nbytes:
        raise InputError(
            f"tensor {name[:200]!r} reaches byte {end} of storage {record.storage.key[:40]!r}, "
            f"which holds {record.storage.nbytes}",
            path,
        )


def _storage_infos(
    storages: dict[str, StorageRef], tensors: list[TensorInfo], locate: LocateStorage, file: str
) -> dict[str, StorageInfo]:
    # An untyped storage (float8, uint16, ...) takes the dtype of the first tensor viewing it.
    viewed_as: dict[str, str] = {}
    for tensor in tensors:
        viewed_as.setdefault(tensor.storage_id, tensor.dtype)
    return {
        key: StorageInfo(
            key, file, locate(ref), ref.nbytes, ref.dtype if ref.typed else viewed_as.get(key, "uint8")
        )
        for key, ref in storages.items()
    }


def build_checkpoint(
    path: str, root: object, storages: dict[str, StorageRef], locate: LocateStorage
) -> Checkpoint:
    """Turn the unpickled object into a Checkpoint: tensors, storages located in the file, skipped leaves."""
    file = os.path.basename(path)
    tensors: list[TensorInfo] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for entry in flatten(root, path):
        record = entry.value
        if entry.name in seen:
            skipped.append(Skipped(entry.name, "name already used by an earlier entry"))
        elif isinstance(record, TensorRecord) and not record.flags and record.dtype in ITEMSIZE:
            offset = record.offset * itemsize(record.dtype)
            check_viewable(entry.name, record.shape, record.strides, itemsize(record.dtype), offset, path)
            _check_view(entry.name, record, path)
            info = TensorInfo(
                entry.name, record.dtype, record.shape, record.strides, record.storage.key, offset, file
            )
            tensors.append(info)
        else:
            skipped.append(Skipped(entry.name, _skip_reason(record)))
        seen.add(entry.name)
    return Checkpoint(
        path=path,
        format="torch",
        tensors=tuple(tensors),
        storages=_storage_infos(storages, tensors, locate, file),
        store=ByteStore(os.path.dirname(os.path.abspath(path))),
        skipped=tuple(skipped),
        files=(file,),
    )
