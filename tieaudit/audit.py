"""One audit: read a path, build its alias graph, run the rules; the library's entry point."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass

from tieaudit.formats import open_checkpoint
from tieaudit.graph.alias import AliasGraph, build_graph
from tieaudit.rules.finding import SEVERITY_RANK, Finding, Severity
from tieaudit.rules.policy import Policy
from tieaudit.rules.registry import evaluate
from tieaudit.rules.waste import file_wasted_bytes


@dataclass(frozen=True, kw_only=True)
class AuditSummary:
    """Counts and byte totals for the report's summary block."""

    tensors: int
    """Stored tensors."""
    storages: int
    """Storages (a tied pair shares one)."""
    bytes: int
    """Bytes of every storage, each counted once."""
    unique_bytes: int
    """bytes less wasted_bytes: what the checkpoint holds once its copies are re-tied."""
    wasted_bytes: int
    """Bytes the files spend on copies (TIE005's runtime memory is not in the files)."""
    errors: int
    """Findings at severity error."""
    warnings: int
    """Findings at severity warning."""
    notes: int
    """Findings at severity note."""
    runtime_wasted_bytes: int = 0
    """Memory ONNX Runtime adds on top of the files (TIE005), when measured."""

    def as_dict(self) -> dict[str, int]:
        """The JSON summary block (runtime_wasted_bytes only when there is some)."""
        fields = asdict(self)
        if not self.runtime_wasted_bytes:
            del fields["runtime_wasted_bytes"]
        return fields


@dataclass(frozen=True)
class Audit:
    """The outcome of auditing one path: metadata and findings only (no open file; pickles)."""

    graph: AliasGraph
    """Storages, alias groups, declared ties."""
    findings: tuple[Finding, ...]
    """Rule violations, most severe first."""

    def summary(self) -> AuditSummary:
        """Counts and byte totals for the report's summary block."""
        ckpt = self.graph.checkpoint
        stored = self.graph.stored_bytes
        wasted = file_wasted_bytes(self.findings)
        return AuditSummary(
            tensors=len(ckpt.tensors),
            storages=len(ckpt.storages),
            bytes=stored,
            unique_bytes=stored - wasted,
            wasted_bytes=wasted,
            errors=sum(f.severity == "error" for f in self.findings),
            warnings=sum(f.severity == "warning" for f in self.findings),
            notes=sum(f.severity == "note" for f in self.findings),
            runtime_wasted_bytes=sum(f.wasted_bytes for f in self.findings if f.rule == "TIE005"),
        )

    def failing(self, fail_on: Severity) -> tuple[Finding, ...]:
        """Findings at or above fail_on."""
        return tuple(f for f in self.findings if SEVERITY_RANK[f.severity] >= SEVERITY_RANK[fail_on])

    def as_given(self, read: str, given: str) -> Audit:
        """This audit with every fix command's operand naming read (the folder the Hugging Face
        cache resolved a repository id to) naming given (the id as typed, ``org/name[@revision]``)
        instead: the commands accept the id, and it runs as printed wherever the cache is. Files
        inside the folder, the output operand and the checkpoint's own path are left as they are."""
        folder = os.path.abspath(read)
        if given == read:
            return self

        def change(operand: str) -> str:
            return given if os.path.abspath(operand) == folder else operand

        findings = tuple(
            dataclasses.replace(f, fix=f.fix.with_paths(change)) if f.fix is not None else f
            for f in self.findings
        )
        return Audit(self.graph, findings)


def audit_path(path: str, policy: Policy | None = None) -> Audit:
    """Read path, build its alias graph and run every rule; the files are closed afterwards."""
    policy = policy or Policy()
    with open_checkpoint(path, bare_pickles=True) as opened:
        graph = build_graph(opened.checkpoint, policy.expected_ties)
        measured: tuple[Finding, ...] = ()
        if policy.runtime and opened.checkpoint.format == "onnx" and "TIE005" not in policy.ignore:
            from tieaudit.runtime.measure import runtime_findings

            measured = tuple(runtime_findings(path))
        return Audit(graph, evaluate(graph, opened, policy, measured=measured))
