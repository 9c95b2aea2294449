"""Every rule tieaudit emits, collected from the family modules, and ``evaluate``, which runs them.

``RULES`` is the one list: SARIF's ``driver.rules``, ``--ignore``, the policy's ``[severity]`` table
and docs/rules.md all come from (or are tested against) it, so a rule that no code emits cannot be
published. Each rule's public text is its record in ``texts`` (tests/test_rule_docs.py holds the two
to the same ids). Ids are added, never renumbered.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.graph.alias import AliasGraph
from tieaudit.graph.declared_copies import declared_copy_groups
from tieaudit.graph.detect import find_copies, lookup_tables, settle
from tieaudit.rules.across import CROSS_FILE
from tieaudit.rules.adapter import ADAPTER_UNTIES
from tieaudit.rules.copies import UNTIED_COPY
from tieaudit.rules.declared import BROKEN, ORPHAN
from tieaudit.rules.expected import EXPECTED_MISSING
from tieaudit.rules.finding import Audited, Finding, Rule, most_severe_first
from tieaudit.rules.optimizer import SPLIT
from tieaudit.rules.overlap import OVERLAPPING
from tieaudit.rules.pickle_code import RUNS_CODE, UNKNOWN_GLOBAL
from tieaudit.rules.runtime_duplicate import RUNTIME_DUPLICATE
from tieaudit.rules.vocab import VOCAB_MISALIGNED
from tieaudit.rules.waste import WASTED_BYTES_CAP

if TYPE_CHECKING:
    from tieaudit.rules.policy import Policy

RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in sorted(
        (
            UNTIED_COPY,
            BROKEN,
            ORPHAN,
            VOCAB_MISALIGNED,
            RUNTIME_DUPLICATE,
            OVERLAPPING,
            SPLIT,
            EXPECTED_MISSING,
            WASTED_BYTES_CAP,
            RUNS_CODE,
            UNKNOWN_GLOBAL,
            CROSS_FILE,
            ADAPTER_UNTIES,
        ),
        key=lambda rule: rule.id,
    )
}
"""Every emitted rule by id, in id order."""


def _applied(findings: list[Finding], policy: Policy) -> list[Finding]:
    """The policy's ignores dropped and its severities set."""
    return [
        dataclasses.replace(f, severity=policy.severity.get(f.rule, f.severity))
        for f in findings
        if f.rule not in policy.ignore
    ]


def evaluate(
    graph: AliasGraph, opened: OpenCheckpoint, policy: Policy, *, measured: tuple[Finding, ...] = ()
) -> tuple[Finding, ...]:
    """Every finding of every rule for one checkpoint (measured: TIE005 from the runtime stage),
    with the policy's severities and ignores applied, most severe first."""
    ckpt = graph.checkpoint
    sources = frozenset(s.tie.kept for s in graph.ties)
    groups = find_copies(
        opened, policy.relations, policy.min_bytes, lookup_names=lookup_tables(ckpt), sources=sources
    )
    groups += declared_copy_groups(graph, opened, frozenset(n for g in groups for n in g.names))
    groups = settle(ckpt, groups)  # a storage may hold members of both kinds of group
    audited = Audited(graph=graph, opened=opened, policy=policy, copies=tuple(groups), measured=measured)
    found = _applied([f for r in RULES.values() if not r.over_findings for f in r.check(audited)], policy)
    after = dataclasses.replace(audited, found=tuple(found))
    found += _applied([f for r in RULES.values() if r.over_findings for f in r.check(after)], policy)
    return most_severe_first(found)
