"""Find stored copies that should be one tensor: equal, transposed or cast.

Staged so that cost follows the bytes of real copies, not the checkpoint size:
bucket by element count -> sampled fingerprint (a few dozen elements) -> full xxh3-128 hash
(only where more than two tensors still collide) -> exact byte comparison before reporting.
Constant tensors and tensors under the size threshold are never candidates.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import FLOATS, GGML_BLOCK_TYPES, cast, itemsize
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.graph import DEFAULT_MIN_BYTES
from tieaudit.graph.compare import (
    BlockComparer,
    cast_bytes,
    equal_bytes,
    full_hash,
    is_constant,
    sample,
    transposed_bytes,
)
from tieaudit.graph.storage_use import StorageUse

CopyRelation = Literal["equal", "transposed", "cast"]
ALL_RELATIONS: frozenset[str] = frozenset({"equal", "transposed", "cast"})


def copy_relation(*, transposed: bool, cast: bool) -> CopyRelation:
    """A copy's relation to the kept tensor: cast whatever its orientation, else transposed or equal."""
    return "cast" if cast else "transposed" if transposed else "equal"


@dataclass(frozen=True, kw_only=True)
class CopyMember:
    """A name whose bytes duplicate the group's kept tensor."""

    name: str
    """The duplicate, as stored."""
    relation: CopyRelation
    """equal (same bytes), transposed (== kept.T) or cast (== kept cast to this dtype)."""
    transposed: bool
    """The values are the kept tensor's transpose (also set for a transposed cast)."""
    nbytes: int
    """Bytes the duplicate's elements occupy (what a repair saves is its storage's: ``settle``)."""
    stays: bool = False
    """Its storage also holds names that stay (a slice of a flat buffer beside other parameters):
    the storage is written whole whatever happens to this name, so re-tying it saves nothing."""


@dataclass(frozen=True)
class CopyGroup:
    """Tensors verified to hold one matrix's values in separate storages."""

    kept: str
    """The name whose bytes a repair keeps (widest dtype, then the input-embedding side)."""
    members: tuple[CopyMember, ...]
    """Every other name of the group, with its relation to kept; none views kept's storage."""
    wasted_bytes: int
    """Bytes a repair of the group saves: the storages none of whose names stays (``settle``)."""

    @property
    def names(self) -> tuple[str, ...]:
        """kept first, then the duplicates."""
        return (self.kept, *(m.name for m in self.members))


EMBEDDING_HINTS = (
    "embed_tokens",
    "wte",
    "word_embeddings",
    "shared",
    "tok_embeddings",
    "token_embd",
    "embed",
)


def keep_rank(
    tensor: TensorInfo,
    order: int,
    lookup_names: frozenset[str],
    *,
    sources: frozenset[str] = frozenset(),
    pinned: frozenset[str] = frozenset(),
) -> tuple[int, int, int, int, int]:
    """Sort key for the tensor a repair keeps: widest dtype (a cast cannot be undone), then the
    source of a declared tie (the name the model class loads: ``shared``, ``embed_in``, ``wte``),
    then a name in a storage that is written anyway (pinned: other tensors view it too, so keeping
    it there and dropping a copy with a storage of its own is what saves bytes), then a lookup
    table (ONNX Gather input, or an embedding-like name), then stored order."""
    embedding_like = tensor.name in lookup_names or any(h in tensor.name for h in EMBEDDING_HINTS)
    source = 0 if tensor.name in sources else 1
    return (
        -itemsize(tensor.dtype),
        source,
        0 if tensor.name in pinned else 1,
        0 if embedding_like else 1,
        order,
    )


def lookup_tables(ckpt: Checkpoint) -> frozenset[str]:
    """Tensors used as lookup tables: the data input of an ONNX Gather (the embedding side)."""
    return frozenset(
        name
        for name, uses in ckpt.consumers.items()
        if any(u.op_type == "Gather" and u.slot == 0 for u in uses)
    )


def _views(ckpt: Checkpoint, min_bytes: int) -> list[TensorInfo]:
    """One tensor per distinct view, large enough to matter; aliases of one view are one candidate."""
    seen: set[tuple[object, ...]] = set()
    views = []
    for tensor in ckpt.tensors:
        key = (tensor.storage_id, tensor.byte_offset, tensor.shape, tensor.strides, tensor.dtype)
        if tensor.nbytes >= min_bytes and tensor.numel > 1 and key not in seen:
            seen.add(key)
            views.append(tensor)
    return views


