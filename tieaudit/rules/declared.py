"""TIE002 declared-tie-broken and TIE003 declared-tie-orphan: what config, metadata, the index or
the policy declare tied, against what the files store."""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.records import TensorInfo
from tieaudit.graph.alias import TieState
from tieaudit.graph.compare import BlockComparer, difference, equal_bytes
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.gguf_head import missing_head_findings
from tieaudit.rules.texts import TIE002, TIE003


def _tie_where(state: TieState) -> str:
    return f"{state.tie.where} ties {state.tie.dropped} to {state.tie.kept}"


def _unique_ties(audited: Audited) -> Iterator[TieState]:
    """Each declared (target, source) pair once, however many places declare it."""
    seen: set[tuple[str, str]] = set()
    for state in audited.graph.ties:
        pair = (state.tie.dropped, state.tie.kept)
        if pair not in seen:
            seen.add(pair)
            yield state


def _orphaned(state: TieState) -> bool:
    return state.dropped_stored and not state.kept_stored


def orphan_findings(audited: Audited) -> Iterator[Finding]:
    """TIE003: a declared tie whose target alone is stored; a GGUF head its loader needs, missing."""
    yield from missing_head_findings(audited, ORPHAN)
    for state in filter(_orphaned, _unique_ties(audited)):
        yield ORPHAN.finding(
            (state.tie.dropped, state.tie.kept),
            f"{_tie_where(state)}, but only {state.tie.dropped} is stored. Loaders disagree on this "
            f"layout: transformers 4.57 leaves both on the meta device, 5.x swaps source and target.",
            fix=f"store the matrix under {state.tie.kept} (and drop {state.tie.dropped})",
        )


def broken_findings(audited: Audited) -> Iterator[Finding]:
    """TIE002: a declared pair stored separately whose values differ; a declared pair stored as an
    equal copy is in a copy group, reported as that group's TIE001."""
    ckpt = audited.graph.checkpoint
    grouped = [frozenset(g.names) for g in audited.copies]
    comparer = BlockComparer()
    for state in _unique_ties(audited):
        if not (state.dropped_stored and state.kept_stored) or state.shared_storage:
            continue
        if any({state.tie.dropped, state.tie.kept} <= group for group in grouped):
            continue  # one copy group holds both: reported once, as that group's TIE001
        target, source = ckpt.tensor(state.tie.dropped), ckpt.tensor(state.tie.kept)
        yield from _compare_declared(audited.opened, state, target, source=source, comparer=comparer)


def _compare_declared(
    opened: OpenCheckpoint,
    state: TieState,
    target: TensorInfo,
    *,
    source: TensorInfo,
    comparer: BlockComparer,
) -> Iterator[Finding]:
    names = (target.name, source.name)
    if target.shape != source.shape or target.dtype != source.dtype:
        yield BROKEN.finding(
            names,
            f"{_tie_where(state)}, but they differ in shape or dtype "
            f"({target.dtype}{list(target.shape)} vs {source.dtype}{list(source.shape)}).",
            details={"target_shape": list(target.shape), "source_shape": list(source.shape)},
        )
        return
    if equal_bytes(opened, source, target, comparer=comparer):
        return  # an equal pair is in a copy group (declared_copies): reported as its TIE001
    max_abs, fraction = difference(opened, target, source)
    yield BROKEN.finding(
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


BROKEN = Rule(text=TIE002, check=broken_findings)
ORPHAN = Rule(text=TIE003, check=orphan_findings)
