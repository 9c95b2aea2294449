"""Errors tieaudit reports to users, kept apart from its own bugs.

A ``TieauditError`` is the user's problem (bad input, bad usage): the CLI prints one line and
exits 2. Any other exception is a tieaudit bug and keeps its traceback.
"""

from __future__ import annotations

from tieaudit.core.escape import printable


def one_line(exc: BaseException, limit: int = 400, *, escaped: bool = False) -> str:
    """A foreign exception's message folded onto one line (for 'tieaudit: error: ...'); escaped,
    for a message that may quote names from a file and is not escaped again on output."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = text if len(text) <= limit else text[:limit] + "..."
    return printable(text) if escaped else text


OUT_OF_MEMORY = (
    "out of memory (MemoryError) before the command finished: the input needs more memory than "
    "this process could get; nothing was written"
)
"""What a MemoryError anywhere becomes: bad input for this machine (exit 2), never a tieaudit bug."""


class TieauditError(Exception):
    """Base of every error caused by input or usage, never by a tieaudit bug."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class UsageError(TieauditError):
    """The command line or the policy asks for something that cannot be done."""


class InputError(TieauditError):
    """The input is missing, unreadable, truncated or malformed."""


class UnsupportedFormatError(InputError):
    """The input is readable but is not a format tieaudit audits."""


class LfsPointerError(UnsupportedFormatError):
    """The file is a Git LFS pointer: the weights were never fetched (``git lfs pull``)."""


class ExternalDataError(UnsupportedFormatError):
    """The file is another file's external data (an ONNX model's): audit that file instead."""

    def __init__(self, message: str, path: str | None = None, *, models: tuple[str, ...] = ()) -> None:
        super().__init__(message, path)
        self.models = models
        """The files whose data this is, as paths beside the one given."""


class UnsafeInputError(InputError):
    """The input tries something tieaudit refuses: code in a pickle, paths leaving the folder."""


class OutputError(TieauditError):
    """The output cannot be written (disk full, no permission); nothing partial is left behind."""


class MissingExtra(TieauditError, ImportError):
    """An optional dependency (an extra) is not installed or cannot be imported. An ImportError too,
    so ``except ImportError`` around a library call keeps working."""
