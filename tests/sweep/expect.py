"""What tieaudit should answer for one variant, stated in one function (``expected``), and the
comparison of its answers with that.

The expectation is computed from truth only: the live model's ties (truth.Live), what the written
file holds (truth.FileFacts) and how the variant was written (variants.Written). Names are spelled
as the file stores them: on-disk names for Hugging Face folders (transformers' own conversion),
in-memory names for ``torch.save`` and ``save_model`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.sweep.truth import FileFacts, Live, sizes_disagree
from tests.sweep.variants import FOLDER_FORMS, Written

Group = frozenset[str]


@dataclass
class Expected:
    """The right answers for one input, and for retie's output of it."""

    declared: set[tuple[str, str]] | None
    """Declared ties as (target, source) file names; None: compared as groups (``declared_groups``)."""
    declared_groups: list[Group]
    """For save_model files: the names the ``{dropped: kept}`` records join (the live sharing)."""
    alias: list[Group]
    """Names sharing one storage in the file."""
    copies: list[Group]
    """TIE001: one finding per group, names exactly these."""
    wasted: int
    """summary wasted_bytes: every stored copy counted once."""
    broken: list[Group]
    """TIE002 names."""
    vocab_misaligned: bool
    """TIE004 expected."""
    check_exit: int
    """``tieaudit check`` exit code (fail-on warning)."""
    must_tie: list[Group] = field(default_factory=list)
    """Copy groups retie's default turns into one tensor: the class ties them."""
    may_tie: list[Group] = field(default_factory=list)
    """Copy groups the class ties only with its switch on (this variant has it off)."""
    must_leave: list[Group] = field(default_factory=list)
    """Copy groups the class does not tie (equal by construction): retie's default leaves them."""
    orphaned: list[Group] = field(default_factory=list)
    """TIE003: declared ties whose target the file stores and whose source it does not (a layout
    even transformers' own save_pretrained writes for some classes: Deimv2's per-layer heads)."""
    exit_either: bool = False
    """check may exit 0 or 1: the only copies are a bare file's groups its class does not tie,
    notes when tieaudit recognises the class from the names, warnings when it does not."""


def orphans(declared: set[tuple[str, str]] | None, stored: frozenset[str]) -> list[Group]:
    """Declared ties (target, source) whose target is stored and whose source is not."""
    return [frozenset((t, s)) for t, s in sorted(declared or ()) if t in stored and s not in stored]


def declared_after(live: Live, out_ties: dict[str, str]) -> set[tuple[str, str]]:
    """The ties retie's output folder declares: the ties of the class built from the output's
    config.json (retie may turn a switch on for copies it ties), spelled as the file spells them."""
    return _pairs(out_ties, live.disk)


def _pairs(ties: dict[str, str], names: dict[str, str | None] | None) -> set[tuple[str, str]]:
    if names is None:
        return set(ties.items())
    return {(str(names[t]), str(names[s])) for t, s in ties.items() if names.get(t) and names.get(s)}


def _within(group: Group, components: list[Group]) -> bool:
    return any(group <= comp for comp in components)


