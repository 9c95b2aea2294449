"""TIE012 cross-file-copy: another file of the same repository holds these tensors again.

One checkpoint's audit cannot see it: ``check`` compares the checkpoints it found under one folder
with each other (``gate.across``, over ``graph.across``) and makes these findings with
``cross_file_finding``, on the later file, naming both. A note by default: a repository that
publishes one model in two formats, or decoders that each carry the weights, spends its users'
downloads and disk twice, but each file still loads as the model it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tieaudit.core.escape import printable
from tieaudit.core.units import human_bytes, plural
from tieaudit.graph.across import AcrossCopy
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE012

PAIRS_NAMED = 3
"""Pairs of names a message spells out (the finding's names list all of them)."""


def made_by_check(audited: Audited) -> Iterator[Finding]:
    """TIE012 needs the other files: one checkpoint's audit finds nothing (``gate.across`` does)."""
    yield from ()


CROSS_FILE = Rule(text=TIE012, check=made_by_check)


def _pair(copy: AcrossCopy) -> str:
    """``name`` when both files call it the same, else ``copy = original``."""
    if copy.second_name == copy.first_name:
        return printable(copy.second_name)
    return f"{printable(copy.second_name)} = {printable(copy.first_name)}"


def cross_file_finding(
    copies: Sequence[AcrossCopy],
    *,
    this: str,
    original: str,
    whole: bool,
    counted: frozenset[str] = frozenset(),
) -> Finding:
    """The finding on file this, whose copies (all of one earlier file, original) repeat its tensors;
    whole: they are most of this file's bytes (the same weights again, in another file); counted:
    names whose bytes the file's own findings already count as wasted (not counted again)."""
    size = sum(c.nbytes for c in copies)
    wasted = sum(c.nbytes for c in copies if c.second_name not in counted)  # not counted twice
    pairs = ", ".join(_pair(c) for c in copies[:PAIRS_NAMED])
    more = f" and {len(copies) - PAIRS_NAMED} more" if len(copies) > PAIRS_NAMED else ""
    what = (
        "most of the file is the same weights again (if the two are one model in two formats, "
        "publishing one saves the bytes)"
        if whole
        else "the repository stores them twice (where both files are loaded together, sharing them "
        "saves the memory too)"
    )
    message = (
        f"{plural(len(copies), 'tensor')} ({human_bytes(size)}) of {printable(this)} "
        f"{'is' if len(copies) == 1 else 'are'} byte for byte in {printable(original)} too "
        f"({pairs}{more}): {what}."
    )
    return CROSS_FILE.finding(
        [c.second_name for c in copies],
        message,
        relation="equal",
        wasted_bytes=wasted,
        details={"file": this, "copy_of": original, "tensors": len(copies), "whole_file": whole},
    )
