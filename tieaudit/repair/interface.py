"""The interface every retie writer implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.records import Format
from tieaudit.repair.plan import RetiePlan


class Writer(ABC):
    """Writes a checkpoint with the plan's copies turned back into ties."""

    format: Format

    @abstractmethod
    def write(self, opened: OpenCheckpoint, plan: RetiePlan, out: str) -> list[str]:
        """Write the retied checkpoint at ``out``.

        ``out`` does not exist yet and lies in the final destination's folder (a file path for
        single-file formats, a folder path for hf-dir). Never modify ``opened``'s files. Record every
        applied decision so that ``repair.restore.sources`` of the re-read output gives every
        original name back. Return every file written (they are fsynced before the rename).
        """
