"""The retie plan: which name keeps the bytes, how each copy is represented, what is left and why.

By default a format gets only the relations its usual loaders restore by themselves: equal copies
everywhere; transposed copies as views in .pt and as a Transpose node in ONNX. Transposed or cast
copies in safetensors are restored only by ``tieaudit.load_tied``, so they are applied when asked
for with --relations; a cast cannot be a view in .pt (nor in a folder's pytorch_model.bin). In
safetensors files and model folders an equal copy is re-tied by default only where the loader
restores it (``loaders``: a recorded pair, or a pair the model class ties); --all-equal re-ties
every equal copy and the plan says what the loader will do with each one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import UsageError
from tieaudit.core.records import Checkpoint, Format
from tieaudit.formats.capabilities import DEFAULT_RELATIONS, REPRESENTABLE, WHY_NOT_DEFAULT
from tieaudit.formats.hf_dir import torch_weights
from tieaudit.formats.loaders import LoaderRule, flag_companions, loader_rule
from tieaudit.graph import DEFAULT_MIN_BYTES
from tieaudit.graph.alias import AliasGraph
from tieaudit.graph.declared_copies import declared_copy_groups
from tieaudit.graph.detect import (
    ALL_RELATIONS,
    CopyGroup,
    CopyMember,
    CopyRelation,
    copy_relation,
    find_copies,
    lookup_tables,
    settle,
)
from tieaudit.graph.storage_use import StorageUse
from tieaudit.repair.optimizer_plan import OptimizerEdit, optimizer_edits, renamed_states


@dataclass(frozen=True, kw_only=True)
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
    """Bytes of the copy's elements (what the output saves is counted by storage:
    ``RetiePlan.saved_bytes``)."""
    applied: bool
    """False when the copy is left as it is."""
    reason: str = ""
    """Why a copy is left (empty when applied)."""
    why: str = ""
    """For a pair found by comparing bytes, not by the copy search: why it is re-tied."""
    consequence: str = ""
    """For a copy re-tied only because of --all-equal: what the format's loader does with it."""


@dataclass(frozen=True, kw_only=True)
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
    saved_bytes: int
    """Bytes the output saves: the storages no name views any more once the applied copies (and the
    optimizer states discarded with them) are dropped. A storage some kept name still views is
    written whole, so this is not the sum of the copies' sizes (``graph.storage_use``)."""
    all_equal: bool = False
    """--all-equal: every equal copy re-tied, also those the format's loader does not restore."""
    optimizer_edits: tuple[OptimizerEdit, ...] = ()
    """A training checkpoint's optimizer state, made to follow the re-tied equal copies."""
    renamed: Mapping[str, str | None] = field(default_factory=dict)
    """Optimizer state names the edits move (to the new name) or discard (None)."""

    @property
    def applied(self) -> tuple[Decision, ...]:
        """The decisions carried out."""
        return tuple(d for d in self.decisions if d.applied)

    @property
    def rewritten(self) -> tuple[str, ...]:
        """Dotted prefixes under which the plan changes non-tensor entries on purpose: the state
        and param_groups of each optimizer whose parameters it renumbers (verification skips
        those values; the state tensors are followed through ``renamed``)."""
        paths = dict.fromkeys(edit.path for edit in self.optimizer_edits)
        return tuple(f"{p}.{part}." if p else f"{part}." for p in paths for part in ("state", "param_groups"))

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
    members = [
        CopyMember(
            name=group.kept,
            relation=new_kept.relation,
            transposed=new_kept.transposed,
            nbytes=ckpt.tensor(group.kept).nbytes,
        )
    ]
    for member in group.members:
        if member.name == keep:
            continue
        transposed = member.transposed != new_kept.transposed
        relation = copy_relation(transposed=transposed, cast=member.relation == "cast")
        members.append(
            CopyMember(name=member.name, relation=relation, transposed=transposed, nbytes=member.nbytes)
        )
    return CopyGroup(keep, tuple(members), 0)  # settled by make_plan


def _representable(ckpt: Checkpoint) -> tuple[frozenset[str], str]:
    """The relations the output can represent, and what to call the format when it cannot."""
    if ckpt.format == "hf-dir" and torch_weights(ckpt.files):  # copies become views, as in .pt
        return REPRESENTABLE["torch"], "pytorch_model.bin"
    return REPRESENTABLE[ckpt.format], ckpt.format


def _reason(member: CopyMember, ckpt: Checkpoint, options: _Options) -> str:
    """Why a copy is left as it is ('' when its relation is chosen and representable)."""
    representable, called = _representable(ckpt)
    if member.relation not in representable:
        return f"a {member.relation} copy cannot be represented in {called}; both stay stored"
    if member.relation not in options.chosen:
        if options.explicit:
            return f"{member.relation} not in --relations"
        return WHY_NOT_DEFAULT.get(member.relation, f"{member.relation} not in --relations")
    return ""


@dataclass(frozen=True)
class _Options:
    """What the user asked for, as the decisions need it."""

    chosen: frozenset[str]
    """Relations to apply."""
    explicit: bool
    """--relations was given."""
    all_equal: bool
    """--all-equal was given."""


