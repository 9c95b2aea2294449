"""From an unpickled torch object to a Checkpoint: leaves under dotted names, views checked.

Nested training checkpoints (``{"model": ..., "optimizer": ...}``) are flattened to dotted names
(``model.lm_head.weight``, ``optimizer.state.0.exp_avg``); tensors tieaudit does not read as
values (quantized, sparse, meta, complex32, conj bit, ...) are listed as ``UnreadTensor`` entries,
other leaves kept as ``Skipped`` entries with the reason. Two leaves that flatten to one name (a
nested key and a dotted key, ``0`` and ``"0"``, a list index and a key) are refused, never resolved
by keeping one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tieaudit.core.bytestore import ByteStore, OpenCheckpoint
from tieaudit.core.dtypes import ITEMSIZE, itemsize
from tieaudit.core.errors import InputError
from tieaudit.core.escape import printable, quoted
from tieaudit.core.records import (
    MAX_KEPT_SKIPPED,
    Checkpoint,
    PickleGlobal,
    Skipped,
    StorageInfo,
    TensorInfo,
    UnreadTensor,
)
from tieaudit.formats.pickle_budget import LEAF_UNITS, NODE_UNITS, TENSOR_UNITS, OverBudget, PickleBudget
from tieaudit.formats.pickle_globals import Named
from tieaudit.formats.pickle_vm import MAX_DEPTH
from tieaudit.formats.torch_records import (
    CounterDict,
    DtypeToken,
    Opaque,
    OpaqueTensor,
    Placeholder,
    StateDict,
    StorageRef,
    TensorRecord,
    key_name,
    packed_end,
)
from tieaudit.formats.viewable import check_viewable

MAX_VISITS = 1_000_000
"""Values visited while flattening; bounds work on pickles that share one container many times."""
ROOT_NAME = "<root>"
"""Name of the tensor when the checkpoint is a single tensor rather than a container."""
TENSORS = (TensorRecord, OpaqueTensor)
"""Leaves that are tensors, read or only listed."""

LocateStorage = Callable[[StorageRef], int]
"""Absolute file offset of a storage's first byte; raises InputError when its bytes are not there."""


@dataclass(frozen=True)
class Entry:
    """One leaf of the unpickled object, with its dotted name."""

    name: str
    """Dotted path: dict keys and list indexes joined with ``.``."""
    value: object
    """The leaf: a TensorRecord, or a value that becomes a Skipped entry."""


class _Stop(Exception):
    """Counting stopped; the keys leading to where are collected while the recursion unwinds."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.keys: list[object] = []


Walked = dict[object, object] | list[object] | tuple[object, ...] | Placeholder
WALKED = (dict, list, tuple, Placeholder)
"""Values whose parts are walked: containers, and placeholders (what an unknown class held)."""
ATTRIBUTED = (TensorRecord, OpaqueTensor, StateDict, CounterDict)
"""Values loading may set attributes on (kept by the pickle hooks as ``attributes``)."""


def _items(value: Walked) -> list[tuple[str, object]] | Iterable[tuple[str, object]]:
    """(name part, item) pairs of a walked value."""
    if isinstance(value, dict):
        return ((key_name(key), item) for key, item in value.items())
    if isinstance(value, Placeholder):
        return value.parts()
    return ((str(index), item) for index, item in enumerate(value))


def _raw_items(value: Walked) -> Iterable[tuple[object, object]]:
    """(key, item) pairs of a walked value, the key as stored: made a name part (``_part``) only
    when one is needed (an error names the path), not for each of a million leaves counted."""
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, Placeholder):
        return value.parts()
    return enumerate(value)


def _part(value: Walked, key: object) -> str:
    """The name part ``_items`` gives key of value."""
    if isinstance(value, dict):
        return key_name(key)
    return key if isinstance(key, str) else str(key)


def _attributes(value: object) -> dict[object, object] | None:
    """Attributes loading sets on value (a tensor's, an OrderedDict's), which torch.load returns
    with it: walked under value's name, so the tensors among them are never dropped."""
    return getattr(value, "attributes", None) if isinstance(value, ATTRIBUTED) else None


def _nonempty(value: Walked) -> bool:
    return bool(value) if not isinstance(value, Placeholder) else True


_OWN_ATTRIBUTES = object()
"""The key under which ``_count`` visits a container's own attributes."""


