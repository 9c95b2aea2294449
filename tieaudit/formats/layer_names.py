"""Names inside numbered module lists (``model.layers.3.x``, ``bbox_embed.0.y``): how ties
between them follow a config's layer counts, which the tie table holds at one size only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def unnumbered(name: str) -> bool:
    """True when no dotted segment of name is a number (a layer or list index)."""
    return not any(part.isdigit() for part in name.split("."))


def first_list(name: str) -> str | None:
    """The module list name's first numbered segment indexes (``bbox_embed`` for
    ``bbox_embed.3.layers.0.weight``); None when no segment is a number."""
    parts = name.split(".")
    return next((".".join(parts[:i]) for i, part in enumerate(parts) if part.isdigit()), None)


def truncated(ties: Mapping[str, str], lists: Collection[str], fewer: int) -> dict[str, str]:
    """The ties a size-dependent class makes with ``fewer`` entries less in each of lists: each
    list's length is taken from the ties themselves (its highest index among them, plus one), and a
    tie survives when its names index no list (at their first numbered segment) past the shortened
    length. The generator checks this rule against transformers before recording it."""

    def indexed(name: str) -> tuple[str, int] | None:
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                prefix = ".".join(parts[:i])
                return (prefix, int(part)) if prefix in lists else None
        return None

    lengths: dict[str, int] = {}
    for pair in ties.items():
        for name in pair:
            found = indexed(name)
            if found is not None:
                lengths[found[0]] = max(lengths.get(found[0], 0), found[1] + 1)

    def within(name: str) -> bool:
        found = indexed(name)
        return found is None or found[1] < lengths[found[0]] - fewer

    return {t: s for t, s in ties.items() if within(t) and within(s)}


def layer_template(name: str) -> str:
    """name with every numbered segment replaced by ``#`` (the same name in any layer)."""
    return ".".join("#" if part.isdigit() else part for part in name.split("."))
