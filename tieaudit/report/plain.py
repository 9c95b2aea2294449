"""The check report in plain lines, without rich: a status line per checkpoint, its findings beneath.

``check``'s text report is lines that are never broken (a terminal wraps them, a log keeps one line
per finding), styled with a few ANSI codes when it goes to a colour terminal. It needs no layout
engine, so a pre-commit hook or a CI gate does not pay for importing one: rich is imported by the
reports that lay out tables (``inspect``, ``--show-files``'s neighbours in ``report.text``).
"""

from __future__ import annotations

import os

from tieaudit.core.escape import printable, unforgeable_lines
from tieaudit.core.records import Checkpoint
from tieaudit.core.units import human_bytes, plural
from tieaudit.formats.hf.variants import CONFIG
from tieaudit.gate.check import CheckResult
from tieaudit.gate.files import FileVerdict
from tieaudit.report.training import training_lines

DEFAULT_WIDTH = 120
"""Width of the text report when it goes neither to a terminal nor under COLUMNS (a file, a pipe)."""
MIN_WIDTH = 40
"""Narrowest width honoured (a smaller terminal or COLUMNS is treated as this): below it a record's
labels leave almost nothing for the names."""
COVERED_NAMED = 4
"""Files a check status line names as read with the checkpoint (a folder's shards): the rest are
counted (--show-files and --format json list every one)."""
UNREAD_NAMED = 5
"""Unread tensors (quantized, sparse, meta, ...) a text note names; --format json lists every one."""
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
"""How each severity is shown on a colour terminal."""

_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
"""ANSI select-graphic-rendition codes of the style words used."""


def styled(text: str, style: str, *, color: bool) -> str:
    """text in style ("bold red", "dim", ...) when color, else as it is."""
    if not color or not style or not text:
        return text
    return f"\x1b[{';'.join(_SGR[word] for word in style.split())}m{text}\x1b[0m"


def trimmed(text: str) -> str:
    """Without the spaces a layout pads titles and records with to the width (noise in files and
    diffs), and with no line a folded name starts with '::' (a CI workflow command)."""
    return unforgeable_lines("".join(line.rstrip(" ") + "\n" for line in text.splitlines()))


def config_notes(ckpt: Checkpoint) -> list[str]:
    """What config.json's tie resolution left open (a class the table does not hold, layer counts
    other than the table's), one line each, escaped."""
    return [printable(f"{s.name}: {s.reason}") for s in ckpt.skipped if s.name.startswith(CONFIG + ":")]


def unread_notes(ckpt: Checkpoint) -> list[str]:
    """The tensors listed but not read, in one line (escaped): never silently left out of a report."""
    if not ckpt.unread:
        return []
    named = "; ".join(f"{u.name} ({u.describe()})" for u in ckpt.unread[:UNREAD_NAMED])
    more = len(ckpt.unread) - UNREAD_NAMED
    rest = f" and {more} more (--format json lists every one)" if more > 0 else ""
    count = plural(len(ckpt.unread), "tensor")
    return [printable(f"{count} listed but not read, so not audited (convert refuses them): {named}{rest}")]


def _covers(ckpt: Checkpoint) -> str:
    """'; covers a, b, c and 2 more files' for the files read besides the checkpoint file itself."""
    own = os.path.basename(ckpt.path.rstrip(os.sep))
    others = [name for name in ckpt.files if name != own]
    if not others:
        return ""
    named = ", ".join(printable(name) for name in others[:COVERED_NAMED])
    more = len(others) - COVERED_NAMED
    return f"; covers {named}" + (f" and {plural(more, 'more file')}" if more > 0 else "")


def render_files(files: tuple[FileVerdict, ...]) -> str:
    """--show-files: every file with its verdict, then the target covering it or the reason."""
    counts = {v: sum(f.verdict == v for f in files) for v in ("audited", "covered", "skipped", "error")}
    lines = ["files: " + ", ".join(plural(n, v) if v == "error" else f"{n} {v}" for v, n in counts.items())]
    for entry in files:
        line = f"{entry.verdict:<8} {printable(entry.path)}"
        if entry.verdict != "audited" and entry.reason:
            line += f"  ({printable(entry.reason)})"
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def render_check_text(
    result: CheckResult, color: bool = False, *, errors: bool = True, quiet: bool = False
) -> str:
    """One status line per checkpoint (ok, FAIL, ERROR unless not errors) with its findings beneath;
    quiet: FAIL and ERROR lines only. Lines are not broken (a terminal wraps them, a log keeps one
    line per finding)."""
    lines: list[str] = []
    for checked in result.checked:
        if quiet and not checked.failing:
            continue
        ckpt, summary = checked.audit.graph.checkpoint, checked.audit.summary()
        status = (
            styled("FAIL ", "bold red", color=color)
            if checked.failing
            else styled("ok   ", "green", color=color)
        )
        wasted = f", {human_bytes(summary.wasted_bytes)} wasted" if summary.wasted_bytes else ""
        lines.append(
            f"{status}{printable(ckpt.path)}  ({ckpt.format}, {plural(summary.tensors, 'tensor')}, "
            f"{human_bytes(summary.bytes)}{wasted}{_covers(ckpt)})"
        )
        notes = config_notes(ckpt) + unread_notes(ckpt) + training_lines(checked.audit.graph, brief=True)
        lines.extend(styled(f"  note: {note}", "dim", color=color) for note in notes)
        for finding, accepted in zip(checked.audit.findings, checked.baselined, strict=True):
            lines.append(
                styled(f"  {finding.rule} ", "bold", color=color)
                + styled(finding.severity, SEVERITY_STYLE[finding.severity], color=color)
                + styled(" (baselined)" if accepted else "", "dim", color=color)
                + f" {printable(finding.message)}"
            )
            if finding.fix and not accepted:
                lines.append(
                    styled(printable(f"      {finding.fix.label}: {finding.fix}"), "dim", color=color)
                )
    lines.extend(
        styled("ERROR", "bold red", color=color) + f" {printable(error.path)}: {printable(error.message)}"
        for error in (result.errors if errors else ())
    )
    return trimmed("\n".join(lines))
