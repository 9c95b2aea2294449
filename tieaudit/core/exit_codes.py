"""The exit codes of every command: one type, as DESIGN.md and the README's "Exit codes" state."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a tieaudit process tells its caller."""

    OK = 0
    """Done: nothing at or above --fail-on (check, runtime), or written and verified (retie, export)."""
    FINDINGS = 1
    """Findings at or above --fail-on (check, runtime)."""
    BAD_INPUT = 2
    """Usage error, or input that is unreadable, unsafe, unsupported or missing; the audit is incomplete."""
    INTERNAL_ERROR = 3
    """A bug in tieaudit (the traceback is printed for a report), never caused by the input alone."""
