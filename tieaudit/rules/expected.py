"""TIE008 expected-tie-missing: a tie the policy requires that the checkpoint does not have."""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.core.shell import advice, tieaudit_command
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE008


def _missing_because(tie_target: str, tie_source: str, target: str | None, *, source: str | None) -> str:
    if target is not None and source is not None:
        return "both are stored in separate storage"
    if source is None:
        return f"{tie_source} is not stored"
    return f"{tie_target} is not stored and nothing in the files declares it tied"


def expected_findings(audited: Audited) -> Iterator[Finding]:
    """TIE008: a tie the policy requires is neither one storage nor a declared, loader-restored tie."""
    graph, policy = audited.graph, audited.policy
    ckpt = graph.checkpoint
    storage_of = {t.name: t.storage_id for t in ckpt.tensors}
    restored = {
        (s.tie.dropped, s.tie.kept)
        for s in graph.ties
        if s.tie.declared_by != "policy" and s.kept_stored and not s.dropped_stored
    }
    for tie in policy.expected_ties:
        target, source = storage_of.get(tie.dropped), storage_of.get(tie.kept)
        if (target is not None and target == source) or (tie.dropped, tie.kept) in restored:
            continue
        yield EXPECTED_MISSING.finding(
            (tie.dropped, tie.kept),
            f"the policy ({tie.where}) requires {tie.dropped} tied to {tie.kept}, but "
            f"{_missing_because(tie.dropped, tie.kept, target, source=source)}.",
            fix=advice(tieaudit_command("retie", ckpt.path, "OUT")) if target and source else None,
        )


EXPECTED_MISSING = Rule(text=TIE008, check=expected_findings)
