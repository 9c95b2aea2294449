"""Tables where their columns fit, lists where they do not; a name is never broken either way.

A grid is laid out as a rich table only when, measured on its content, every column gets what it
needs: a column of names, sizes or ids its longest line (a name folded inside a narrow column is
a name split mid-word), a prose column its longest word and at least MIN_PROSE characters. When the
width cannot give that, each row is printed as a short record instead: the row's lead (its names,
each whole, wrapping between names), then the other fields as ``label value`` pairs, packed onto
as few lines as fit (``report.wrap``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from tieaudit.report.wrap import Line, Word, fits, listed, word, words, wrap

MIN_PROSE = 20
"""Characters a prose column (a status, a message) gets at least in a table: narrower, a list."""
LEAD = 2
"""Where a record's lead (its names) starts."""
FIELDS = LEAD + 2
"""Where a record's other fields start."""

Cell = Text | str
_MORE = re.compile(r"\.\.\. \d+ more ")
"""The line a cell of names ends with when it lists only some (``report.text.cells``)."""


@dataclass(frozen=True, kw_only=True)
class Grid:
    """A table's content, independent of how it is laid out."""

    title: str
    """Printed above the table (or the records)."""
    columns: tuple[str, ...]
    """Column headers, also the records' field labels."""
    rows: list[tuple[Cell, ...]] = field(default_factory=list)
    """One tuple of cells per row, in column order; a cell may hold several lines."""
    right: frozenset[str] = frozenset()
    """Columns aligned right in a table (sizes)."""
    prose: frozenset[str] = frozenset()
    """Columns of prose, which may wrap at spaces; every other column is kept whole on each line."""
    lead: int = 0
    """The column that leads a record (its names), shown without its label."""


def _lines(value: Cell) -> list[str]:
    plain = value.plain if isinstance(value, Text) else value
    return [line.strip() for line in plain.split("\n") if line.strip()]


def _least(grid: Grid) -> list[int]:
    """Each column's narrowest width that breaks nothing: prose its longest word (at least
    MIN_PROSE, unless all of it is narrower), other columns their longest line (or header)."""
    least = []
    for index, header in enumerate(grid.columns):
        lines = [line for row in grid.rows for line in _lines(row[index])]
        natural = max([cell_len(header), *(cell_len(line) for line in lines)])
        if header in grid.prose:
            longest = max([cell_len(header), *(cell_len(w) for line in lines for w in line.split())])
            least.append(min(natural, max(MIN_PROSE, longest)))
        else:
            least.append(natural)
    return least


def _natural(grid: Grid) -> list[int]:
    return [
        max([cell_len(header), *(cell_len(line) for row in grid.rows for line in _lines(row[i]))])
        for i, header in enumerate(grid.columns)
    ]


def column_widths(grid: Grid, width: int) -> list[int] | None:
    """Content widths that make the grid a table of at most width columns (borders included), the
    prose columns given the room left, up to their natural width; None when it does not fit."""
    least, natural = _least(grid), _natural(grid)
    spare = width - (sum(least) + 3 * len(least) + 1)
    if spare < 0:
        return None
    widths = list(least)
    growing = [i for i, header in enumerate(grid.columns) if header in grid.prose]
    while spare and (growing := [i for i in growing if widths[i] < natural[i]]):
        for i in growing[:spare]:
            widths[i] += 1
            spare -= 1
    return widths


def _table(grid: Grid, widths: list[int]) -> Table:
    table = Table()
    for column, size in zip(grid.columns, widths, strict=True):
        justify: JustifyMethod = "right" if column in grid.right else "left"
        table.add_column(column, justify=justify, overflow="fold", width=size)
    for row in grid.rows:
        table.add_row(*row)
    return table


def _value(grid: Grid, index: int, value: Cell) -> list[Word]:
    lines = _lines(value)
    if grid.columns[index] in grid.prose:
        return [w for line in lines for w in words(line)]
    out = listed(lines)
    if lines and _MORE.match(lines[-1]):  # "... 4936 more (...)" after the names a cell lists: prose
        out[-1:] = words(lines[-1])
    return out


def records(grid: Grid, width: int) -> list[Line]:
    """Each row as its lead (wrapped between names) and its other fields packed as label-value
    pairs, a field that does not fit beside the others on lines of its own."""
    lines: list[Line] = []
    for row in grid.rows:
        lines += wrap(_value(grid, grid.lead, row[grid.lead]), width, indent=LEAD, hang=FIELDS)
        packed: list[Word] = []
        for index, header in enumerate(grid.columns):
            value = _value(grid, index, row[index])
            if index == grid.lead or not value:
                continue
            pair = [word(header, "dim", sep="  "), *value]
            if packed and fits([*packed, *pair], width, indent=FIELDS):
                packed += pair
                continue
            if packed:
                lines += wrap(packed, width, indent=FIELDS)
                packed = []
            if fits(pair, width, indent=FIELDS):
                packed = pair
            else:
                lines += wrap(pair, width, indent=FIELDS, hang=FIELDS + 2)
        if packed:
            lines += wrap(packed, width, indent=FIELDS)
    return lines


def as_text(line: Line) -> Text:
    """A line of spans as rich Text (never read as markup)."""
    return Text.assemble(*line)


def laid_out(grid: Grid, width: int) -> Sequence[RenderableType]:
    """The grid's title, then the grid as a table when its columns fit width, else as records;
    print each with soft_wrap (the lines fit already, and a name wider than the width stays whole)."""
    title: list[RenderableType] = [as_text(line) for line in wrap(words(grid.title, "italic"), width)]
    widths = column_widths(grid, width)
    if widths is not None:
        return [*title, _table(grid, widths)]
    return [*title, *(as_text(line) for line in records(grid, width))]
