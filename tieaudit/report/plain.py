"""The check report in plain lines, without rich: a status line per checkpoint, its findings beneath.

``check``'s text report is lines wrapped to the width (``report.wrap``: prose breaks at spaces, a
path, a tensor name or a command never), styled with a few ANSI codes when it goes to a colour
terminal. It needs no layout engine, so a pre-commit hook or a CI gate does not pay for importing
one: rich is imported by the report that lays out tables (``inspect``, in ``report.text``).
"""

from __future__ import annotations

import os

from tieaudit.core.escape import printable, unforgeable_lines
from tieaudit.core.records import Checkpoint
from tieaudit.core.units import human_bytes, plural
from tieaudit.formats.hf.variants import CONFIG
from tieaudit.gate.check import Checked, CheckResult
from tieaudit.gate.files import FileVerdict
from tieaudit.report.finding_text import BODY, INDENT, finding_lines
from tieaudit.report.training import training_lines
from tieaudit.report.wrap import Line, Word, ansi, listed, word, words, wrap

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
_STATUS_HANG = 5
"""Where a status (or ERROR) line continues: under its path."""
_FILE_HANG = 9
"""Where a --show-files line continues: under its path."""


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


def _covers(ckpt: Checkpoint) -> list[Word]:
    """'covers a, b, c and 2 more files' for the files read besides the checkpoint file itself, as
    words (each file name one)."""
    own = os.path.basename(ckpt.path.rstrip(os.sep))
    others = [name for name in ckpt.files if name != own]
    if not others:
        return []
    more = len(others) - COVERED_NAMED
    named = listed(printable(name) for name in others[:COVERED_NAMED])
    if more > 0:
        return [word("covers"), *named, *words(f"and {plural(more, 'more file')}")]
    return [word("covers"), *named]


def render_files(files: tuple[FileVerdict, ...], width: int = DEFAULT_WIDTH) -> str:
    """--show-files: every file with its verdict, then the target covering it or the reason."""
    counts = {v: sum(f.verdict == v for f in files) for v in ("audited", "covered", "skipped", "error")}
    items = [plural(n, v) if v == "error" else f"{n} {v}" for v, n in counts.items()]
    lines = wrap([word("files:"), *listed(items)], width, hang=_FILE_HANG)
    for entry in files:
        line = [word(f"{entry.verdict:<8}"), word(printable(entry.path))]
        if entry.verdict != "audited" and entry.reason:
            reason = words(f"({printable(entry.reason)})")
            line += [reason[0].around(sep="  "), *reason[1:]]
        lines += wrap(line, width, hang=_FILE_HANG)
    return "".join(ansi(line, color=False) + "\n" for line in lines)


def _status(checked: Checked) -> list[Word]:
    """FAIL or ok, the path, then what was read: format, tensors, bytes, wasted, files covered."""
    ckpt, summary = checked.audit.graph.checkpoint, checked.audit.summary()
    status = word("FAIL", "bold red") if checked.failing else Word((("ok", "green"), ("  ", "")))
    wasted = [f"{human_bytes(summary.wasted_bytes)} wasted"] if summary.wasted_bytes else []
    facts = listed([ckpt.format, plural(summary.tensors, "tensor"), human_bytes(summary.bytes), *wasted])
    covers = _covers(ckpt)
    if covers:
        facts[-1] = facts[-1].around(after=";")
    details = [*facts, *covers]
    details[0] = details[0].around("(", sep="  ")
    details[-1] = details[-1].around(after=")")
    return [status, word(printable(ckpt.path)), *details]


def render_check_text(
    result: CheckResult,
    color: bool = False,
    *,
    errors: bool = True,
    quiet: bool = False,
    width: int = DEFAULT_WIDTH,
) -> str:
    """One status line per checkpoint (ok, FAIL, ERROR unless not errors) with its notes and
    findings beneath, wrapped to width (a path, name or command is never broken); quiet: FAIL and
    ERROR lines only."""
    lines: list[Line] = []
    for checked in result.checked:
        if quiet and not checked.failing:
            continue
        lines += wrap(_status(checked), width, hang=_STATUS_HANG)
        ckpt = checked.audit.graph.checkpoint
        notes = config_notes(ckpt) + unread_notes(ckpt) + training_lines(checked.audit.graph, brief=True)
        for note in notes:
            lines += wrap(words(f"note: {note}", "dim"), width, indent=INDENT, hang=BODY)
        for finding, accepted in zip(checked.audit.findings, checked.baselined, strict=True):
            lines += finding_lines(finding, width, baselined=accepted)
    for error in result.errors if errors else ():
        error_line = [word("ERROR", "bold red"), word(printable(error.path) + ":")]
        lines += wrap(error_line + words(printable(error.message)), width, hang=_STATUS_HANG)
    return trimmed("\n".join(ansi(line, color=color) for line in lines))
