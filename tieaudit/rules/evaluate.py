"""Rules: turn the alias graph, the verified copies and the declared ties into Findings."""

from __future__ import annotations

import os
from collections.abc import Iterator

from tieaudit.core.components import Components
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.core.units import human_bytes
from tieaudit.formats.capabilities import DEFAULT_RELATIONS, REPRESENTABLE
from tieaudit.formats.layer_names import layer_template
from tieaudit.formats.loaders import loader_rule
from tieaudit.graph.alias import AliasGraph, TieState
from tieaudit.graph.compare import BlockComparer, difference, equal_bytes
from tieaudit.graph.declared_copies import declared_copy_groups
from tieaudit.graph.detect import CopyGroup, find_copies, lookup_tables
from tieaudit.rules.policy import Policy
from tieaudit.rules.registry import Finding
from tieaudit.rules.vocab import vocab_findings


def _fix(ckpt: Checkpoint, relations: set[str]) -> str:
    """The retie command for these copies, with --relations only where the format needs it."""
    missing = sorted(relations - REPRESENTABLE[ckpt.format])
    if missing:
        return (
            f"a {ckpt.format} file cannot record a {' or '.join(missing)} copy; "
            "derive it from the wider tensor on load"
        )
    trimmed = ckpt.path.rstrip("/") or ckpt.path
    stem, ext = os.path.splitext(os.path.basename(trimmed))
    out = os.path.join(os.path.dirname(trimmed), f"{stem}-retied{ext}")
    extra = sorted(relations - DEFAULT_RELATIONS[ckpt.format])
    option = (
        f" --relations {','.join(sorted(set(DEFAULT_RELATIONS[ckpt.format]) | set(extra)))}" if extra else ""
    )
    return f"tieaudit retie {ckpt.path} {out}{option}"


_WHAT = {"equal": "the same bytes as", "transposed": "the transpose of", "cast": "a lower-precision cast of"}


def group_relation(group: CopyGroup) -> str:
    """The group's relation: the members' one when they agree, else ``mixed`` (details say each)."""
    relations = {m.relation for m in group.members}
    return relations.pop() if len(relations) == 1 else "mixed"


def _by_construction(component: dict[str, int] | None, group: CopyGroup) -> bool:
    """Whether the model class is known (component: its tie components) and ties no two names of
    the group: equal by construction (deterministic initialisation, fixed tables), not a lost tie."""
    if component is None:
        return False
    found = [component[name] for name in group.names if name in component]
    return len(found) == len(set(found))


def copy_findings(
    ckpt: Checkpoint, groups: list[CopyGroup], declared: set[frozenset[str]]
) -> Iterator[Finding]:
    """TIE001: one finding per copy group; its wasted bytes count every stored copy once. A group
    the known model class does not tie is a note: equal by construction, and retie leaves it."""
    class_ties = ckpt.config.class_ties if ckpt.config is not None else None
    component = Components(class_ties).numbered() if class_ties is not None else None
    templates = ckpt.config.layer_templates if ckpt.config is not None else None
    rule = loader_rule(ckpt) if groups else None  # retie's default, to say when it needs --all-equal
    for group in groups:
        relation = group_relation(group)
        parts = []
        for kind in ("equal", "transposed", "cast"):
            copies = [m.name for m in group.members if m.relation == kind]
            if copies:
                verb = "holds" if len(copies) == 1 else "hold"
                parts.append(f"{', '.join(copies)} {verb} {_WHAT[kind]} {group.kept}")
        by_construction = _by_construction(component, group) or (
            templates is not None and not any(layer_template(n) in templates for n in group.names)
        )
        if by_construction:
            architecture = ckpt.config.architectures[0] if ckpt.config and ckpt.config.architectures else "?"
            note = (
                f" The model class {architecture} does not tie them: equal by construction (deterministic "
                "initialisation, fixed tables), not a lost tie. retie leaves them; with --all-equal it "
                "drops all but one, which from_pretrained would then initialise randomly."
            )
        elif any(frozenset((a, b)) in declared for a in group.names for b in group.names):
            note = " The config declares them tied, but they are stored as separate tensors."
        else:
            note = ""
        fix = _fix(ckpt, {m.relation for m in group.members})
        restored = rule is None or any(rule.accepts(a, b) for a in group.names for b in group.names if a != b)
        if fix.startswith("tieaudit retie") and not restored:
            locked = rule.flag_locked if rule is not None else ""
            fix = f"keep them: {locked}" if locked else fix + " --all-equal"
        yield Finding(
            "TIE001",
            "note" if by_construction else "warning",
            group.names,
            f"{'; '.join(parts)} in separate storage ({human_bytes(group.wasted_bytes)} wasted): "
            f"values that are equal are not a tie; each copy trains and loads as its own parameter." + note,
            relation=relation,
            wasted_bytes=group.wasted_bytes,
            fix=fix,
            details={"kept": group.kept, "relations": {m.name: m.relation for m in group.members}},
        )


def _tie_where(state: TieState) -> str:
    return f"{state.tie.where} ties {state.tie.target} to {state.tie.source}"


