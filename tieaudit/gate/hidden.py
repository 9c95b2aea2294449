"""Names a folder search skips (hidden, retie's stages and backups): skipped, except what would run code.

A name starting with '.' is tools' state (``.git``, ``.cache``, ``.ipynb_checkpoints``, macOS'
``.DS_Store`` and ``._x.safetensors``), a ``*.tieaudit-stage-*`` folder is a retie in progress, a
``*.tieaudit-backup`` the original retie --in-place kept: none is the model a folder holds. But a
name hides nothing from ``torch.load``: a script loads ``.ckpt/payload.pt`` or
``x.tieaudit-backup/optimizer.pt`` by name. So such files, and every file under such a folder, are
searched for what torch.load would run code from (``formats.torch_takes.hides_code``): such a file
is audited (TIE010); the rest stays skipped (a folder is listed once, not file by file). A link
there is searched when it leads outside the folder given (its target is found nowhere else), and
not followed when its target lies inside (searched where it lies).

The search is bounded: a hidden folder of more than MAX_HIDDEN_ENTRIES entries (files and folders,
at any depth) is an error for that folder, never a silent pass; ``--exclude`` names it to skip it
knowingly (an exclude pattern is matched before the hidden rule).
"""

from __future__ import annotations

import shlex

__all__ = ["MAX_HIDDEN_ENTRIES", "HiddenCount", "searched_folder", "too_many"]

MAX_HIDDEN_ENTRIES = 100_000
"""Entries of one skipped folder (at any depth) searched at most; one more is an error for it."""


def searched_folder(reason: str) -> str:
    """The verdict of a folder skipped for its name (reason) and searched for code only."""
    return f"{reason}, searched only for files torch.load would run code from"


def too_many(limit: int, shown: str) -> str:
    """The one line for a skipped folder (shown: its path as --exclude patterns spell it) that holds
    more than the search reads."""
    return (
        f"a skipped folder of more than {limit} entries: tieaudit searches hidden folders (and retie's "
        "stages and backups, and links leading outside) for files torch.load would run code from, "
        f"and stopped here; pass --exclude {shlex.quote(shown)} to skip this folder knowingly"
    )


class HiddenCount:
    """Entries seen under each skipped folder met directly in a searched one (its root)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_HIDDEN_ENTRIES if limit is None else limit
        self.counts: dict[str, int] = {}

    def admit(self, root: str) -> bool:
        """Count one more entry under root; False once root holds more than the limit."""
        count = self.counts.get(root, 0) + 1
        self.counts[root] = count
        return count <= self.limit