class _Search:
    """The state of one copy search: union-find over verified relations, cached fingerprints."""

    def __init__(self, opened: OpenCheckpoint, relations: Iterable[str]) -> None:
        self.opened = opened
        self.relations = frozenset(relations)
        self.comparer = BlockComparer()
        self.constant: dict[str, bool] = {}
        self.prints: dict[tuple[str, bool, str | None], bytes] = {}
        self.parent: dict[str, str] = {}
        self.edges: list[tuple[TensorInfo, TensorInfo, CopyRelation]] = []

    def find(self, name: str) -> str:
        root = self.parent.setdefault(name, name)
        while root != self.parent[root]:
            root = self.parent[root]
        self.parent[name] = root
        return root

    def joined(self, first: TensorInfo, second: TensorInfo) -> bool:
        return self.find(first.name) == self.find(second.name)

    def record(self, original: TensorInfo, copy: TensorInfo, relation: CopyRelation) -> None:
        self.parent[self.find(copy.name)] = self.find(original.name)
        self.edges.append((original, copy, relation))

    def fingerprint(self, tensor: TensorInfo, transposed: bool = False, as_dtype: str | None = None) -> bytes:
        key = (tensor.name, transposed, as_dtype)
        if key not in self.prints:
            values = sample(self.opened, tensor, transposed)
            if as_dtype is not None:
                values = cast(values, tensor.dtype, as_dtype)
            self.prints[key] = values.tobytes()
        return self.prints[key]

    def not_constant(self, tensor: TensorInfo) -> bool:
        # A full scan only for a tensor whose samples look constant and that already collides.
        values = self.fingerprint(tensor)
        size = itemsize(tensor.dtype)
        if values != values[:size] * (len(values) // size):
            return True
        if tensor.name not in self.constant:
            self.constant[tensor.name] = is_constant(self.opened, tensor)
        return not self.constant[tensor.name]

    def equal(self, bucket: list[TensorInfo]) -> None:
        groups: dict[tuple[object, ...], list[TensorInfo]] = defaultdict(list)
        for tensor in bucket:
            groups[(tensor.dtype, tensor.shape, self.fingerprint(tensor))].append(tensor)
        for members in groups.values():
            if len(members) < 2:
                continue
            members = [m for m in members if self.not_constant(m)]
            classes = [members]
            if len(members) > 2:  # hashing pays only when several tensors still collide
                by_hash: dict[bytes, list[TensorInfo]] = defaultdict(list)
                for member in members:
                    by_hash[full_hash(self.opened, member)].append(member)
                classes = list(by_hash.values())
            for same in classes:
                for other in same[1:]:
                    if equal_bytes(self.opened, same[0], other, comparer=self.comparer):
                        self.record(same[0], other, "equal")

    def representatives(self, bucket: list[TensorInfo]) -> list[TensorInfo]:
        seen: set[str] = set()
        chosen = []
        for tensor in bucket:
            root = self.find(tensor.name)
            if root not in seen:
                seen.add(root)
                chosen.append(tensor)
        return chosen

    def transposed(self, bucket: list[TensorInfo]) -> None:
        matrices = [  # a GGML block type's rows are blocks: its transpose is no matrix's
            t for t in self.representatives(bucket) if len(t.shape) == 2 and t.dtype not in GGML_BLOCK_TYPES
        ]
        by_print: dict[tuple[object, ...], list[TensorInfo]] = defaultdict(list)
        for tensor in matrices:
            by_print[(tensor.dtype, tensor.shape, self.fingerprint(tensor))].append(tensor)
        shapes = {(t.dtype, t.shape) for t in matrices}
        for other in matrices:
            if (other.dtype, other.shape[::-1]) not in shapes:
                continue  # no matrix of the transposed shape: skip the fingerprint's reads
            key = (other.dtype, other.shape[::-1], self.fingerprint(other, transposed=True))
            for original in by_print.get(key, []):
                if original.storage_id == other.storage_id or self.joined(original, other):
                    continue  # already one storage, or already known to be one group
                if self.not_constant(original) and transposed_bytes(
                    self.opened, original, other, comparer=self.comparer
                ):
                    self.record(original, other, "transposed")

    def cast(self, bucket: list[TensorInfo]) -> None:
        """Pairs (wide, narrow) of one shape where narrow holds wide cast to its dtype. Narrow
        tensors are looked up by fingerprint, as transposed ones are: each wide tensor costs one
        fingerprint per narrower dtype of its shape, never one per pair (10 000 same-shape tensors
        were 10^8 pair checks)."""
        floats = [t for t in self.representatives(bucket) if t.dtype in FLOATS]
        by_print: dict[tuple[object, ...], list[TensorInfo]] = defaultdict(list)
        dtypes: dict[tuple[int, ...], set[str]] = defaultdict(set)
        for tensor in floats:
            dtypes[tensor.shape].add(tensor.dtype)
        for tensor in floats:  # only a dtype some wider tensor of its shape can be cast to
            if any(itemsize(d) > itemsize(tensor.dtype) for d in dtypes[tensor.shape]):
                by_print[(tensor.dtype, tensor.shape, self.fingerprint(tensor))].append(tensor)
        for wide in floats:
            for dtype in sorted(d for d in dtypes[wide.shape] if itemsize(d) < itemsize(wide.dtype)):
                key = (dtype, wide.shape, self.fingerprint(wide, as_dtype=dtype))
                for narrow in by_print.get(key, []):
                    if wide.storage_id == narrow.storage_id or self.joined(wide, narrow):
                        continue
                    if self.not_constant(narrow) and cast_bytes(
                        self.opened, wide, narrow, comparer=self.comparer
                    ):
                        self.record(wide, narrow, "cast")

    def groups(self, lookup_names: frozenset[str], sources: frozenset[str]) -> list[CopyGroup]:
        order = {t.name: i for i, t in enumerate(self.opened.checkpoint.tensors)}
        adjacency: dict[str, list[tuple[TensorInfo, bool]]] = defaultdict(list)
        tensors: dict[str, TensorInfo] = {}
        for first, second, relation in self.edges:
            flip = relation == "transposed"
            adjacency[first.name].append((second, flip))
            adjacency[second.name].append((first, flip))
            tensors[first.name], tensors[second.name] = first, second
        by_root: dict[str, list[TensorInfo]] = defaultdict(list)
        for name, tensor in tensors.items():
            by_root[self.find(name)].append(tensor)
        use = StorageUse(self.opened.checkpoint)
        result = []
        for members in by_root.values():
            names = frozenset(t.name for t in members)
            pinned = frozenset(n for n in names if use.shares_with_others(n, names))
            kept = min(
                members,
                key=lambda t: keep_rank(t, order[t.name], lookup_names, sources=sources, pinned=pinned),
            )
            result.append(CopyGroup(kept.name, tuple(_relate_to(kept, adjacency, order)), 0))
        return settle(self.opened.checkpoint, sorted(result, key=lambda g: order[g.kept]))


def _relate_to(
    kept: TensorInfo, adjacency: dict[str, list[tuple[TensorInfo, bool]]], order: dict[str, int]
) -> list[CopyMember]:
    """Each group member's relation to kept, composed along verified edges (breadth first)."""
    orientation = {kept.name: False}
    queue = [kept.name]
    members = []
    while queue:
        current = queue.pop(0)
        for neighbour, flip in adjacency[current]:
            if neighbour.name in orientation:
                continue
            transposed = orientation[current] != flip
            orientation[neighbour.name] = transposed
            queue.append(neighbour.name)
            relation = copy_relation(transposed=transposed, cast=neighbour.dtype != kept.dtype)
            members.append(
                CopyMember(
                    name=neighbour.name, relation=relation, transposed=transposed, nbytes=neighbour.nbytes
                )
            )
    return sorted(members, key=lambda m: order[m.name])


def settle(checkpoint: Checkpoint, groups: Sequence[CopyGroup]) -> list[CopyGroup]:
    """The groups as a rewrite meets them, storage by storage (``graph.storage_use``).

    A member viewing kept's storage is a view of the same buffer, not a copy: it leaves the group
    (a group left with no member is none). A member's aliases (other names of its very view) join
    it, since dropping one name of a view frees nothing. A member whose storage also holds a name
    that stays ``stays``: re-tying it saves nothing. ``wasted_bytes`` counts each storage every
    name of which is a droppable member once, under the group of its first name. Settling settled
    groups changes nothing, so callers that combine or re-key groups settle them again.
    """
    use = StorageUse(checkpoint)
    order = {t.name: i for i, t in enumerate(checkpoint.tensors)}
    grouped = {name for group in groups for name in group.names}
    trimmed: list[tuple[str, list[CopyMember]]] = []
    for group in groups:
        home = use.storage_of[group.kept]
        members: list[CopyMember] = []
        for member in group.members:
            if use.storage_of[member.name] == home:
                continue
            members.append(member)
            for alias in use.aliases(member.name):
                if alias not in grouped:
                    grouped.add(alias)
                    members.append(dataclasses.replace(member, name=alias))
        trimmed.append((group.kept, sorted(members, key=lambda m: order[m.name])))
    droppable = use.droppable(m.name for _, members in trimmed for m in members)
    owner = {m.name: index for index, (_, members) in enumerate(trimmed) for m in members}
    wasted = [0] * len(trimmed)
    for key in use.freed(droppable):
        wasted[owner[use.viewers[key][0]]] += use.nbytes[key]
    return [
        CopyGroup(
            kept, tuple(dataclasses.replace(m, stays=m.name not in droppable) for m in members), wasted[i]
        )
        for i, (kept, members) in enumerate(trimmed)
        if members
    ]


def find_copies(
    opened: OpenCheckpoint,
    relations: Iterable[str] = ALL_RELATIONS,
    min_bytes: int = DEFAULT_MIN_BYTES,
    *,
    lookup_names: frozenset[str] = frozenset(),
    sources: frozenset[str] = frozenset(),
) -> list[CopyGroup]:
    """Every group of verified copies among the checkpoint's tensors, settled by storage (``settle``:
    views of one storage are no copies, and wasted bytes are the storages a rewrite drops).

    lookup_names: tensors used as lookup tables (ONNX Gather inputs), preferred as kept;
    sources: sources of declared ties, preferred before them (see ``keep_rank``).
    """
    search = _Search(opened, relations)
    buckets: dict[int, list[TensorInfo]] = defaultdict(list)
    for tensor in _views(opened.checkpoint, min_bytes):
        buckets[tensor.numel].append(tensor)
    for bucket in buckets.values():
        if len(bucket) < 2:
            continue
        if "equal" in search.relations:
            search.equal(bucket)
        if "transposed" in search.relations:
            search.transposed(bucket)
        if "cast" in search.relations:
            search.cast(bucket)
    return search.groups(lookup_names, sources)