def expected(live: Live, on_live: Live | None, written: Written, facts: FileFacts) -> Expected:
    """The answers tieaudit must give for this variant (inspect, check) and for its retie output."""
    folder = written.form in FOLDER_FORMS
    names = live.disk if folder else None  # in-memory -> file spelling
    # Declared ties: a folder's config declares the class's live ties, spelled as the file spells
    # them; save_model's metadata records the live sharing; a bare torch.save file declares nothing.
    declared: set[tuple[str, str]] | None = _pairs(live.class_ties, names) if folder else set()
    declared_groups: list[Group] = []
    if written.form == "st-file":
        declared, declared_groups = None, list(live.shared)
    # Copies, from the file's bytes: one TIE001 per group, wasted = every stored copy once. Names
    # the config declares tied and stores apart with equal bytes are a copy whatever their size or
    # content (a zero bias included): the class loads them as one parameter.
    copies = list(facts.copies)
    if folder and live.class_ties:
        copies += _declared_copies(live.components(names), facts, copies)
    wasted = sum((_storages(g, facts) - 1) * _size(g, facts) for g in copies)
    broken = []
    if written.perturbed is not None:
        target, source = written.perturbed
        broken = [frozenset({str(live.disk[target]), str(live.disk[source])})]
    misaligned = sizes_disagree(live.vocab)
    # retie's default: ties what the class ties, leaves what is equal by construction.
    tied_here = live.components(names)
    tied_on = on_live.components(on_live.disk if folder else None) if on_live is not None else []
    must_tie = [g for g in copies if _within(g, tied_here)]
    may_tie = [g for g in copies if g not in must_tie and _within(g, tied_on)]
    must_leave = [g for g in copies if g not in must_tie and g not in may_tie]
    untied = list(must_leave)  # the class ties them under no setting
    if written.form == "pt":  # torch.load restores a view: any equal copy may become one
        may_tie, must_leave = may_tie + must_leave, []
    # A folder's copies its class ties under no setting are equal by construction: TIE001 notes,
    # below check's default --fail-on.
    gating = [g for g in copies if not (folder and g in must_leave)]
    orphaned = orphans(declared, facts.names)
    exit_code = 1 if gating or broken or misaligned or orphaned else 0
    # A bare file (no config.json) names no class: tieaudit recognises it from the tensor names,
    # and then the groups the class ties under no setting are notes too (equal by construction).
    bare_only = not folder and all(g in untied for g in gating)
    either = bool(gating) and bare_only and not (broken or misaligned or orphaned)
    return Expected(
        declared, declared_groups, list(facts.alias), copies, wasted, broken, misaligned, exit_code,
        must_tie, may_tie, must_leave, orphaned, either,
    )  # fmt: skip


def _declared_copies(components: list[Group], facts: FileFacts, found: list[Group]) -> list[Group]:
    """Within each tied component, the stored names holding equal bytes, not already a copy group."""
    out = []
    for comp in components:
        by_digest: dict[str, set[str]] = {}
        for name in comp & facts.names:
            by_digest.setdefault(facts.digests[name], set()).add(name)
        for names in by_digest.values():
            group = frozenset(names)
            if _storages(group, facts) > 1 and not any(group <= g for g in found):
                out.append(group)
    return out


def _storages(group: Group, facts: FileFacts) -> int:
    """How many separate storages hold the group's names (names sharing one count once)."""
    count = len(group)
    for alias in facts.alias:
        shared = len(alias & group)
        count -= max(shared - 1, 0)
    return count


def _size(group: Group, facts: FileFacts) -> int:
    return facts.nbytes[min(group)]


# --- comparing answers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    cause: str
    """Stable key for grouping (declared-ties, TIE001-groups, retie-error, reload-bytes, ...)."""
    detail: str


@dataclass
class Answer:
    """tieaudit's answer for one path, reduced to what is compared."""

    declared: set[tuple[str, str]]
    groups: list[Group]
    findings: list[tuple[str, Group, int]]
    """(rule, names, wasted_bytes)."""
    wasted: int
    unresolved: str = ""
    """tieaudit's own note that config.json's ties are not (all) resolved; empty when they are."""


def answer_of(audit: object) -> Answer:
    graph = audit.graph  # type: ignore[attr-defined]
    declared = {(s.tie.dropped, s.tie.kept) for s in graph.ties}
    groups = [frozenset(g.names) for g in graph.groups]
    findings = [(f.rule, frozenset(f.names), f.wasted_bytes) for f in audit.findings]  # type: ignore[attr-defined]
    notes = [s.reason for s in graph.checkpoint.skipped if s.name.startswith("config.json:")]
    unresolved = next((n for n in notes if "not resolved" in n), "")
    return Answer(declared, groups, findings, audit.summary().wasted_bytes, unresolved)  # type: ignore[attr-defined]


def _show(groups: object) -> str:
    if isinstance(groups, set | list | tuple):
        return "[" + "; ".join(sorted(_show(g) for g in groups)) + "]"
    if isinstance(groups, frozenset):
        return "{" + ", ".join(sorted(groups)) + "}"
    return str(groups)


