"""Commands tieaudit suggests: built from argv, shown so that pasting one runs exactly that command.

A fix names files, and whoever made (or named) a checkpoint chooses their names: ``a b.pt``,
``$(curl x|sh).pt``, ``x;rm -rf ~``, a newline, a leading ``-``, bytes that are not UTF-8.
Interpolated into text, any of them turns advice into an attack, or into a command on another
file. So every command in advice is kept as its argv (``Command``) and shown by ``shell_command``
alone: each word as a POSIX shell reads it back (``shlex.quote``); a word holding a character a
terminal would act on or cannot show (``core.escape.printable`` would escape it) in bash's ANSI-C
quoting instead, ``$'...'`` with ``\\xHH`` bytes, so that the command stays one printable line
(``printable`` leaves it as it is) and still names exactly that file. ``Advice`` is a fix: prose
and commands, the commands never flattened into text until shown, so a path in them can be
rewritten as a path (``Advice.with_paths``), never by replacing text.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace

_PLAIN = frozenset(chr(code) for code in range(0x20, 0x7F)) - set("\\'!")
"""Characters written as themselves inside ``$'...'`` (printable ASCII: nothing else is special
there); every other one as its bytes, ``\\xHH``: the backslash and the quote (no escape to misread,
no quote to close), '!' (no history expansion), control characters and anything not ASCII (the
file's bytes, whatever the terminal's encoding)."""
_COMMAND_IN_TEXT = re.compile(r"\btieaudit\s+(inspect|check|retie|convert|runtime|export|rule)\b")
"""A tieaudit command written into prose: what Advice refuses (commands are Command parts)."""


def _bytes_of(char: str) -> bytes:
    """The bytes a character of a path stands for (os.fsdecode's surrogates back to their byte)."""
    try:
        return os.fsencode(char)
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to: shown, never lost
        return char.encode("utf-8", "surrogatepass")


def shell_word(word: str) -> str:
    """word as one shell word that reads back as exactly word, on one printable line."""
    if word.isprintable():
        return shlex.quote(word)
    shown = "".join(
        char if char in _PLAIN else "".join(f"\\x{byte:02x}" for byte in _bytes_of(char)) for char in word
    )
    return f"$'{shown}'"


def shell_command(*argv: str) -> str:
    """The command line that runs argv: every word quoted by ``shell_word``, one printable line."""
    return " ".join(shell_word(word) for word in argv)


def operand(path: str) -> str:
    """path as a command's operand: one starting with '-' would be read as an option; './' keeps
    it naming the same file."""
    return "./" + path if path.startswith("-") else path


@dataclass(frozen=True)
class Command:
    """A command line a fix suggests, as argv: the program's words, then the files it names (the
    placeholder OUT included), then options."""

    words: tuple[str, ...]
    """The program and its subcommand, e.g. ("tieaudit", "retie")."""
    paths: tuple[str, ...] = ()
    """Operands naming files, as tieaudit was given them (rewritten by ``with_paths``)."""
    options: tuple[str, ...] = ()
    """Options after the operands, each word on its own (("--relations", "equal,transposed"))."""

    @property
    def argv(self) -> tuple[str, ...]:
        """The words the shell passes to the program."""
        return (*self.words, *(operand(path) for path in self.paths), *self.options)

    def __str__(self) -> str:
        return shell_command(*self.argv)

    def with_paths(self, change: Callable[[str], str]) -> Command:
        """The same command with every path operand changed."""
        return replace(self, paths=tuple(change(path) for path in self.paths))


def tieaudit_command(subcommand: str, *paths: str, options: tuple[str, ...] = ()) -> Command:
    """``tieaudit SUBCOMMAND PATH... OPTION...`` as a Command."""
    return Command(("tieaudit", subcommand), paths, options)


@dataclass(frozen=True)
class Advice:
    """A fix: prose and commands, shown as one line by str()."""

    parts: tuple[str | Command, ...]
    """Text and commands in the order they read; no text part spells a tieaudit command."""

    def __post_init__(self) -> None:
        for part in self.parts:
            if isinstance(part, str) and _COMMAND_IN_TEXT.search(part):
                raise ValueError(f"a command written into a fix's text, not built as a Command: {part!r}")

    def __str__(self) -> str:
        return "".join(str(part) for part in self.parts)

    @property
    def label(self) -> str:
        """How a report introduces it: ``fix`` only when it is one command, which runs as printed
        when pasted into a shell; ``advice`` for prose (what to decide, what not to do)."""
        return "fix" if len(self.parts) == 1 and isinstance(self.parts[0], Command) else "advice"

    @property
    def commands(self) -> tuple[Command, ...]:
        """The commands in it, in order."""
        return tuple(part for part in self.parts if isinstance(part, Command))

    def with_paths(self, change: Callable[[str], str]) -> Advice:
        """The same advice with every command's path operands changed (the text is left alone)."""
        return Advice(
            tuple(part.with_paths(change) if isinstance(part, Command) else part for part in self.parts)
        )


def advice(*parts: str | Command) -> Advice:
    """A fix from its text and commands, in the order they read."""
    return Advice(parts)
