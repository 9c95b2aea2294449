"""The human report: rich tables of tie groups, declared ties, findings and tensors."""

from __future__ import annotations

import io
import os
from collections import Counter

from rich.console import Console
from rich.text import Text

from tieaudit.audit import Audit
from tieaudit.core.escape import printable, unforgeable_lines
from tieaudit.core.records import Checkpoint, Consumer, PickleGlobal
from tieaudit.core.units import human_bytes, plural
from tieaudit.formats.family import bare_family
from tieaudit.formats.hf_ties import CONFIG
from tieaudit.formats.pickle_globals import VERDICTS
from tieaudit.gate.check import CheckResult
from tieaudit.gate.files import FileVerdict
from tieaudit.graph.alias import TieState
from tieaudit.report.layout import DEFAULT_WIDTH, Cell, Grid, laid_out
from tieaudit.report.training import training_lines

MAX_TENSOR_ROWS = 30
"""Tensors listed in the text report (the largest first); --format json lists every one."""
MAX_MESSAGE_CHARS = 2000
"""Characters of a finding's message the text report shows: a message naming 25 000 tied
parameters wraps to 50 000 lines (5 s of rich's layout); --format json keeps it whole."""
MAX_CELL_NAMES = 64
"""Names one cell of the text report lists (a tie group's, a finding's): a pickle can point 100 000
names at one storage, and laying out each costs rich about 100 us; --format json lists every one."""
COVERED_NAMED = 4
UNREAD_NAMED = 5
"""Unread tensors (quantized, sparse, meta, ...) a text note names; --format json lists every one."""
"""Files a check status line names as read with the checkpoint (a folder's shards): the rest are
counted (--show-files and --format json list every one)."""
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def cell(text: str, style: str = "") -> Text:
    """Text from the checkpoint as a table cell or line: escaped, and never read as rich markup."""
    return Text(printable(text), style=style)


def config_notes(ckpt: Checkpoint) -> list[str]:
    """What config.json's tie resolution left open (a class the table does not hold, layer counts
    other than the table's), one line each, escaped."""
    return [printable(f"{s.name}: {s.reason}") for s in ckpt.skipped if s.name.startswith(CONFIG + ":")]


def family_notes(ckpt: Checkpoint) -> list[str]:
    """A bare file's model class, recognised from its names (or not), in one line, escaped."""
    family = bare_family(ckpt)
    return [] if family is None else [printable(family.describe())]


def unread_notes(ckpt: Checkpoint) -> list[str]:
    """The tensors listed but not read, in one line (escaped): never silently left out of a report."""
    if not ckpt.unread:
        return []
    named = "; ".join(f"{u.name} ({u.describe()})" for u in ckpt.unread[:UNREAD_NAMED])
    more = len(ckpt.unread) - UNREAD_NAMED
    rest = f" and {more} more (--format json lists every one)" if more > 0 else ""
    count = plural(len(ckpt.unread), "tensor")
    return [printable(f"{count} listed but not read, so not audited (convert refuses them): {named}{rest}")]


def cells(names: tuple[str, ...] | list[str]) -> Text:
    """Several names, one per line; past MAX_CELL_NAMES, how many more."""
    shown = [cell(name) for name in names[:MAX_CELL_NAMES]]
    if len(names) > MAX_CELL_NAMES:
        shown.append(Text(f"... {len(names) - MAX_CELL_NAMES} more (--format json lists every name)"))
    return Text("\n").join(shown)


def _tie_status(state: TieState) -> str:
    if state.shared_storage:
        return "tied on disk (one storage)"
    if state.dropped_stored and state.kept_stored:
        return "both stored separately"
    if state.kept_stored:
        return "target not stored (loader must re-tie)"
    if state.dropped_stored:
        return "only target stored"
    return "neither stored"


_SIZE = frozenset({"size", "wasted"})


def _groups_table(audit: Audit) -> Grid:
    table = Grid(
        title="Tie groups (names sharing one storage)",
        columns=("storage", "names", "relation", "size"),
        right=_SIZE,
    )
    for group in audit.graph.groups:
        aliases = set(group.aliases)
        names = [f"{name} (Identity alias)" if name in aliases else name for name in group.names]
        table.rows.append((cell(group.storage_id), cells(names), group.relation, human_bytes(group.nbytes)))
    return table


