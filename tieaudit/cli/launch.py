"""The ``tieaudit`` process: SIGINT and SIGTERM guarded before anything is imported, then the
command line. A signal at any moment, start-up included, ends the run with one line and exit 130
(SIGINT) or 143 (SIGTERM), once the run's ``finally`` clauses have removed what it made; no
traceback, however many signals follow (``core.interrupts``)."""

from __future__ import annotations

import sys

from tieaudit.core.interrupts import Interrupted, exit_status, guard_process, interrupted_line


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (and ``python -m tieaudit``); argv: sys.argv[1:] when None."""
    guard = guard_process()
    try:
        from tieaudit.cli.main import main as run  # click, rich and the commands: after the guard

        code = run(argv)
    except Interrupted as exc:  # raised outside the command (while importing it): mapped here
        sys.stderr.write(interrupted_line(exc.signum) + "\n")
        code = exit_status(exc.signum)
    guard.hold()
    return code