def _count(root: object, path: str) -> int:
    """Leaves and containers under root, counting a shared container once per place it appears.

    Each container's count is computed once (by identity), so a pickle that lists one container
    a billion times through memo references is measured without being walked. A container being
    counted is marked -1, so meeting it again below itself is a cycle.
    """
    counts: dict[int, int] = {}

    def count(value: Walked, depth: int) -> int:
        known = counts.get(id(value))
        if known is not None:
            if known < 0:
                raise _Stop("contains itself")
            return known
        if depth > MAX_DEPTH:
            raise _Stop(f"is nested deeper than {MAX_DEPTH} levels")
        counts[id(value)] = -1
        total = 1
        extra = _attributes(value)
        pairs = _raw_items(value)
        for key, item in pairs if extra is None else [*pairs, (_OWN_ATTRIBUTES, extra)]:
            if isinstance(item, WALKED) and _nonempty(item):
                try:
                    total += count(item, depth + 1)
                except _Stop as stop:
                    stop.keys.append("" if key is _OWN_ATTRIBUTES else _part(value, key))
                    raise
            else:
                total += 1
                if (attributes := _attributes(item)) is not None:
                    total += count(attributes, depth + 1)
            if total > MAX_VISITS:
                raise _Stop(f"holds more than {MAX_VISITS} entries (or shared containers)")
        counts[id(value)] = total
        return total

    try:
        if isinstance(root, WALKED):
            return count(root, 0)
        attributes = _attributes(root)  # a tensor at the root, perhaps with attributes
        return 1 if attributes is None else 1 + count(attributes, 1)
    except _Stop as stop:
        name = _joined(reversed(stop.keys), 200) or ROOT_NAME
        raise InputError(f"container {name!r} {stop.problem}", path) from None


def _joined(keys: Iterable[object], limit: int) -> str:
    """The first limit characters of the keys' dotted name, without building the rest of it (a
    name of 199 levels of one 4 MB key would be 800 MB)."""
    name = ""
    for key in keys:
        name += ("." if name else "") + key_name(key)[: limit + 1]
        if len(name) >= limit:
            break
    return name[:limit]


def _shown(name: str) -> str:
    """A name from the file, as a message shows it: escaped, and cut short."""
    return repr(printable(name[:120]) + ("..." if len(name) > 120 else ""))


def _leaves(root: object, path: str, budget: PickleBudget) -> list[tuple[str, object]]:
    """(dotted name, leaf) pairs of root in pickle order; cycles and runaway nesting are InputErrors.

    Each value named is charged to budget with its name (a shared container is named once per
    place it appears, and names grow with depth and key length), and each tensor with what the
    audit will keep for it: a pickle cannot make the reports cost more than it may cost itself.
    """
    _count(root, path)  # bounds the walk below: at most MAX_VISITS values, no cycle, bounded depth
    leaves: list[tuple[str, object]] = []
    add = leaves.append

    def walk(name: str, value: object) -> bool:
        """Add the leaves under value; whether a tensor is among them. A placeholder holding no
        tensor is one leaf (its numbers and strings would only be noise). Every name is charged
        before it is built (it and its parents' stay alive down the walk)."""
        if not isinstance(value, WALKED):
            add((name or ROOT_NAME, value))
            if isinstance(value, TENSORS):
                budget.charge(TENSOR_UNITS, f"the tensor named {_shown(name)}")
                attached(name, _attributes(value))
                return True
            return False
        first = len(leaves)
        budget.left -= NODE_UNITS + len(name)
        if budget.left < 0:
            budget.over(f"the container named {_shown(name)}")
        prefix = f"{name}." if name else ""
        found = False
        for key, item in _items(value):
            walked = isinstance(item, WALKED)
            if walked and not _nonempty(item):  # type: ignore[arg-type]
                continue  # an empty container has no leaves to name
            budget.left -= LEAF_UNITS + len(prefix) + len(key)
            if budget.left < 0:
                budget.over(f"naming {_shown(prefix + key)}")
            if not walked and _attributes(item) is None:
                add((prefix + key, item))
                if isinstance(item, TENSORS):
                    budget.charge(TENSOR_UNITS, f"the tensor named {_shown(prefix + key)}")
                    found = True
            else:
                found = walk(prefix + key, item) or found
        if isinstance(value, Placeholder) and not found:
            del leaves[first:]
            add((name or ROOT_NAME, value))
        return attached(name, _attributes(value)) or found

    def attached(name: str, attributes: dict[object, object] | None) -> bool:
        """List the tensors among attributes under name (``w.extra``); attributes holding none
        (an OrderedDict's module versions) add nothing."""
        if not attributes:
            return False
        first = len(leaves)
        found = walk(name, attributes)
        if not found:
            del leaves[first:]
        return found

    try:
        walk("", root)
    except OverBudget as exc:
        raise InputError(f"the unpickled checkpoint {exc}", path) from None
    return leaves


def flatten(root: object, path: str, *, budget: PickleBudget | None = None) -> list[Entry]:
    """Leaves of root with dotted names, in pickle order; cycles, runaway nesting and names past
    the budget (by default, the least any file has) are InputErrors."""
    return [Entry(name, value) for name, value in _leaves(root, path, budget or PickleBudget(0))]


_PLAIN_REASONS: dict[type, str] = {
    kind: f"{kind.__name__} leaf" for kind in (int, float, str, bool, bytes, set)
}
_PLAIN_REASONS[type(None)] = "None leaf"


