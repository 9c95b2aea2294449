"""Report renderers: text (people), json and sarif (machines), dot (Graphviz), markdown (a PR comment or
job summary) and github (workflow-command annotations)."""

from __future__ import annotations

import json
from typing import Any

from tieaudit.audit import Audit
from tieaudit.core.choices import CHECK_FORMATS as CHECK_FORMATS
from tieaudit.core.choices import CheckFormat, InspectFormat
from tieaudit.core.units import human_bytes, plural
from tieaudit.core.version import __version__
from tieaudit.gate.check import Checked, CheckResult
from tieaudit.gate.files import skipped_by_reason
from tieaudit.report.plain import DEFAULT_WIDTH

ALWAYS_WRITTEN: frozenset[CheckFormat] = frozenset({"sarif", "markdown", "github"})
"""Formats written even when no checkpoint could be audited: they feed CI surfaces (code scanning's
upload, the job summary, annotations) that must show why the run failed. text and json are not:
the error lines on stderr are the report, and a JSON consumer keeps 'bad input: nothing written'."""


def render(audit: Audit, fmt: InspectFormat, *, color: bool = False, width: int | None = None) -> str:
    """Render one audit in the named format (text: coloured or not, fitting width columns)."""
    if fmt == "json":
        from tieaudit.report.json_report import render_json

        return render_json(audit)
    if fmt == "dot":
        from tieaudit.report.dot import render_dot

        return render_dot(audit)
    from tieaudit.report.text import render_text

    return render_text(audit, color=color, width=width or DEFAULT_WIDTH)


def _check_report(checked: Checked) -> dict[str, Any]:
    """One checkpoint's tieaudit.report/1 dict, with the gate's fields added."""
    from tieaudit.report.json_report import report_dict

    report = report_dict(checked.audit)
    for entry, fingerprint, accepted in zip(
        report["findings"], checked.fingerprints, checked.baselined, strict=True
    ):
        entry["fingerprint"] = fingerprint
        entry["baselined"] = accepted
    report["fail_on"] = checked.fail_on
    report["status"] = "fail" if checked.failing else "ok"
    return report


def check_dict(result: CheckResult) -> dict[str, Any]:
    """One path's report as is; several paths or a folder as tieaudit.check/1."""
    if result.single and len(result.checked) == 1 and not result.errors:
        report = _check_report(result.checked[0])
        report["files"] = [f.as_dict() for f in result.files]
        return report
    document: dict[str, Any] = {
        "schema": "tieaudit.check/1",
        "tieaudit_version": __version__,
        "reports": [_check_report(c) for c in result.checked],
        "errors": [{"path": e.path, "message": e.message} for e in result.errors],
        "summary": result.summary().as_dict(),
        "files": [f.as_dict() for f in result.files],
    }
    if result.baseline is not None:
        document["baseline"] = result.baseline.path
    return document


def render_check(
    result: CheckResult,
    fmt: CheckFormat,
    *,
    color: bool = False,
    show_files: bool = False,
    quiet: bool = False,
    width: int | None = None,
    errors: bool = True,
) -> str:
    """Render a check run as text, json (report/1 or check/1), sarif, markdown or github; show_files
    adds the list of files and their verdicts to the text (json always has it, as ``files``); quiet
    keeps only failing checkpoints and errors in text, markdown and github (json and sarif are
    records for machines and stay whole); errors=False leaves the ERROR lines out of the text (they
    are on stderr, where the report is shown too)."""
    if fmt == "json":
        return json.dumps(check_dict(result), indent=2) + "\n"
    if fmt == "sarif":
        from tieaudit.report.sarif import render_sarif

        return render_sarif(result)
    if fmt == "markdown":
        from tieaudit.report.markdown import render_markdown

        return render_markdown(result, quiet=quiet)
    if fmt == "github":
        from tieaudit.report.github import render_github

        return render_github(result, quiet=quiet)
    from tieaudit.report.plain import render_check_text, render_files

    width = width or DEFAULT_WIDTH
    text = render_check_text(result, color=color, errors=errors, quiet=quiet, width=width)
    return text + render_files(result.files, width) if show_files else text


def check_report_due(result: CheckResult, fmt: CheckFormat) -> bool:
    """Whether the report is written: always for ALWAYS_WRITTEN, else when something was audited."""
    return bool(result.checked) or fmt in ALWAYS_WRITTEN


def render_check_failure(message: str, fmt: CheckFormat) -> str | None:
    """The report of a run that stopped before auditing anything (nothing scanned, a bad policy or
    baseline file), for the formats that are always written; None for text and json."""
    if fmt == "sarif":
        from tieaudit.report.sarif import render_sarif_failure

        return render_sarif_failure(message)
    if fmt == "markdown":
        from tieaudit.report.markdown import render_markdown_failure

        return render_markdown_failure(message)
    if fmt == "github":
        from tieaudit.report.github import render_github_failure

        return render_github_failure(message)
    return None


def closing_line(result: CheckResult, *, quiet: bool = False) -> str | None:
    """The summary line for stderr, whatever the format and wherever the report goes, so a CI log
    always says why a run failed; None when it would add nothing: a run that audited nothing and
    said so in one line (one error, or one skipped-pointer note), or, quiet, when nothing failed."""
    summary = result.summary()
    if quiet and not (summary.failing or summary.errors):
        return None
    if not result.checked and len(result.errors) + len(result.skipped_pointers) == 1:
        return None
    return check_summary_line(result)


def check_summary_line(result: CheckResult) -> str:
    """The closing line on stderr: checkpoints, failing, errors, baselined, wasted bytes."""
    summary = result.summary()
    parts = [
        plural(summary.checkpoints, "checkpoint"),
        f"{summary.failing} failing",
        plural(summary.errors, "error"),
    ]
    if result.baseline is not None:
        parts.append(plural(summary.baselined, "baselined finding"))
        if summary.stale_baseline_entries:
            parts.append(f"{plural(summary.stale_baseline_entries, 'baseline entry')} no longer found")
    parts.append(f"{human_bytes(summary.wasted_bytes)} wasted")
    line = "tieaudit: " + ", ".join(parts)
    skipped = skipped_by_reason(result.files)
    if skipped:
        total = sum(count for _, count in skipped)
        groups = "; ".join(f"{count} {reason}" for reason, count in skipped)
        line += f"; {plural(total, 'file')} skipped ({groups})"
    return line
