"""What every reference loader's reading gives (``reference_loaders``, ``reference_onnx``)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np

from tieaudit.core.errors import TieauditError
from tieaudit.repair.restore import Source


class ReferenceMismatch(TieauditError):
    """The reference loader reads the written output differently from the input."""


Block = Callable[[tuple[slice, ...]], np.ndarray]
"""The values of a region of one stored tensor (one slice per leading axis, or () for all)."""


class Loaded(ABC):
    """Stored tensors as a reference loader gives them."""

    names: frozenset[str]
    """Every stored tensor name the loader sees."""

    @abstractmethod
    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
        """Canonical dtype and shape of a stored tensor."""

    @abstractmethod
    def values(self, name: str) -> AbstractContextManager[Block]:
        """Access to one stored tensor's values; what it holds (a map, a copy) goes at the end."""

    def ties(self) -> dict[str, Source]:
        """Dropped name -> where the loader's format restores it from (beyond the stored names)."""
        return {}

    def entries(self) -> frozenset[str]:
        """Every entry the loader returns: the stored tensors (a torch file's other leaves too)."""
        return self.names

    def entry_problem(self, name: str, other: Loaded, other_name: str) -> str | None:
        """How other's entry other_name differs from this reading's entry name (None: it does
        not), for entries beyond the tensors compared a block at a time."""
        del name, other, other_name
        return "cannot be compared with the output's entry"


def root_of(out: str) -> str:
    """The folder the output's files are named relative to (the output itself for a model folder)."""
    return out if os.path.isdir(out) else os.path.dirname(os.path.abspath(out))
