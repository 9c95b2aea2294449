"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` line per finding.

The runner reads a line ``::LEVEL file=PATH,title=TITLE::MESSAGE`` as an annotation on PATH
(actions/runner ``ActionCommand.TryParseV2``): the command ends at the first ``::`` after it,
properties are split at ``,`` and at the first ``=``, and each line is one command. So data is
escaped as the runner unescapes it (``%`` -> ``%25``, CR -> ``%0D``, LF -> ``%0A``; the same as
actions/toolkit's ``escapeData``) and property values additionally (``:`` -> ``%3A``, ``,`` ->
``%2C``; ``escapeProperty``). Text from files is made one printable line first (``printable``),
so a tensor name cannot end the line, add a property, or start a command of its own.

Levels follow the finding's severity (error -> ``error``, warning -> ``warning``, note ->
``notice``). Baselined findings are accepted: they are not annotated (the closing line on stderr
counts them). A path that could not be audited is an ``::error`` on that path.
"""

from __future__ import annotations

import os

from tieaudit.core.escape import printable
from tieaudit.gate.check import CheckResult
from tieaudit.report.sarif import finding_file

LEVELS = {"error": "error", "warning": "warning", "note": "notice"}
"""Workflow command for each severity."""
UNREADABLE_TITLE = "tieaudit: could not audit"


def escape_data(text: str) -> str:
    """A command's message, as the runner unescapes it (``%`` first, so nothing is escaped twice)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value: like data, and ``:`` and ``,``, which end the command or the property."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation_path(path: str, root: str | None = None) -> str:
    """The path as the runner matches it against the repository: relative to root (the current
    folder, the repository's root in a workflow) with ``/``, or absolute when outside it."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, os.path.abspath(root or os.getcwd()))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return absolute
    return relative.replace(os.sep, "/")


def command(level: str, *, file: str, title: str, message: str) -> str:
    """One workflow command line, every value made printable and escaped."""
    properties = f"file={escape_property(printable(file))},title={escape_property(printable(title))}"
    return f"::{level} {properties}::{escape_data(printable(message))}"


def render_github(result: CheckResult, *, quiet: bool = False) -> str:
    """Annotations for every finding no baseline accepts (quiet: of failing checkpoints only), then
    one ``::error`` per path that could not be audited."""
    lines: list[str] = []
    for checked in result.checked:
        if quiet and not checked.failing:
            continue
        for finding, accepted in zip(checked.audit.findings, checked.baselined, strict=True):
            if accepted:
                continue
            message = finding.message + (f" ({finding.fix.label}: {finding.fix})" if finding.fix else "")
            lines.append(
                command(
                    LEVELS[finding.severity],
                    file=annotation_path(finding_file(checked, finding)),
                    title=f"{finding.rule} {finding.kind}",
                    message=message,
                )
            )
    lines.extend(
        command(
            "error",
            file=annotation_path(error.path),
            title=UNREADABLE_TITLE,
            message=f"{error.path}: {error.message}",
        )
        for error in result.errors
    )
    return "".join(line + "\n" for line in lines)


def render_github_failure(message: str) -> str:
    """A run that stopped before auditing anything: one ``::error`` without a file."""
    return f"::error title={escape_property(UNREADABLE_TITLE)}::{escape_data(printable(message))}\n"
