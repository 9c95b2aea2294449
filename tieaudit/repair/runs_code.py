"""What retie and convert say before anything else: their input's pickle runs code when loaded.

A file the reader gives the ``runs-code`` verdict (TIE010: a global outside torch's weights_only
allowlist, which torch.load(weights_only=False) or pickle would import and call) is worth knowing
about before any plan, note or refusal: whoever has it may load it another way. The verdict is
the reader's; this module only words it.
"""

from __future__ import annotations

from tieaudit.core.errors import TieauditError

NAMED_PER_FILE = 8
"""Globals spelled out per file (a pickle may name thousands)."""
FILES_NAMED = 3
"""Files of a folder spelled out; the rest are counted."""


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED_PER_FILE])
    return shown + (f" and {len(names) - NAMED_PER_FILE} more" if len(names) > NAMED_PER_FILE else "")


def runs_code_warning(path: str) -> str | None:
    """The line to print first when path's pickles name a global that runs code (TIE010); None when
    none does, or when path cannot be read (the command itself then says why, as it always has).
    Reads the records only, no tensor bytes."""
    from tieaudit.formats import open_checkpoint

    try:
        with open_checkpoint(path) as opened:
            used = opened.checkpoint.pickle_globals
    except TieauditError:
        return None
    by_file: dict[str, list[str]] = {}
    for found in used:
        if found.verdict == "runs-code" and found.name not in by_file.get(found.file, []):
            by_file.setdefault(found.file, []).append(found.name)
    if not by_file:
        return None
    named = list(by_file.items())[:FILES_NAMED]
    files = [f"{file} calls or imports {_listed(names)}" for file, names in named]
    more = len(by_file) - FILES_NAMED
    return (
        f"TIE010 pickle-runs-code: {'; '.join(files)}{f'; and {more} more files' if more > 0 else ''}. "
        "torch.load(weights_only=False) or pickle would run that code; tieaudit read it with inert "
        "placeholders and ran nothing"
    )
