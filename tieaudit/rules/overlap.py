"""TIE006 overlapping-views: names viewing one storage through partially overlapping windows."""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE006


def overlap_findings(audited: Audited) -> Iterator[Finding]:
    """TIE006: views of one storage that overlap without being identical or transposed."""
    for group in audited.graph.groups:
        pairs = [p for p in group.pairs if p.relation == "overlapping"]
        if pairs:
            names = tuple(dict.fromkeys(n for p in pairs for n in (p.first, p.second)))
            yield OVERLAPPING.finding(
                names,
                f"{', '.join(names)} share storage {group.storage_id} with partially overlapping views: "
                f"writing one silently changes part of the other.",
            )


OVERLAPPING = Rule(text=TIE006, check=overlap_findings)
