"""The Finding record, the Rule that makes findings, and what every rule reads (``Audited``).

Rules are declared in their family modules (``copies``, ``declared``, ``vocab``, ``overlap``,
``expected``, ``runtime_duplicate``, ``waste``, ...), each from its record in ``texts``, and
collected by ``registry``: the ids SARIF publishes, ``--ignore`` accepts and the docs list are
exactly the rules some code emits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.shell import Advice
from tieaudit.graph.alias import AliasGraph
from tieaudit.graph.detect import CopyGroup

if TYPE_CHECKING:
    from tieaudit.rules.policy import Policy
    from tieaudit.rules.text_record import RuleText

Severity = Literal["error", "warning", "note"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "note")
"""Most severe first."""
SEVERITY_RANK: dict[str, int] = {"note": 0, "warning": 1, "error": 2}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem, with what it costs and how to fix it (made by ``Rule.finding``)."""

    rule: str
    """Rule id (TIE001...)."""
    kind: str
    """The rule's slug (untied-copy...)."""
    severity: Severity
    """error, warning or note (policy may change the rule default)."""
    names: tuple[str, ...]
    """Tensor names involved, as stored."""
    message: str
    """What is wrong, in one or two sentences."""
    relation: str | None = None
    """equal, transposed or cast for copies; None where not a copy."""
    wasted_bytes: int = 0
    """Bytes a fix would save."""
    fix: Advice | None = None
    """The command or change that fixes it: text and commands kept as argv (``core.shell``), so that
    what is shown runs exactly that command whatever the files are called."""
    details: Mapping[str, object] = field(default_factory=dict)
    """Extra measured facts (max_abs_diff, differing_fraction, ...)."""


def most_severe_first(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Errors, then warnings, then notes; by rule id within a severity (stable otherwise)."""
    return tuple(sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], f.rule)))


@dataclass(frozen=True, kw_only=True)
class Audited:
    """What a rule reads: one checkpoint's alias graph, its bytes, the policy and its copies."""

    graph: AliasGraph
    """Storages, alias groups and declared ties (metadata only)."""
    opened: OpenCheckpoint
    """The open checkpoint, for rules that compare bytes."""
    policy: Policy
    """Relations, size threshold, expected ties and caps the rules apply."""
    copies: tuple[CopyGroup, ...]
    """Every verified copy group (the copy search's, then declared pairs stored as equal copies)."""
    measured: tuple[Finding, ...] = ()
    """Findings the runtime stage measured (TIE005: ONNX Runtime's own copies)."""
    found: tuple[Finding, ...] = ()
    """For rules over findings (``Rule.over_findings``): every other rule's, policy applied."""


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One check tieaudit makes: its public record (id, kind, default severity and the texts that
    explain it, ``texts``) and the function that finds its violations."""

    text: RuleText
    """What a person is told about the rule (``texts.RULE_TEXTS``, where each is defined once)."""
    check: Callable[[Audited], Iterable[Finding]] = field(repr=False, compare=False)
    """The findings of this rule for one audited checkpoint."""
    over_findings: bool = False
    """Runs after every other rule, on their findings (``Audited.found``)."""

    @property
    def id(self) -> str:
        """Stable id, e.g. TIE001 (SARIF, baselines and --ignore rely on it)."""
        return self.text.id

    @property
    def kind(self) -> str:
        """Short slug, e.g. untied-copy."""
        return self.text.kind

    @property
    def severity(self) -> Severity:
        """Default severity."""
        return self.text.severity

    @property
    def summary(self) -> str:
        """One sentence a person understands at once."""
        return self.text.summary

    def finding(
        self,
        names: Iterable[str],
        message: str,
        *,
        severity: Severity | None = None,
        relation: str | None = None,
        wasted_bytes: int = 0,
        fix: Advice | str | None = None,
        details: Mapping[str, object] | None = None,
    ) -> Finding:
        """A finding of this rule (at its default severity unless given). A fix given as text is
        prose (Advice refuses a tieaudit command written into it: commands are ``core.shell.Command``)."""
        return Finding(
            rule=self.id,
            kind=self.kind,
            severity=severity or self.severity,
            names=tuple(names),
            message=message,
            relation=relation,
            wasted_bytes=wasted_bytes,
            fix=Advice((fix,)) if isinstance(fix, str) else fix,
            details=details or {},
        )