def _decide(
    group: CopyGroup, member: CopyMember, *, ckpt: Checkpoint, rule: LoaderRule | None, options: _Options
) -> Decision:
    """One copy: applied, left with a reason, or applied under --all-equal with its consequence."""
    reason = STAYS if member.stays else _reason(member, ckpt, options)
    consequence = ""
    if (
        not reason
        and rule is not None
        and member.relation == "equal"
        and not rule.accepts(group.kept, member.name)
    ):
        if options.all_equal:
            consequence = rule.consequence_for(member.name)
        else:
            reason = rule.left_because(group.kept, member.name)
    return Decision(
        kept=group.kept,
        dropped=member.name,
        relation=member.relation,
        transposed=member.transposed,
        nbytes=member.nbytes,
        applied=not reason,
        reason=reason,
        consequence=consequence,
    )


STAYS = "its storage also holds tensors that stay, and a storage is written whole: re-tying it saves nothing"
"""Why a copy inside a storage other names keep is left (``CopyMember.stays``)."""


def _saving(decisions: list[Decision], use: StorageUse) -> list[Decision]:
    """The decisions with every applied copy that frees no storage left (``STAYS``): its storage is
    also viewed by a name the plan keeps (a copy left for another reason, a name of no copy)."""
    droppable = use.droppable(d.dropped for d in decisions if d.applied)
    return [
        dataclasses.replace(d, applied=False, reason=STAYS, consequence="")
        if d.applied and d.dropped not in droppable
        else d
        for d in decisions
    ]


def _companions(opened: OpenCheckpoint, rule: LoaderRule | None, decisions: list[Decision]) -> list[Decision]:
    """Pairs the config flag set by this plan ties too, stored as equal bytes: re-tied with the rest."""
    if rule is None or not rule.class_pairs:
        return []
    applied = [d for d in decisions if d.applied]
    retied = {frozenset((d.kept, d.dropped)) for d in applied if d.relation == "equal"}
    found = flag_companions(opened, rule, retied=retied, dropped={d.dropped for d in applied})
    return [
        Decision(
            kept=source,
            dropped=target,
            relation="equal",
            transposed=False,
            nbytes=opened.checkpoint.tensor(target).nbytes,
            applied=True,
            why=f"the model class ties it to {source} once tie_word_embeddings is set, "
            "and the stored bytes are equal",
        )
        for target, source in found
    ]


def make_plan(
    graph: AliasGraph,
    opened: OpenCheckpoint,
    *,
    relations: frozenset[str] | None = None,
    keep: str | None = None,
    min_bytes: int = DEFAULT_MIN_BYTES,
    all_equal: bool = False,
) -> RetiePlan:
    """Decide, for every copy in the checkpoint, whether and how it becomes a tie again.

    all_equal: re-tie equal copies the format's loader does not restore by itself too (each such
    decision carries the consequence).
    """
    ckpt = graph.checkpoint
    chosen = DEFAULT_RELATIONS[ckpt.format] if relations is None else relations
    if all_equal and "equal" not in chosen:
        raise UsageError("--all-equal re-ties equal copies, but --relations leaves equal out")
    rule = loader_rule(ckpt)
    class_sources = frozenset(source for _, source in rule.class_pairs) if rule else frozenset()
    sources = frozenset(s.tie.kept for s in graph.ties) | class_sources
    groups = find_copies(opened, ALL_RELATIONS, min_bytes, lookup_names=lookup_tables(ckpt), sources=sources)
    groups += declared_copy_groups(graph, opened, frozenset(name for group in groups for name in group.names))
    if keep is not None:
        if not any(keep in g.names for g in groups):
            raise UsageError(f"--keep {keep}: no copy group holds that name")
        groups = [_rekeep(g, keep, ckpt) if keep in g.names else g for g in groups]
    groups = settle(ckpt, groups)  # both searches' groups together, and kept names --keep moved
    options = _Options(frozenset(chosen), relations is not None, all_equal)
    decisions = [
        _decide(group, member, ckpt=ckpt, rule=rule, options=options)
        for group in groups
        for member in group.members
    ]
    use = StorageUse(ckpt)
    decisions = _saving(decisions, use)  # before the companions: they follow the pairs re-tied
    decisions = _saving(decisions + _companions(opened, rule, decisions), use)
    equal = [(d.kept, d.dropped) for d in decisions if d.applied and d.relation == "equal"]
    edits = optimizer_edits(opened, equal, keep=keep)
    renamed = renamed_states(ckpt.training, edits) if ckpt.training and edits else {}
    discarded = [name for name, new in renamed.items() if new is None]
    return RetiePlan(
        path=ckpt.path,
        format=ckpt.format,
        relations=frozenset(chosen),
        decisions=tuple(decisions),
        saved_bytes=use.saved([*(d.dropped for d in decisions if d.applied), *discarded]),
        all_equal=all_equal,
        optimizer_edits=edits,
        renamed=renamed,
    )
