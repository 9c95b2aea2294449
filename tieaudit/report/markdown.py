"""GitHub-flavoured Markdown for a pull-request comment or ``$GITHUB_STEP_SUMMARY``.

A heading with the verdict and the counts, then one section per checkpoint that has findings or
notes (its findings as a table: rule, severity, names, relation, wasted bytes, message, fix), one
table for the checkpoints without any, the paths that could not be read, and the skipped files.

Everything taken from a file (tensor names, paths, messages that quote them) is first made one
printable line (``printable``), then escaped so that it renders as the text it is: names are code
spans with a fence longer than any backtick run inside (nothing in a code span is markup: no HTML,
no links, no mentions); other text has the characters that are inline markup in GitHub's Markdown
backslash-escaped (``\\ ` * _ [ ] < > & | ~ $ :``) and a zero-width space after ``@`` and ``#``,
which GitHub would otherwise turn into a mention or an issue reference. In a table cell a pipe is
escaped even inside a code span (GFM splits cells before it reads code spans).
"""

from __future__ import annotations

import re

from tieaudit.core.escape import printable
from tieaudit.core.shell import Advice, Command
from tieaudit.core.units import human_bytes
from tieaudit.gate.check import Checked, CheckResult
from tieaudit.gate.files import skipped_by_reason
from tieaudit.report.plain import config_notes
from tieaudit.report.training import training_lines

_MARKUP = set("\\`*_[]<>&|~$:")
"""Characters that start inline markup in GitHub's Markdown (``:``: URL autolinks and emoji)."""
_ZWSP = "\u200b"
"""Breaks ``@user`` (a mention that notifies) and ``#1`` / ``owner/repo#1`` (a cross-reference)."""
_BACKTICKS = re.compile(r"`+")


def md_text(text: str) -> str:
    """text from a file or message as Markdown that renders as exactly that text, on one line."""
    out: list[str] = []
    for char in printable(text):
        if char in _MARKUP:
            out.append("\\" + char)
        elif char in "@#":
            out.append(char + _ZWSP)
        else:
            out.append(char)
    return "".join(out)


def md_code(text: str, *, in_table: bool = False) -> str:
    """text as a code span: a fence one backtick longer than its longest run of backticks, padded
    with a space where it starts or ends with a backtick or a space (CommonMark strips one each)."""
    content = printable(text)
    longest = max((len(run) for run in _BACKTICKS.findall(content)), default=0)
    fence = "`" * (longest + 1)
    if content[:1] in ("`", " ") or content[-1:] in ("`", " ") or not content:
        content = f" {content} "
    if in_table:
        content = content.replace("|", "\\|")
    return f"{fence}{content}{fence}"


def md_fix(fix: Advice) -> str:
    """A fix in a table cell: its text escaped, each command a code span, so that what GitHub shows
    (and copies) is the command exactly, with no zero-width space after an '@' or '#' in a path."""
    shown = (md_code(str(p), in_table=True) if isinstance(p, Command) else md_text(p) for p in fix.parts)
    return "".join(shown)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell or " " for cell in cells) + " |"


def _status(checked: Checked) -> str:
    return "FAIL" if checked.failing else "ok"


def _described(checked: Checked) -> str:
    ckpt, summary = checked.audit.graph.checkpoint, checked.audit.summary()
    wasted = f", {human_bytes(summary.wasted_bytes)} wasted" if summary.wasted_bytes else ""
    return (
        f"{ckpt.format}, {summary.tensors} tensors, {human_bytes(summary.bytes)} stored{wasted}; "
        f"fails on {checked.fail_on}"
    )


def _notes(checked: Checked) -> list[str]:
    graph = checked.audit.graph
    return config_notes(graph.checkpoint) + training_lines(graph, brief=True)


def _findings_table(checked: Checked) -> list[str]:
    lines = [
        _row(["rule", "severity", "names", "relation", "wasted", "message", "fix"]),
        "| --- | --- | --- | --- | ---: | --- | --- |",
    ]
    for finding, accepted in zip(checked.audit.findings, checked.baselined, strict=True):
        severity = f"{finding.severity} (baselined)" if accepted else finding.severity
        lines.append(
            _row(
                [
                    f"{finding.rule} {finding.kind}",
                    f"**{severity}**" if finding in checked.failing else severity,
                    "<br>".join(md_code(name, in_table=True) for name in finding.names),
                    finding.relation or "",
                    human_bytes(finding.wasted_bytes) if finding.wasted_bytes else "",
                    md_text(finding.message),
                    md_fix(finding.fix) if finding.fix else "",
                ]
            )
        )
    return lines


def _section(checked: Checked) -> list[str]:
    lines = [f"### {_status(checked)} {md_code(checked.path)}", "", _described(checked), ""]
    notes = _notes(checked)
    if notes:
        lines += [f"- note: {md_text(note)}" for note in notes] + [""]
    if checked.audit.findings:
        lines += [*_findings_table(checked), ""]
    return lines


def _clean_table(clean: list[Checked]) -> list[str]:
    lines = [
        f"### No findings ({len(clean)} {'checkpoint' if len(clean) == 1 else 'checkpoints'})",
        "",
        _row(["checkpoint", "format", "tensors", "stored"]),
        "| --- | --- | ---: | ---: |",
    ]
    for checked in clean:
        ckpt, summary = checked.audit.graph.checkpoint, checked.audit.summary()
        path = md_code(ckpt.path, in_table=True)
        lines.append(_row([path, ckpt.format, str(summary.tensors), human_bytes(summary.bytes)]))
    return [*lines, ""]


def verdict(result: CheckResult) -> str:
    """ERROR when a path could not be read (the audit is incomplete), else FAIL or ok."""
    if result.errors:
        return "ERROR"
    return "FAIL" if any(c.failing for c in result.checked) else "ok"


def _counts(result: CheckResult) -> str:
    summary = result.summary()
    parts = [
        f"{summary.checkpoints} {'checkpoint' if summary.checkpoints == 1 else 'checkpoints'}",
        f"{summary.failing} failing",
        f"{summary.errors} {'error' if summary.errors == 1 else 'errors'}",
    ]
    if result.baseline is not None:
        parts.append(f"{summary.baselined} baselined")
    parts.append(f"{human_bytes(summary.wasted_bytes)} wasted")
    return ", ".join(parts)


def render_markdown(result: CheckResult, *, quiet: bool = False) -> str:
    """The check run as Markdown; quiet keeps only failing checkpoints and errors (nothing at all
    when everything passed)."""
    if quiet and verdict(result) == "ok":
        return ""
    lines = [f"## tieaudit check: {verdict(result)}", "", _counts(result), ""]
    shown = [c for c in result.checked if c.failing or not quiet]
    clean: list[Checked] = []
    for checked in shown:
        if checked.audit.findings or _notes(checked):
            lines += _section(checked)
        else:
            clean.append(checked)
    if clean:
        lines += _clean_table(clean)
    if result.errors:
        lines += ["### Could not be audited", ""]
        lines += [f"- {md_code(e.path)}: {md_text(e.message)}" for e in result.errors] + [""]
    skipped = skipped_by_reason(result.files)
    if skipped and not quiet:
        total = sum(count for _, count in skipped)
        lines += [f"{total} {'file' if total == 1 else 'files'} skipped:", ""]
        lines += [f"- {count} {md_text(reason)}" for reason, count in skipped] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_markdown_failure(message: str) -> str:
    """A run that stopped before auditing anything (nothing scanned, a bad policy file)."""
    return f"## tieaudit check: ERROR\n\n{md_text(message)}\n"
