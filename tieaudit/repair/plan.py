"""The retie plan: which name keeps the bytes, how each copy is represented, what is left and why.

By default a format gets only the relations its usual loaders restore by themselves: equal copies
everywhere; transposed copies as views in .pt and as a Transpose node in ONNX. Transposed or cast
copies in safetensors are restored only by ``tieaudit.load_tied``, so they are applied when asked
for with --relations; a cast cannot be a view in .pt at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from tieaudit.compare import BlockComparer, equal_bytes
from tieaudit.detect import ALL_RELATIONS, CopyGroup, CopyMember, CopyRelation, find_copies, lookup_tables
from tieaudit.errors import UsageError
from tieaudit.graph import AliasGraph
from tieaudit.model import Checkpoint, Format

DEFAULT_RELATIONS: dict[Format, frozenset[str]] = {
    "safetensors": frozenset({"equal"}),
    "hf-dir": frozenset({"equal"}),
    "torch": frozenset({"equal", "transposed"}),
    "onnx": frozenset({"equal", "transposed"}),
}
REPRESENTABLE: dict[Format, frozenset[str]] = {
    "safetensors": ALL_RELATIONS,
    "hf-dir": ALL_RELATIONS,
    "torch": frozenset({"equal", "transposed"}),
    "onnx": ALL_RELATIONS,
}
_WHY_NOT_DEFAULT = {
    "transposed": "a transposed copy in safetensors is restored only by tieaudit.load_tied "
    "(other loaders would see a missing tensor); ask with --relations equal,transposed",
    "cast": "a cast copy is restored only by tieaudit.load_tied (or a Cast node in ONNX); "
    "ask with --relations equal,cast",
}


@dataclass(frozen=True)
class Decision:
    """What retie does with one copy."""

    kept: str
    """The name whose bytes stay stored."""
    dropped: str
    """The copy: no longer stored, restored from kept."""
    relation: CopyRelation
    """equal, transposed (dropped == kept.T) or cast (dropped == kept cast to dropped's dtype)."""
    transposed: bool
    """dropped holds kept's transpose (also for a transposed cast)."""
    nbytes: int
    """Bytes saved."""
    applied: bool
    """False when the copy is left as it is."""
    reason: str = ""
    """Why a copy is left (empty when applied)."""


@dataclass(frozen=True)
class RetiePlan:
    """Every decision for one checkpoint."""

    path: str
    """The input."""
    format: Format
    """The input's format (the output has the same)."""
    relations: frozenset[str]
    """The relations applied."""
    decisions: tuple[Decision, ...]
    """One per copy found, applied or left."""

    @property
    def applied(self) -> tuple[Decision, ...]:
        """The decisions carried out."""
        return tuple(d for d in self.decisions if d.applied)

    @property
    def saved_bytes(self) -> int:
        """Bytes the output saves."""
        return sum(d.nbytes for d in self.applied)

    def source_of(self, name: str) -> Decision | None:
        """The applied decision that drops name, if any."""
        return next((d for d in self.applied if d.dropped == name), None)


def _rekeep(group: CopyGroup, keep: str, ckpt: Checkpoint) -> CopyGroup:
    """The same group with another kept name (relations re-expressed from it)."""
    if keep == group.kept:
        return group
    new_kept = next(m for m in group.members if m.name == keep)
    if new_kept.relation == "cast":
        wide = ckpt.tensor(group.kept).dtype
        raise UsageError(
            f"--keep {keep}: it is a lower-precision cast of {group.kept} ({wide}); keep that one"
        )
    members = [CopyMember(group.kept, new_kept.relation, new_kept.transposed, ckpt.tensor(group.kept).nbytes)]
    for member in group.members:
        if member.name == keep:
            continue
        transposed = member.transposed != new_kept.transposed
        relation: CopyRelation = (
            "cast" if member.relation == "cast" else "transposed" if transposed else "equal"
        )
        members.append(CopyMember(member.name, relation, transposed, member.nbytes))
    return CopyGroup(keep, tuple(members))


def _declared_equal_groups(graph: AliasGraph, covered: set[str]) -> list[CopyGroup]:
    """Declared ties stored as equal copies that the size threshold kept out of the search."""
    ckpt = graph.checkpoint
    comparer = BlockComparer()
    groups = []
    for state in graph.ties:
        tie = state.tie
        if not (state.target_stored and state.source_stored) or state.shared_storage:
            continue
        if tie.target in covered or tie.source in covered:
            continue
        source, target = ckpt.tensor(tie.source), ckpt.tensor(tie.target)
        if equal_bytes(ckpt, source, target, comparer):
            groups.append(CopyGroup(source.name, (CopyMember(target.name, "equal", False, target.nbytes),)))
            covered |= {tie.target, tie.source}
    return groups


def _loader_pairs(ckpt: Checkpoint) -> set[frozenset[str]] | None:
    """For a Hugging Face folder: the pairs from_pretrained re-ties by itself (the model class's
    ties with the flag set). None for formats whose loaders restore any recorded copy."""
    if ckpt.format != "hf-dir":
        return None
    from tieaudit.formats.hf_dir import read_config
    from tieaudit.repair.hf_writer import class_pairs

    config, _ = read_config(ckpt.path)
    return {frozenset(pair) for pair in class_pairs(ckpt, config or {})}


def _reason(
    member: CopyMember,
    kept: str,
    ckpt: Checkpoint,
    chosen: frozenset[str],
    explicit: bool,
    loader_pairs: set[frozenset[str]] | None,
) -> str:
    """Why a copy is left as it is ('' when it is re-tied)."""
    if member.relation not in REPRESENTABLE[ckpt.format]:
        return f"a {member.relation} copy cannot be represented in {ckpt.format}; both stay stored"
    if member.relation not in chosen:
        if explicit:
            return f"{member.relation} not in --relations"
        return _WHY_NOT_DEFAULT.get(member.relation, f"{member.relation} not in --relations")
    if (
        loader_pairs is not None
        and member.relation == "equal"
        and frozenset((kept, member.name)) not in loader_pairs
    ):
        return (
            "from_pretrained restores a dropped name only through the model class's own ties, and the "
            "class does not tie these two: the copy would come back randomly initialised"
        )
    return ""


def make_plan(
    graph: AliasGraph,
    relations: frozenset[str] | None = None,
    keep: str | None = None,
    min_bytes: int = 1024,
) -> RetiePlan:
    """Decide, for every copy in the checkpoint, whether and how it becomes a tie again."""
    ckpt = graph.checkpoint
    chosen = DEFAULT_RELATIONS[ckpt.format] if relations is None else relations
    sources = frozenset(s.tie.source for s in graph.ties)
    groups = find_copies(ckpt, ALL_RELATIONS, min_bytes, lookup_names=lookup_tables(ckpt), sources=sources)
    covered = {name for group in groups for name in group.names}
    groups += _declared_equal_groups(graph, covered)
    if keep is not None:
        if not any(keep in g.names for g in groups):
            raise UsageError(f"--keep {keep}: no copy group holds that name")
        groups = [_rekeep(g, keep, ckpt) if keep in g.names else g for g in groups]
    loader_pairs = _loader_pairs(ckpt)
    decisions = []
    for group in groups:
        for member in group.members:
            reason = _reason(member, group.kept, ckpt, frozenset(chosen), relations is not None, loader_pairs)
            decisions.append(
                Decision(
                    group.kept,
                    member.name,
                    member.relation,
                    member.transposed,
                    member.nbytes,
                    not reason,
                    reason,
                )
            )
    return RetiePlan(ckpt.path, ckpt.format, frozenset(chosen), tuple(decisions))