def _use(consumer: Consumer) -> str:
    where = "" if consumer.graph == "main" else f" in {consumer.graph}"
    return f"{consumer.op_type} {consumer.node} (input {consumer.slot}){where}"


def _consumer_ties_table(audit: Audit) -> Grid:
    table = Grid(
        title="Ties kept by shared consumers (one initializer read as embedding and as head)",
        columns=("initializer", "consumers", "role", "size"),
        right=_SIZE,
    )
    for tie in audit.graph.consumer_ties:
        uses: list[str] = []
        roles: list[str] = []
        for consumer in tie.consumers:
            uses.append(_use(consumer))
            roles.append(consumer.role)
            for reached in consumer.reaches:
                uses.append(f"  -> {_use(reached)}")
                roles.append("")
        names = [tie.initializer, *(f"(alias {alias})" for alias in tie.aliases)]
        table.rows.append((cells(names), cells(uses), Text("\n".join(roles)), human_bytes(tie.nbytes)))
    return table


def _ties_table(audit: Audit) -> Grid:
    table = Grid(title="Declared ties", columns=("target", "source", "declared by", "status"))
    for state in audit.graph.ties:
        tie = state.tie
        table.rows.append((cell(tie.dropped), cell(tie.kept), cell(tie.where), _tie_status(state)))
    return table


def _findings_table(audit: Audit) -> Grid:
    table = Grid(title="Findings", columns=("rule", "severity", "names", "wasted", "message"), right=_SIZE)
    for finding in audit.findings:
        table.rows.append(
            (
                f"{finding.rule} {finding.kind}",
                Text(finding.severity, style=_SEVERITY_STYLE[finding.severity]),
                cells(finding.names),
                human_bytes(finding.wasted_bytes) if finding.wasted_bytes else "",
                cell(_cut(finding.message)),
            )
        )
    return table


def _cut(message: str) -> str:
    """message, or its first MAX_MESSAGE_CHARS characters and how many more."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    more = len(message) - MAX_MESSAGE_CHARS
    return f"{message[:MAX_MESSAGE_CHARS]}... ({more} more characters in --format json)"


def _tensors_table(audit: Audit) -> tuple[Grid, int]:
    ckpt = audit.graph.checkpoint
    shared = {name for group in audit.graph.groups for name in group.names}
    tensors = sorted(ckpt.tensors, key=lambda t: -t.nbytes)
    shown = tensors[:MAX_TENSOR_ROWS]
    # A storage column says something only where storages are shared (never in safetensors).
    columns = ("name", "dtype", "shape", "size") + (("storage",) if shared else ())
    table = Grid(title="Tensors (largest first)", columns=columns, right=_SIZE)
    for tensor in shown:
        row: list[Cell] = [
            cell(tensor.name),
            tensor.dtype,
            "x".join(map(str, tensor.shape)) or "scalar",
            human_bytes(tensor.nbytes),
        ]
        if shared:
            row.append(cell(tensor.storage_id + (" (shared)" if tensor.name in shared else "")))
        table.rows.append(tuple(row))
    return table, len(tensors) - len(shown)


def render_text(audit: Audit, color: bool = False, width: int = DEFAULT_WIDTH) -> str:
    """The report as text for a terminal (color) or a file (plain), its tables fitting width (a table
    too wide for it is printed as records; names fold onto the next line, never cut)."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width)
    ckpt = audit.graph.checkpoint
    summary = audit.summary()
    console.print(
        cell(ckpt.path, "bold"),
        Text(
            f"  format {ckpt.format}  {plural(summary.tensors, 'tensor')} in "
            f"{plural(summary.storages, 'storage')}, {human_bytes(summary.bytes)} stored"
            + (f", {human_bytes(summary.wasted_bytes)} wasted" if summary.wasted_bytes else "")
        ),
        sep="",
        highlight=False,
    )
    if audit.graph.groups:
        console.print(laid_out(_groups_table(audit), width))
    else:
        console.print("No names share a storage.")
    if audit.graph.consumer_ties:
        console.print(laid_out(_consumer_ties_table(audit), width))
    if audit.graph.ties:
        console.print(laid_out(_ties_table(audit), width))
    if audit.findings:
        console.print(laid_out(_findings_table(audit), width))
        for finding in audit.findings:  # below the table, unfolded: a command pasted as shown runs as shown
            if finding.fix:
                shown = f"{finding.rule} {finding.fix.label}: {finding.fix}"
                console.print(cell(shown), highlight=False, soft_wrap=True)
    else:
        console.print("No findings.")
    table, hidden = _tensors_table(audit)
    console.print(laid_out(table, width))
    if hidden:
        console.print(f"{plural(hidden, 'smaller tensor')} not shown; --format json lists every tensor.")
    reader_notes = [printable(note) for note in ckpt.notes]
    for note in (
        reader_notes
        + family_notes(ckpt)
        + config_notes(ckpt)
        + unread_notes(ckpt)
        + training_lines(audit.graph)
    ):
        console.print(Text(f"note: {note}", overflow="fold"), highlight=False)  # prose: fits the width
    if ckpt.pickle_globals:
        console.print(Text(pickle_globals_line(ckpt.pickle_globals)), highlight=False, soft_wrap=True)
    if ckpt.skipped:
        console.print(f"{plural(ckpt.skipped_total, 'non-tensor entry')} skipped (--format json lists them).")
    return _trimmed(buffer.getvalue())


