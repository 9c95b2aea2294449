"""Lines that fit a width: prose wraps at spaces, a name, a path or a command is never broken.

The text reports are built from words: a word is one unbreakable unit (a prose word, a whole
tensor name, a path, a command), with the separator that goes before it when it follows another
word on the same line. ``wrap`` fills lines with them up to the width; a word wider than a line
gets a line of its own, whole (the terminal may wrap it; nothing here breaks inside it, since
people copy names and commands from the report). Lines are lists of (text, style) spans, made
into ANSI strings (``ansi``, for ``check``) or rich Text (``report.text``, for ``inspect``). No
import of rich here: ``check`` does not pay for it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Span = tuple[str, str]
"""Text and its style ("bold red", "dim", "" for none)."""
Line = list[Span]
"""One output line, as spans."""

_SGR = {"bold": "1", "dim": "2", "italic": "3", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
"""ANSI select-graphic-rendition codes of the style words used."""


@dataclass(frozen=True)
class Word:
    """One unbreakable unit of a line."""

    spans: tuple[Span, ...]
    """Its text, styled."""
    sep: str = " "
    """What goes before it when it follows another word on the same line."""

    @property
    def width(self) -> int:
        return sum(cells(text) for text, _ in self.spans)

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.spans)

    def around(self, before: str = "", after: str = "", *, sep: str | None = None) -> Word:
        """The same word with text glued before and after it (a parenthesis, a comma), and sep
        when given."""
        spans = ((before, ""), *self.spans, (after, ""))
        return Word(tuple(span for span in spans if span[0]), self.sep if sep is None else sep)


def word(text: str, style: str = "", sep: str = " ") -> Word:
    """One unit of text in one style."""
    return Word(((text, style),), sep)


def words(text: str, style: str = "") -> list[Word]:
    """Prose as words, split at spaces (runs of spaces count as one)."""
    return [word(piece, style) for piece in text.split()]


def listed(items: Iterable[str], style: str = "", *, sep: str = ",") -> list[Word]:
    """Items (names, paths) as one word each, sep after every item but the last."""
    shown = list(items)
    return [word(item + (sep if index < len(shown) - 1 else ""), style) for index, item in enumerate(shown)]


def cells(text: str) -> int:
    """Columns text takes on a terminal: wide (East Asian) characters two, combining ones none."""
    if text.isascii():
        return len(text)
    total = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        total += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return total


def line_width(line: Line) -> int:
    return sum(cells(text) for text, _ in line)


def wrap(items: Sequence[Word], width: int, *, indent: int = 0, hang: int | None = None) -> list[Line]:
    """items filled into lines of at most width columns: the first line indented by indent, the
    others by hang (indent when None). A word that does not fit after another starts a line; one
    wider than a whole line stands alone on its line, unbroken (the only way a line exceeds width)."""
    rest = indent if hang is None else hang
    lines: list[Line] = []
    current: Line = []
    used = 0
    for item in items:
        if current and used + cells(item.sep) + item.width <= width:
            current.append((item.sep, ""))
            current.extend(item.spans)
            used += cells(item.sep) + item.width
            continue
        if current:
            lines.append(current)
        margin = rest if lines else indent
        current = [(" " * margin, ""), *item.spans]
        used = margin + item.width
    if current:
        lines.append(current)
    return [_merged(line) for line in lines]


def fits(items: Sequence[Word], width: int, *, indent: int = 0) -> bool:
    """Whether items make one line of at most width columns."""
    lines = wrap(items, width, indent=indent)
    return len(lines) <= 1 and all(line_width(line) <= width for line in lines)


def _merged(line: Line) -> Line:
    """Adjacent spans of one style as one span, and a separator between two words of one style in
    that style (fewer escape codes; the same text)."""
    out: Line = []
    for index, (text, style) in enumerate(line):
        if not text:
            continue
        if (
            not style
            and text.isspace()
            and out
            and index + 1 < len(line)
            and line[index + 1][1] == out[-1][1]
        ):
            style = out[-1][1]
        if out and out[-1][1] == style:
            out[-1] = (out[-1][0] + text, style)
        else:
            out.append((text, style))
    return out


def styled(text: str, style: str, *, color: bool) -> str:
    """text in style ("bold red", "dim", ...) when color, else as it is."""
    if not color or not style or not text:
        return text
    return f"\x1b[{';'.join(_SGR[name] for name in style.split())}m{text}\x1b[0m"


def ansi(line: Line, *, color: bool) -> str:
    """One line as a string, styled with ANSI codes when color (leading blanks never styled)."""
    return "".join(styled(text, style, color=color and not text.isspace()) for text, style in line)


def plain(line: Line) -> str:
    """One line's text without styles."""
    return "".join(text for text, _ in line)
