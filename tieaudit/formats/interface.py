"""The interface every format reader implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.records import Format


class Reader(ABC):
    """Reads one format's metadata into a Checkpoint without reading tensor bytes; the returned
    OpenCheckpoint owns the memory maps the bytes are later read through."""

    format: Format

    @abstractmethod
    def sniff(self, path: str, head: bytes) -> bool:
        """True when the content (``head`` = first bytes of a file; empty for folders) is ours."""

    @abstractmethod
    def read(self, path: str) -> OpenCheckpoint:
        """Parse path; raise an InputError subclass for anything malformed or unsafe."""