def components(pairs: set[tuple[str, str]]) -> set[Group]:
    """The groups of names (target, source) pairs join."""
    comps: list[set[str]] = []
    for a, b in pairs:
        joined = [c for c in comps if a in c or b in c]
        merged = {a, b}.union(*joined) if joined else {a, b}
        comps = [c for c in comps if c not in joined] + [merged]
    return {frozenset(c) for c in comps}


def compare_input(exp: Expected, got: Answer, exit_code: int) -> list[Disagreement]:
    """inspect/check of the variant itself."""
    out: list[Disagreement] = []
    if exp.declared is not None and got.declared != exp.declared:
        hint = (
            " (same names, other direction)" if components(got.declared) == components(exp.declared) else ""
        )
        out.append(
            Disagreement(
                "declared-ties",
                f"declared {_show(sorted(got.declared))}, live ties {_show(sorted(exp.declared))}{hint}",
            )
        )
    if exp.declared is None and components(got.declared) != set(exp.declared_groups):
        out.append(
            Disagreement(
                "declared-ties",
                f"metadata ties {_show(components(got.declared))}, live shares {_show(exp.declared_groups)}",
            )
        )
    if set(got.groups) != set(exp.alias):
        out.append(
            Disagreement("alias-groups", f"groups {_show(got.groups)}, file shares {_show(exp.alias)}")
        )
    out += compare_findings(exp.copies, exp.broken, exp.vocab_misaligned, got, "", exp.alias, exp.orphaned)
    if got.wasted != exp.wasted:
        out.append(Disagreement("wasted-bytes", f"wasted_bytes {got.wasted}, copies waste {exp.wasted}"))
    if exit_code != exp.check_exit and not (exp.exit_either and exit_code in (0, 1)):
        out.append(Disagreement("check-exit", f"check exit {exit_code}, expected {exp.check_exit}"))
    return out


def by_storage(groups: list[Group], alias: list[Group]) -> list[Group]:
    """Each group with every name replaced by the first name of its storage: a copy group may
    name a storage by any of the names that share it (a .bin re-tied as views keeps them all)."""
    first = {name: min(shared) for shared in alias for name in shared}
    return sorted((frozenset(first.get(n, n) for n in g) for g in groups), key=sorted)


def compare_findings(
    copies: list[Group], broken: list[Group], misaligned: bool, got: Answer, where: str, alias: list[Group],
    orphaned: list[Group],
) -> list[Disagreement]:  # fmt: skip
    """TIE001 one finding per copy group (compared storage by storage); TIE002 for broken ties;
    TIE003 for orphaned targets; TIE004 as sizes say."""
    out: list[Disagreement] = []
    found: dict[str, list[Group]] = {}
    for rule, names, _ in got.findings:
        found.setdefault(rule, []).append(names)
    tie001 = found.pop("TIE001", [])
    if by_storage(tie001, alias) != by_storage(copies, alias):
        many = [g for g in copies if sum(f <= g for f in tie001) > 1]
        cause = "TIE001-split" if many else "TIE001-groups"
        out.append(Disagreement(where + cause, f"TIE001 on {_show(tie001)}, copies are {_show(copies)}"))
    tie002 = found.pop("TIE002", [])
    if set(tie002) != set(broken):
        out.append(Disagreement(where + "TIE002", f"TIE002 on {_show(tie002)}, broken ties {_show(broken)}"))
    tie003 = found.pop("TIE003", [])
    if set(tie003) != set(orphaned):
        out.append(Disagreement(where + "TIE003", f"TIE003 on {_show(tie003)}, orphaned {_show(orphaned)}"))
    tie004 = found.pop("TIE004", [])
    if bool(tie004) != misaligned:
        detail = f"TIE004 on {_show(tie004)}" if tie004 else "no TIE004"
        out.append(Disagreement(where + "TIE004", f"{detail}; live sizes disagree: {misaligned}"))
    for rule, groups in sorted(found.items()):
        out.append(Disagreement(where + rule, f"{rule} on {_show(groups)}, none expected"))
    return out