def declared_findings(graph: AliasGraph, grouped: list[frozenset[str]]) -> Iterator[Finding]:
    """TIE002 (stored separately, values differ) and TIE003 (only the target stored); a declared
    pair stored as an equal copy is in a copy group (grouped), reported as that group's TIE001."""
    ckpt = graph.checkpoint
    comparer = BlockComparer()
    seen: set[tuple[str, str]] = set()
    for state in graph.ties:
        pair = (state.tie.target, state.tie.source)
        if pair in seen:
            continue
        seen.add(pair)
        if state.target_stored and not state.source_stored:
            yield Finding(
                "TIE003",
                "error",
                (state.tie.target, state.tie.source),
                f"{_tie_where(state)}, but only {state.tie.target} is stored. Loaders disagree on this "
                f"layout: transformers 4.57 leaves both on the meta device, 5.x swaps source and target.",
                fix=f"store the matrix under {state.tie.source} (and drop {state.tie.target})",
            )
            continue
        if not (state.target_stored and state.source_stored) or state.shared_storage:
            continue
        if any(set(pair) <= group for group in grouped):
            continue  # one copy group holds both: reported once, as that group's TIE001
        target, source = ckpt.tensor(state.tie.target), ckpt.tensor(state.tie.source)
        yield from _compare_declared(ckpt, state, target, source, comparer)


def _compare_declared(
    ckpt: Checkpoint, state: TieState, target: TensorInfo, source: TensorInfo, comparer: BlockComparer
) -> Iterator[Finding]:
    names = (target.name, source.name)
    if target.shape != source.shape or target.dtype != source.dtype:
        yield Finding(
            "TIE002",
            "error",
            names,
            f"{_tie_where(state)}, but they differ in shape or dtype "
            f"({target.dtype}{list(target.shape)} vs {source.dtype}{list(source.shape)}).",
            details={"target_shape": list(target.shape), "source_shape": list(source.shape)},
        )
        return
    if equal_bytes(ckpt, source, target, comparer):
        return  # an equal pair is in a copy group (declared_copies): reported as its TIE001
    max_abs, fraction = difference(ckpt, target, source)
    yield Finding(
        "TIE002",
        "error",
        names,
        f"{_tie_where(state)}, but both are stored and their values differ (max abs difference "
        f"{max_abs:.3g}, {fraction:.1%} of elements)."
        + (
            f" transformers 4.57 silently re-ties and discards the stored {target.name};"
            " 5.x keeps both untied."
            if state.tie.declared_by == "config"
            else ""
        ),
        fix=f"decide which matrix is right: untie in the config, or store only {source.name}",
        details={"max_abs_diff": max_abs, "differing_fraction": fraction},
    )


def overlap_findings(graph: AliasGraph) -> Iterator[Finding]:
    """TIE006: views of one storage that overlap without being identical or transposed."""
    for group in graph.groups:
        pairs = [p for p in group.pairs if p.relation == "overlapping"]
        if pairs:
            names = tuple(dict.fromkeys(n for p in pairs for n in (p.first, p.second)))
            yield Finding(
                "TIE006",
                "warning",
                names,
                f"{', '.join(names)} share storage {group.storage_id} with partially overlapping views: "
                f"writing one silently changes part of the other.",
            )


def _missing_because(tie_target: str, tie_source: str, target: str | None, source: str | None) -> str:
    if target is not None and source is not None:
        return "both are stored in separate storage"
    if source is None:
        return f"{tie_source} is not stored"
    return f"{tie_target} is not stored and nothing in the files declares it tied"


def expected_findings(graph: AliasGraph, policy: Policy) -> Iterator[Finding]:
    """TIE008: a tie the policy requires is neither one storage nor a declared, loader-restored tie."""
    ckpt = graph.checkpoint
    storage_of = {t.name: t.storage_id for t in ckpt.tensors}
    restored = {
        (s.tie.target, s.tie.source)
        for s in graph.ties
        if s.tie.declared_by != "policy" and s.source_stored and not s.target_stored
    }
    for tie in policy.expected_ties:
        target, source = storage_of.get(tie.target), storage_of.get(tie.source)
        if (target is not None and target == source) or (tie.target, tie.source) in restored:
            continue
        yield Finding(
            "TIE008",
            "error",
            (tie.target, tie.source),
            f"the policy ({tie.where}) requires {tie.target} tied to {tie.source}, but "
            f"{_missing_because(tie.target, tie.source, target, source)}.",
            fix=f"tieaudit retie {ckpt.path} OUT" if target and source else None,
        )


def evaluate(graph: AliasGraph, policy: Policy, extra: tuple[Finding, ...] = ()) -> tuple[Finding, ...]:
    """Every finding of every rule (plus extra ones found elsewhere, e.g. TIE005 from ONNX Runtime),
    with policy severities and ignores applied, most severe first."""
    ckpt = graph.checkpoint
    sources = frozenset(s.tie.source for s in graph.ties)
    groups = find_copies(
        ckpt, policy.relations, policy.min_bytes, lookup_names=lookup_tables(ckpt), sources=sources
    )
    groups += declared_copy_groups(graph, frozenset(n for g in groups for n in g.names))
    grouped = [frozenset(g.names) for g in groups]
    declared = {frozenset((s.tie.target, s.tie.source)) for s in graph.ties}
    found = [
        *copy_findings(ckpt, groups, declared),
        *declared_findings(graph, grouped),
        *vocab_findings(graph, groups),
        *overlap_findings(graph),
        *expected_findings(graph, policy),
        *extra,
    ]
    result = []
    for finding in found:
        if finding.rule in policy.ignore:
            continue
        severity = policy.severity.get(finding.rule, finding.severity)
        result.append(
            Finding(
                finding.rule,
                severity,
                finding.names,
                finding.message,
                finding.relation,
                finding.wasted_bytes,
                finding.fix,
                finding.details,
            )
        )
    rank = {"error": 0, "warning": 1, "note": 2}
    return tuple(sorted(result, key=lambda f: (rank[f.severity], f.rule)))
