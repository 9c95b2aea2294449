"""One audit: read a path, build its alias graph, run the rules."""

from __future__ import annotations

from dataclasses import dataclass

from tieaudit.formats import open_checkpoint
from tieaudit.graph.alias import AliasGraph, build_graph
from tieaudit.rules.policy import Policy
from tieaudit.rules.registry import SEVERITY_RANK, Finding, Severity


@dataclass(frozen=True)
class Audit:
    """The outcome of auditing one path."""

    graph: AliasGraph
    """Storages, alias groups, declared ties."""
    findings: tuple[Finding, ...]
    """Rule violations, most severe first."""

    def summary(self) -> dict[str, int]:
        """Counts and byte totals for the report's summary block."""
        ckpt = self.graph.checkpoint
        stored = self.graph.stored_bytes
        # TIE005 bytes are memory ONNX Runtime adds, not bytes of the files: counted apart.
        wasted = sum(f.wasted_bytes for f in self.findings if f.rule != "TIE005")
        runtime = sum(f.wasted_bytes for f in self.findings if f.rule == "TIE005")
        return {
            "tensors": len(ckpt.tensors),
            "storages": len(ckpt.storages),
            "bytes": stored,
            "unique_bytes": stored - wasted,
            "wasted_bytes": wasted,
            "errors": sum(f.severity == "error" for f in self.findings),
            "warnings": sum(f.severity == "warning" for f in self.findings),
            "notes": sum(f.severity == "note" for f in self.findings),
            **({"runtime_wasted_bytes": runtime} if runtime else {}),
        }

    def failing(self, fail_on: Severity) -> tuple[Finding, ...]:
        """Findings at or above fail_on."""
        return tuple(f for f in self.findings if SEVERITY_RANK[f.severity] >= SEVERITY_RANK[fail_on])


def audit_path(path: str, policy: Policy | None = None) -> Audit:
    """Read path, build its alias graph and run every rule; the files are closed afterwards."""
    from tieaudit.rules.evaluate import evaluate

    policy = policy or Policy()
    checkpoint = open_checkpoint(path)
    try:
        graph = build_graph(checkpoint, policy.expected_ties)
        extra: tuple[Finding, ...] = ()
        if policy.runtime and checkpoint.format == "onnx" and "TIE005" not in policy.ignore:
            from tieaudit.runtime.measure import runtime_findings

            extra = tuple(runtime_findings(path))
        return Audit(graph, evaluate(graph, policy, extra))
    finally:
        checkpoint.close()
