"""Report renderers: text (people), json and sarif (machines), dot (Graphviz)."""

from __future__ import annotations

import json
from typing import Any, Literal

from tieaudit.audit import Audit
from tieaudit.core.units import human_bytes, plural
from tieaudit.core.version import __version__
from tieaudit.gate.check import Checked, CheckResult
from tieaudit.gate.files import skipped_by_reason
from tieaudit.report.layout import DEFAULT_WIDTH

InspectFormat = Literal["text", "json", "dot"]
"""What ``inspect`` writes."""
CheckFormat = Literal["text", "json", "sarif"]
"""What ``check`` writes."""


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
    width: int | None = None,
    errors: bool = True,
) -> str:
    """Render a check run as text, json (report/1 or check/1) or sarif; show_files adds the list of
    files and their verdicts to the text (json always has it, as ``files``); errors=False leaves the
    ERROR lines out of the text (they are on stderr, where the report is shown too)."""
    if fmt == "json":
        return json.dumps(check_dict(result), indent=2) + "\n"
    if fmt == "sarif":
        from tieaudit.report.sarif import render_sarif

        return render_sarif(result)
    from tieaudit.report.text import render_check_text, render_files

    text = render_check_text(result, color=color, width=width or DEFAULT_WIDTH, errors=errors)
    return text + render_files(result.files) if show_files else text


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
