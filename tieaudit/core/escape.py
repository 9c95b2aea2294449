"""One escaping function for every name, path and message that came from input.

Tensor names, index entries, external-data locations and file names are chosen by whoever made
the checkpoint. Printed raw, a newline forges a line in a CI log (``::error file=...::``), an ESC
starts a terminal control sequence, a bidi override reorders what a reviewer reads, and a file
name that is not UTF-8 cannot be encoded at all. ``printable`` makes any of them one visible line.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """text with every character a terminal or log would act on shown as an escape.

    Kept: printable characters (letters of any script, digits, punctuation, the space, the
    backslash). Escaped: control and format characters (``\\n``, ``\\x1b``, bidi overrides
    ``\\u202e``), separators other than the space, and undecodable bytes (``\\xff``). The backslash
    is kept so that text escaped once already (a ``repr`` in a message) is not escaped twice; what
    matters here is that nothing a terminal acts on gets through, and nothing does.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def quoted(text: str, limit: int = 200) -> str:
    """text for a one-line message: in single quotes, escaped by ``printable``, and cut after limit
    characters (a name from a file can be megabytes long)."""
    cut = text if len(text) <= limit else text[:limit]
    return f"'{printable(cut)}{'...' if len(text) > limit else ''}'"


COMMAND_GUARD = "·"
"""Put before a line that would begin (after blanks) with '::': a CI runner reads such a line as a
workflow command, and a name folded at a column boundary can start a line with its own '::'."""


def unforgeable_lines(text: str) -> str:
    """text with no line beginning, after blanks, with '::' (the guard takes one blank's place)."""
    if "::" not in text:
        return text
    lines = text.split("\n")
    for index, line in enumerate(lines):
        rest = line.lstrip()
        if rest.startswith("::"):
            blanks = len(line) - len(rest)
            lines[index] = " " * max(blanks - 1, 0) + COMMAND_GUARD + rest
    return "\n".join(lines)