def _trimmed(text: str) -> str:
    """Without the spaces rich pads titles and records with to the width (noise in files and diffs),
    and with no line a folded name starts with '::' (a CI workflow command)."""
    return unforgeable_lines("".join(line.rstrip(" ") + "\n" for line in text.splitlines()))


def pickle_globals_line(used: tuple[PickleGlobal, ...]) -> str:
    """How many globals the pickles name, by verdict, the worst ones spelled out."""
    counts = Counter(g.verdict for g in used)
    parts = [f"{counts[v]} {v}" for v in VERDICTS if counts[v]]
    worst = [g.name for g in used if g.verdict == "runs-code"][:6]
    named = f" ({', '.join(printable(n) for n in worst)})" if worst else ""
    return f"Pickle globals: {', '.join(parts)}{named}; none was imported or called."


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
    result: CheckResult,
    color: bool = False,
    width: int = DEFAULT_WIDTH,
    *,
    errors: bool = True,
    quiet: bool = False,
) -> str:
    """One status line per checkpoint (ok, FAIL, ERROR unless not errors) with its findings beneath;
    quiet: FAIL and ERROR lines only. Lines are not broken (a terminal wraps them, a log keeps one
    line per finding)."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width)
    for checked in result.checked:
        if quiet and not checked.failing:
            continue
        ckpt, summary = checked.audit.graph.checkpoint, checked.audit.summary()
        status = Text("FAIL ", style="bold red") if checked.failing else Text("ok   ", style="green")
        console.print(
            status,
            Text(
                f"{printable(ckpt.path)}  ({ckpt.format}, {plural(summary.tensors, 'tensor')}, "
                f"{human_bytes(summary.bytes)}"
                + (f", {human_bytes(summary.wasted_bytes)} wasted" if summary.wasted_bytes else "")
                + _covers(ckpt)
                + ")"
            ),
            sep="",
            soft_wrap=True,
        )
        for note in config_notes(ckpt) + unread_notes(ckpt) + training_lines(checked.audit.graph, brief=True):
            console.print(Text(f"  note: {note}", style="dim"), highlight=False, soft_wrap=True)
        for finding, accepted in zip(checked.audit.findings, checked.baselined, strict=True):
            console.print(
                Text(f"  {finding.rule} ", style="bold"),
                Text(finding.severity, style=_SEVERITY_STYLE[finding.severity]),
                Text(" (baselined)" if accepted else "", style="dim"),
                Text(f" {printable(finding.message)}"),
                sep="",
                highlight=False,
                soft_wrap=True,
            )
            if finding.fix and not accepted:
                shown = f"      {finding.fix.label}: {finding.fix}"
                console.print(cell(shown, "dim"), highlight=False, soft_wrap=True)
    for error in result.errors if errors else ():
        console.print(
            Text("ERROR", style="bold red"),
            Text(f" {printable(error.path)}: {printable(error.message)}"),
            sep="",
            highlight=False,
            soft_wrap=True,
        )
    return _trimmed(buffer.getvalue())
