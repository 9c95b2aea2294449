"""Rule ids (stable: SARIF, baselines and --ignore rely on them) and the Finding record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["error", "warning", "note"]
SEVERITY_RANK: dict[str, int] = {"note": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class Rule:
    """One check tieaudit makes."""

    id: str
    """Stable id, e.g. TIE001."""
    kind: str
    """Short slug, e.g. untied-copy."""
    severity: Severity
    """Default severity."""
    summary: str
    """One sentence a person understands at once."""


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "TIE001", "untied-copy", "warning", "Two or more matrices hold equal values in separate storage."
        ),
        Rule(
            "TIE002",
            "declared-tie-broken",
            "error",
            "A tie is declared, both names are stored, and their values differ.",
        ),
        Rule(
            "TIE003",
            "declared-tie-orphan",
            "error",
            "A tie is declared but only its target is stored; loaders disagree on this layout.",
        ),
        Rule(
            "TIE004",
            "vocab-misaligned",
            "error",
            "Embedding rows, output rows, output bias and declared vocabulary size disagree.",
        ),
        Rule(
            "TIE005",
            "runtime-duplicate",
            "warning",
            "ONNX Runtime materialises another copy of a shared initializer.",
        ),
        Rule(
            "TIE006",
            "overlapping-views",
            "warning",
            "Names share a storage with partially overlapping, non-identical views.",
        ),
        Rule(
            "TIE007",
            "optimizer-state-split",
            "warning",
            "Optimizer state is kept separately for what is one tied parameter, or for a copy.",
        ),
        Rule(
            "TIE008",
            "expected-tie-missing",
            "error",
            "The policy requires a tie that the checkpoint does not have.",
        ),
        Rule(
            "TIE009",
            "wasted-bytes-cap",
            "error",
            "The bytes a checkpoint wastes on copies exceed the policy's max-wasted-bytes.",
        ),
    )
}


@dataclass(frozen=True)
class Finding:
    """One problem, with what it costs and how to fix it."""

    rule: str
    """Rule id (TIE001...)."""
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
    fix: str | None = None
    """The command or change that fixes it."""
    details: Mapping[str, object] = field(default_factory=dict)
    """Extra measured facts (max_abs_diff, differing_fraction, ...)."""

    @property
    def kind(self) -> str:
        """The rule's slug."""
        return RULES[self.rule].kind