def _skip_reason(value: object) -> str:
    plain = _PLAIN_REASONS.get(type(value))
    if plain is not None:
        return plain
    if isinstance(value, Opaque):
        return f"{value.kind} leaf"
    if isinstance(value, Placeholder):
        what = "object" if value.made else "global"
        shown = printable(value.name[:120])
        return f"{shown} {what}: an inert placeholder (never imported or called), no tensor inside"
    if isinstance(value, DtypeToken):
        return "torch.dtype leaf"
    if isinstance(value, StorageRef):
        return "bare storage leaf (not a tensor)"
    return f"{'None' if value is None else type(value).__name__} leaf"


def _unread(name: str, record: TensorRecord | OpaqueTensor, path: str, *, file: str) -> UnreadTensor:
    """The listing of a tensor tieaudit does not read as values (its view still checked to fit)."""
    if isinstance(record, OpaqueTensor):
        return UnreadTensor(name=name, kind=record.kind, dtype=record.dtype, shape=record.shape, file=file)
    _check_view(name, record, path)
    if record.flags:
        kind = f"{' and '.join(sorted(record.flags))} bit{'s' if len(record.flags) > 1 else ''} set"
    else:
        kind = "dtype numpy cannot view"
    return UnreadTensor(name=name, kind=kind, dtype=record.dtype, shape=record.shape, file=file)


def _check_view(name: str, record: TensorRecord, path: str) -> None:
    """The view stays inside its storage, as torch's set_ requires (for every dtype, viewable or not)."""
    last = sum((dim - 1) * stride for dim, stride in zip(record.shape, record.strides, strict=True))
    numel_zero = any(dim == 0 for dim in record.shape)
    end = packed_end(record.offset if numel_zero else record.offset + last + 1, record.dtype)
    if end > record.storage.nbytes:
        raise InputError(
            f"tensor {name[:200]!r} reaches byte {end} of storage {record.storage.key[:40]!r}, "
            f"which holds {record.storage.nbytes}",
            path,
        )


def _storage_infos(
    storages: dict[str, StorageRef], tensors: list[TensorInfo], locate: LocateStorage, *, file: str
) -> dict[str, StorageInfo]:
    # An untyped storage (float8, uint16, ...) takes the dtype of the first tensor viewing it.
    viewed_as = {tensor.storage_id: tensor.dtype for tensor in reversed(tensors)}  # the first one wins
    return {
        key: StorageInfo(
            storage_id=key,
            file=file,
            file_offset=locate(ref),
            nbytes=ref.nbytes,
            dtype=ref.dtype if ref.typed else viewed_as.get(key, "uint8"),
            location=ref.location,
        )
        for key, ref in storages.items()
    }


def build_checkpoint(
    path: str,
    root: object,
    storages: dict[str, StorageRef],
    *,
    locate: LocateStorage,
    referenced: Mapping[str, Named] | None = None,
    budget: PickleBudget | None = None,
) -> OpenCheckpoint:
    """Turn the unpickled object into a Checkpoint: tensors, storages located in the file, skipped
    leaves; flattening is charged to budget (the file's, what its pickles left of it)."""
    file = os.path.basename(path)
    tensors: list[TensorInfo] = []
    unread: list[UnreadTensor] = []
    skipped: list[Skipped] = []
    more = 0
    seen: set[str] = set()
    plain = _PLAIN_REASONS.get
    for name, record in _leaves(root, path, budget or PickleBudget(0)):
        if name in seen:
            raise InputError(
                f"two entries are named {quoted(name)} once nested keys are joined with '.' (a nested "
                "and a dotted key, or keys like 0 and '0'); tieaudit does not choose one",
                path,
            )
        seen.add(name)
        reason = plain(type(record))
        if reason is not None:  # the common non-tensor leaves (optimizer indexes, hyperparameters)
            if len(skipped) < MAX_KEPT_SKIPPED:
                skipped.append(Skipped(name, reason, file))
            else:
                more += 1
        elif isinstance(record, TensorRecord) and not record.flags and record.dtype in ITEMSIZE:
            offset = record.offset * itemsize(record.dtype)
            check_viewable(
                name,
                record.shape,
                record.strides,
                itemsize=itemsize(record.dtype),
                byte_offset=offset,
                path=path,
            )
            _check_view(name, record, path)
            tensors.append(
                TensorInfo(
                    name=name,
                    dtype=record.dtype,
                    shape=record.shape,
                    strides=record.strides,
                    storage_id=record.storage.key,
                    byte_offset=offset,
                    file=file,
                )
            )
        elif isinstance(record, TENSORS):
            unread.append(_unread(name, record, path, file=file))
        elif len(skipped) < MAX_KEPT_SKIPPED:
            skipped.append(Skipped(name, _skip_reason(record), file))
        else:
            more += 1
    checkpoint = Checkpoint(
        path=path,
        format="torch",
        tensors=tuple(tensors),
        storages=_storage_infos(storages, tensors, locate, file=file),
        skipped=tuple(skipped),
        skipped_more=more,
        unread=tuple(unread),
        files=(file,),
        pickle_globals=tuple(
            PickleGlobal(name=name, verdict=g.verdict, file=file, use=g.described())
            for name, g in (referenced or {}).items()
        ),
    )
    return OpenCheckpoint(checkpoint, ByteStore(os.path.dirname(os.path.abspath(path))))
