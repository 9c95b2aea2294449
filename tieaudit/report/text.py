"""The human report (``inspect``): tie groups, declared ties, findings and tensors, fitting the width.

Tables where their columns fit, records where they do not (``report.layout``); findings as a few
lines each (``report.finding_text``, as in ``check``); every other line wrapped at spaces, a name,
path or command never broken (``report.wrap``).
"""

from __future__ import annotations

import io
from collections import Counter

from rich.console import Console, RenderableType
from rich.text import Text

from tieaudit.audit import Audit
from tieaudit.core.escape import printable
from tieaudit.core.records import Checkpoint, Consumer, PickleGlobal
from tieaudit.core.units import human_bytes, plural
from tieaudit.graph.alias import TieState
from tieaudit.report.finding_text import INDENT, finding_lines
from tieaudit.report.layout import Cell, Grid, as_text, laid_out
from tieaudit.report.plain import DEFAULT_WIDTH, config_notes, trimmed, unread_notes
from tieaudit.report.training import training_lines
from tieaudit.report.wrap import Word, word, words, wrap

MAX_TENSOR_ROWS = 30
"""Tensors listed in the text report (the largest first); --format json lists every one."""
MAX_MESSAGE_CHARS = 2000
"""Characters of a finding's message the text report shows: a message naming 25 000 tied
parameters wraps to 50 000 lines; --format json keeps it whole."""
MAX_CELL_NAMES = 64
"""Names one place of the text report lists (a tie group's cell, a finding's names): a pickle can
point 100 000 names at one storage, and laying out each costs rich about 100 us; --format json
lists every one."""


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
        lead=1,
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
    table = Grid(
        title="Declared ties",
        columns=("target", "source", "declared by", "status"),
        prose=frozenset({"declared by", "status"}),
    )
    for state in audit.graph.ties:
        tie = state.tie
        table.rows.append((cell(tie.dropped), cell(tie.kept), cell(tie.where), _tie_status(state)))
    return table


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


def _header(audit: Audit) -> list[Word]:
    """The path, then format, tensors, storages, bytes stored and wasted."""
    ckpt, summary = audit.graph.checkpoint, audit.summary()
    facts = [
        f"{plural(summary.tensors, 'tensor')} in {plural(summary.storages, 'storage')},",
        f"{human_bytes(summary.bytes)} stored",
    ]
    if summary.wasted_bytes:
        facts[-1] += ","
        facts.append(f"{human_bytes(summary.wasted_bytes)} wasted")
    return [
        word(printable(ckpt.path), "bold"),
        word(f"format {ckpt.format}", sep="  "),
        word(facts[0], sep="  "),
        *(word(fact) for fact in facts[1:]),
    ]


def _notes(ckpt: Checkpoint, audit: Audit) -> list[str]:
    reader_notes = [printable(note) for note in ckpt.notes]
    return (
        reader_notes
        + family_notes(ckpt)
        + config_notes(ckpt)
        + unread_notes(ckpt)
        + training_lines(audit.graph)
    )


def render_text(audit: Audit, color: bool = False, width: int = DEFAULT_WIDTH) -> str:
    """The report as text for a terminal (color) or a file (plain), fitting width: tables where
    their columns fit it, else records; a name, path or command is never broken (one wider than
    the width stands whole on its own line)."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width)

    def show(*parts: RenderableType, prose: list[Word] | None = None, hang: int = 0) -> None:
        fitted = [as_text(line) for line in wrap(prose, width, hang=hang)] if prose else []
        for part in [*parts, *fitted]:
            # a line fitted already is not wrapped again: rich would fold a long name in it
            console.print(part, soft_wrap=isinstance(part, Text), highlight=False)

    ckpt = audit.graph.checkpoint
    show(prose=_header(audit), hang=INDENT)
    if audit.graph.groups:
        show(*laid_out(_groups_table(audit), width))
    else:
        show(prose=words("No names share a storage."))
    if audit.graph.consumer_ties:
        show(*laid_out(_consumer_ties_table(audit), width))
    if audit.graph.ties:
        show(*laid_out(_ties_table(audit), width))
    if audit.findings:
        show(prose=words("Findings", "italic"))
        for finding in audit.findings:
            show(
                *(
                    as_text(line)
                    for line in finding_lines(
                        finding, width, names_named=MAX_CELL_NAMES, max_chars=MAX_MESSAGE_CHARS
                    )
                )
            )
    else:
        show(prose=words("No findings."))
    table, hidden = _tensors_table(audit)
    show(*laid_out(table, width))
    if hidden:
        show(prose=words(f"{plural(hidden, 'smaller tensor')} not shown; --format json lists every tensor."))
    for note in _notes(ckpt, audit):
        show(prose=words(f"note: {note}"), hang=INDENT)
    if ckpt.pickle_globals:
        show(prose=words(pickle_globals_line(ckpt.pickle_globals)), hang=INDENT)
    if ckpt.skipped:
        skipped = f"{plural(ckpt.skipped_total, 'non-tensor entry')} skipped (--format json lists them)."
        show(prose=words(skipped))
    return trimmed(buffer.getvalue())


def pickle_globals_line(used: tuple[PickleGlobal, ...]) -> str:
    """How many globals the pickles name, by verdict, the worst ones spelled out."""
    from tieaudit.formats.pickle_globals import VERDICTS  # torch's allowlist: only for a pickle

    counts = Counter(g.verdict for g in used)
    parts = [f"{counts[v]} {v}" for v in VERDICTS if counts[v]]
    worst = [g.name for g in used if g.verdict == "runs-code"][:6]
    named = f" ({', '.join(printable(n) for n in worst)})" if worst else ""
    return f"Pickle globals: {', '.join(parts)}{named}; none was imported or called."
