"""Connected components of names joined in pairs (ties, records, equal copies): one union-find
for every place that asks whether two names are tied through others."""

from __future__ import annotations

from collections.abc import Iterable


class Components:
    """Names joined pair by pair; ``root`` names each component."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._parent: dict[str, str] = {}
        for first, second in pairs:
            self.join(first, second)

    def root(self, name: str) -> str:
        """The name standing for name's component (name itself when never joined)."""
        parent = self._parent
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def join(self, first: str, second: str) -> None:
        """Put first's component into second's."""
        self._parent[self.root(first)] = self.root(second)

    def same(self, first: str, second: str) -> bool:
        """True when the pairs join first and second (directly or through others)."""
        return first == second or self.root(first) == self.root(second)

    def groups(self) -> list[list[str]]:
        """Every component seen, its names in first-seen order (singletons included)."""
        found: dict[str, list[str]] = {}
        for name in list(self._parent):
            found.setdefault(self.root(name), []).append(name)
        return list(found.values())

    def numbered(self) -> dict[str, int]:
        """Name -> component number, for every name seen."""
        roots: dict[str, int] = {}
        return {name: roots.setdefault(self.root(name), len(roots)) for name in list(self._parent)}
