"""Where a key of a policy file is written: its line, for an error's ``file:line``.

tomllib keeps no positions, so the file's lines are read again: table headers (``[severity]``,
``[[path]]``, ``[tool.tieaudit]``) say which table a line is in, and a key is the line starting with
it (bare or quoted) before ``=`` or a dot. Lines inside multi-line strings are skipped; a key found
nowhere (written in a way this does not follow) gets no line rather than a wrong one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["key_line"]

_HEADER = re.compile(r"\s*\[(\[)?\s*([\w\-. \"']+?)\s*\]\]?\s*(?:#.*)?$")
_QUOTES = "\"'"


@dataclass(frozen=True, kw_only=True)
class _Line:
    number: int
    text: str
    table: str
    """The table the line is in (a header: the table it opens)."""
    header: bool
    entries: int
    """[[...]] headers of the entries' array seen so far, this line's included."""


def _header_name(text: str) -> str:
    return ".".join(part.strip().strip(_QUOTES) for part in text.split("."))


def _key(name: str) -> str:
    """A key as written: bare, or in either quotes."""
    quoted = re.escape(name)
    return rf"(?:{quoted}|\"{quoted}\"|'{quoted}')"


def _scan(text: str, array: str) -> list[_Line]:
    """Every line outside multi-line strings, with its table; array: the entries' table name."""
    lines, table, entries, inside = [], "", 0, ""
    for number, text_line in enumerate(text.splitlines(), 1):
        if inside:
            inside = "" if inside in text_line else inside
            continue
        header = _HEADER.match(text_line)
        if header is not None:
            table = _header_name(header.group(2))
            entries += bool(header.group(1)) and table == array
        lines.append(
            _Line(number=number, text=text_line, table=table, header=header is not None, entries=entries)
        )
        for quotes in ('"""', "'''"):
            if header is None and text_line.count(quotes) % 2 == 1:
                inside = quotes
    return lines


def key_line(text: str, *, table: str, entry: int | None, keys: tuple[str, ...]) -> int | None:
    """The line (from 1) of keys[0] in table (``""`` for the top of tieaudit.toml, ``tool.tieaudit``
    for pyproject.toml) or in its entry-th ``[[path]]`` entry, or of keys[1] inside it (a severity
    table's rule id) when that is found; no keys: the entry's header. None when not found."""
    array = f"{table}.path" if table else "path"
    scope = array if entry is not None else table
    lines = _scan(text, array)

    def within(line: _Line, name: str) -> bool:
        return line.table == name and (entry is None or line.entries == entry)

    if not keys:  # the entry itself: its [[path]] header
        header = next((ln for ln in lines if ln.header and ln.table == array and ln.entries == entry), None)
        return header.number if header is not None and entry is not None else None
    first, rest = keys[0], keys[1:]
    setting = re.compile(rf"\s*{_key(first)}\s*(=|\.)")
    found = next((ln for ln in lines if not ln.header and within(ln, scope) and setting.match(ln.text)), None)
    if rest and found is not None and re.match(rf"\s*{_key(first)}\s*\.\s*{_key(rest[0])}\s*=", found.text):
        return found.number  # severity.TIE001 = "..."
    own = f"{scope}.{first}" if scope else first  # the setting's own table: [severity], [path.severity]
    if rest:
        inner = re.compile(rf"\s*{_key(rest[0])}\s*=")
        line = next((ln for ln in lines if not ln.header and within(ln, own) and inner.match(ln.text)), None)
        if line is not None:
            return line.number
    if found is None:
        found = next((ln for ln in lines if ln.header and within(ln, own)), None)
    return found.number if found is not None else None
