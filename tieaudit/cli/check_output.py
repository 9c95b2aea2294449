"""Where `check` puts what it found: the report (stdout or -o), errors and notes, the closing line."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from tieaudit.cli.common import (
    F,
    beside_errors,
    echo_error,
    echo_note,
    report_width,
    use_color,
    write_output,
)
from tieaudit.core.errors import TieauditError

if TYPE_CHECKING:
    from tieaudit.core.choices import CheckFormat
    from tieaudit.gate.check import CheckResult

WRITTEN = "tieaudit.check.report_written"
"""Context meta key: the run's own report is out, so a later failure (writing the baseline) must
not replace it with a report of the failure."""


def show_check(
    result: CheckResult,
    fmt: CheckFormat,
    output: str | None,
    *,
    quiet: bool,
    show_files: bool,
    reports: Sequence[tuple[CheckFormat, str]] = (),
) -> None:
    """Write the report when due (and each --report FORMAT=FILE), one line per error (and per
    skipped pointer, unless quiet), then the closing line on stderr whatever the format and wherever
    the report went."""
    from tieaudit.report import check_report_due, closing_line, render_check

    for extra, path in reports:
        if check_report_due(result, extra):
            text = render_check(result, extra, show_files=show_files, quiet=quiet, width=report_width(path))
            write_output(text, path)
    if check_report_due(result, fmt):
        report = render_check(
            result,
            fmt,
            color=use_color(output),
            show_files=show_files,
            quiet=quiet,
            width=report_width(output),
            errors=not beside_errors(output),  # each error once: stderr shows it beside the report
        )
        write_output(report, output)
        click.get_current_context().meta[WRITTEN] = True
    if not quiet:
        from tieaudit.formats.hf_cache import cache_note

        for argument, snapshot in result.from_cache:
            echo_note(cache_note(argument, snapshot))
    for error in result.errors:
        echo_error(f"{error.path}: {error.message}")
    if not quiet:
        for pointer in result.skipped_pointers:
            echo_note(f"note: {pointer.path}: {pointer.message} (skipped: --skip-lfs-pointers)")
    line = closing_line(result, quiet=quiet)
    if line is not None:
        click.echo(line, err=True)


def report_failures(command: F) -> F:
    """A check that stops before it has a result (nothing scanned, a bad policy or baseline file)
    still writes its sarif, markdown or github report, saying why, before the error line: a CI step
    reading that report (upload-sarif, the job summary) then fails on the reason, not on a missing
    file. The first error is the one reported; a report that cannot be written adds nothing to it."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TieauditError as exc:
            from tieaudit.report import render_check_failure

            context = click.get_current_context(silent=True)
            if context is not None and context.meta.get(WRITTEN):
                raise
            for fmt, output in [*kwargs.get("reports", ()), (kwargs["fmt"], kwargs["output"])]:
                text = render_check_failure(str(exc), fmt)
                if text is not None:
                    try:
                        write_output(text, output)
                    except (TieauditError, OSError):
                        pass
            raise

    return wrapper  # type: ignore[return-value]
