"""The human report: rich tables of tie groups, declared ties, findings and tensors."""

from __future__ import annotations

import io
from collections import Counter

from rich.console import Console
from rich.text import Text

from tieaudit.audit import Audit
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint, Consumer, PickleGlobal
from tieaudit.core.units import human_bytes, plural
from tieaudit.graph.alias import TieState
from tieaudit.report.layout import Cell, Grid, laid_out
from tieaudit.report.plain import DEFAULT_WIDTH, SEVERITY_STYLE, config_notes, trimmed, unread_notes
from tieaudit.report.training import training_lines

MAX_TENSOR_ROWS = 30
"""Tensors listed in the text report (the largest first); --format json lists every one."""
MAX_MESSAGE_CHARS = 2000
"""Characters of a finding's message the text report shows: a message naming 25 000 tied
parameters wraps to 50 000 lines (5 s of rich's layout); --format json keeps it whole."""
MAX_CELL_NAMES = 64
"""Names one cell of the text report lists (a tie group's, a finding's): a pickle can point 100 000
names at one storage, and laying out each costs rich about 100 us; --format json lists every one."""


def cell(text: str, style: str = "") -> Text:
    """Text from the checkpoint as a table cell or line: escaped, and never read as rich markup."""
    return Text(printable(text), style=style)


def family_notes(ckpt: Checkpoint) -> list[str]:
    """A bare file's model class, recognised from its names (or not), in one line, escaped."""
    from tieaudit.formats.family import bare_family  # the class table: only when a report is printed

    family = bare_family(ckpt)
    return [] if family is None else [printable(family.describe())]


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
                Text(finding.severity, style=SEVERITY_STYLE[finding.severity]),
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
    return trimmed(buffer.getvalue())


def pickle_globals_line(used: tuple[PickleGlobal, ...]) -> str:
    """How many globals the pickles name, by verdict, the worst ones spelled out."""
    from tieaudit.formats.pickle_globals import VERDICTS  # torch's allowlist: only for a pickle

    counts = Counter(g.verdict for g in used)
    parts = [f"{counts[v]} {v}" for v in VERDICTS if counts[v]]
    worst = [g.name for g in used if g.verdict == "runs-code"][:6]
    named = f" ({', '.join(printable(n) for n in worst)})" if worst else ""
    return f"Pickle globals: {', '.join(parts)}{named}; none was imported or called."
