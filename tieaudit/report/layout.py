"""Tables that fit the width they are given, and never cut a name.

A table is a rich table whose cells fold (a name longer than its column continues on the next
line, in the same column); when its columns cannot all get a useful width (a 60-column terminal),
each row is printed as a record instead, one field per line, the values folding at the width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

MIN_CELL = 24
"""Characters a table gives each wide column (names, messages) at least; a table that cannot give
every column its content or this much is printed as records."""
_INDENT = 2

Cell = Text | str


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


def _width(value: Cell) -> int:
    plain = value.plain if isinstance(value, Text) else value
    return max((cell_len(line) for line in plain.split("\n")), default=0)


def table_width(grid: Grid) -> int:
    """The narrowest table that gives every column its content or MIN_CELL, with its borders."""
    natural = [
        max([len(header), *(_width(row[i]) for row in grid.rows)]) for i, header in enumerate(grid.columns)
    ]
    return sum(min(width, MIN_CELL) for width in natural) + 3 * len(natural) + 1


def _table(grid: Grid) -> Table:
    table = Table(title=grid.title, title_justify="left")
    for column in grid.columns:
        table.add_column(column, justify="right" if column in grid.right else "left", overflow="fold")
    for row in grid.rows:
        table.add_row(*row)
    return table


def _records(grid: Grid) -> Group:
    parts: list[RenderableType] = [Text(grid.title, style="italic")]
    for index, row in enumerate(grid.rows):
        record = Table.grid(padding=(0, 2))
        record.add_column(style="dim", no_wrap=True)
        record.add_column(overflow="fold")
        for header, value in zip(grid.columns, row, strict=True):
            if _width(value):
                record.add_row(header, value)
        parts.append(Padding(record, (1 if index else 0, 0, 0, _INDENT)))
    return Group(*parts)


def laid_out(grid: Grid, width: int) -> RenderableType:
    """The grid as a table when it fits width, else as records; no cell is ever cut."""
    return _table(grid) if table_width(grid) <= width else _records(grid)
