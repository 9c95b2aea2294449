"""The CI gate over one or more paths: audits, errors kept per path, one verdict."""

from __future__ import annotations

from dataclasses import dataclass

from tieaudit.audit import Audit, audit_path
from tieaudit.errors import TieauditError
from tieaudit.findings import Severity
from tieaudit.policy import Policy

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2


@dataclass(frozen=True)
class PathError:
    """A path that could not be audited (the run is then incomplete)."""

    path: str
    """The path as given."""
    message: str
    """One line: what is wrong."""


@dataclass(frozen=True)
class CheckResult:
    """Audits of every readable path and errors for the others."""

    audits: tuple[Audit, ...]
    """One per audited path, in the order given."""
    errors: tuple[PathError, ...]
    """Paths that could not be audited."""

    def exit_code(self, fail_on: Severity) -> int:
        """2 when incomplete or nothing was scanned, else 1 when findings reach fail_on, else 0."""
        if self.errors or not self.audits:
            return EXIT_ERROR
        if any(audit.failing(fail_on) for audit in self.audits):
            return EXIT_FINDINGS
        return EXIT_CLEAN


def run_check(paths: list[str], policy: Policy) -> CheckResult:
    """Audit every path; a bad path is recorded, never stops the others."""
    outcomes = [_audit_one(path, policy) for path in paths]
    return CheckResult(
        tuple(o for o in outcomes if isinstance(o, Audit)),
        tuple(o for o in outcomes if isinstance(o, PathError)),
    )


def _audit_one(path: str, policy: Policy) -> Audit | PathError:
    try:
        return audit_path(path, policy)
    except TieauditError as exc:
        return PathError(path, exc.message if exc.path else str(exc))
