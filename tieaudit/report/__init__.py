"""Report renderers: text (people), json (machines), dot (Graphviz)."""

from __future__ import annotations

from tieaudit.audit import Audit
from tieaudit.check import CheckResult
from tieaudit.findings import Severity


def render(audit: Audit, fmt: str, color: bool = False) -> str:
    """Render one audit in the named format."""
    if fmt == "json":
        from tieaudit.report.json_report import render_json

        return render_json(audit)
    if fmt == "dot":
        from tieaudit.report.dot import render_dot

        return render_dot(audit)
    from tieaudit.report.text import render_text

    return render_text(audit, color=color)


def render_check(result: CheckResult, fmt: str, fail_on: Severity, color: bool = False) -> str:
    """Render a check run: one path's report as is, several as tieaudit.check/1 (json)."""
    if fmt == "json":
        import json

        from tieaudit.report.json_report import report_dict

        if len(result.audits) == 1 and not result.errors:
            return json.dumps(report_dict(result.audits[0]), indent=2) + "\n"
        document = {
            "schema": "tieaudit.check/1",
            "reports": [report_dict(a) for a in result.audits],
            "errors": [{"path": e.path, "message": e.message} for e in result.errors],
        }
        return json.dumps(document, indent=2) + "\n"
    from tieaudit.report.text import render_check_text

    return render_check_text(result, fail_on, color=color)
