"""What --exclude patterns and policy [[path]] globs matched in one check run, and the warnings.

Patterns are relative to one base, as the policy's ``[[path]]`` globs are: the policy file's
folder, or the current folder when there is none (and a pattern may name a file or folder alone).
A pattern written relative to the PATH argument (the base before there was one base) still
applies where the base misses, so that existing scripts keep working, and the run says how to
write it; a pattern that matched nothing is said too.

A policy glob naming no checkpoint is said when the run searched a folder that it could have named:
naming files alone (the pre-commit hook) or a folder beside the one a glob is about (``check
models/new`` with ``models/legacy/**`` in the policy) is not expected to match every entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from tieaudit.core.errors import UsageError
from tieaudit.core.globs import compile_glob, glob_matches, posix_relative
from tieaudit.rules.policy import Policy

_WILDCARDS = frozenset("*?[")


def check_excludes(exclude: Iterable[str]) -> tuple[str, ...]:
    """The --exclude patterns, each checked before anything is walked."""
    patterns = tuple(exclude)
    try:
        for pattern in patterns:
            compile_glob(pattern)
    except UsageError as exc:
        raise UsageError(exc.message, "--exclude") from exc
    return patterns


@dataclass
class ExcludeMatches:
    """What the --exclude patterns of one discovery matched, over every PATH walked."""

    base: str
    """The folder patterns are relative to (the policy file's, or the current one)."""
    matched: set[str] = field(default_factory=set)
    """Patterns that excluded at least one entry."""
    by_path: dict[str, str] = field(default_factory=dict)
    """Pattern -> its spelling relative to base, for patterns that matched only relative to a
    PATH argument (the old base): the first such PATH's."""

    def first_match(self, path: str, walk_root: str, patterns: tuple[str, ...]) -> str:
        """The first pattern naming path relative to base, or (the old base) to the folder argument
        walked, or by its name alone; empty when none does."""
        relative = posix_relative(path, self.base)
        old = posix_relative(path, walk_root)
        for pattern in patterns:
            if glob_matches(pattern, relative):
                self.matched.add(pattern)
                return pattern
            if glob_matches(pattern, old):
                self.matched.add(pattern)
                prefix = posix_relative(walk_root, self.base)
                self.by_path.setdefault(pattern, pattern if prefix == "." else f"{prefix}/{pattern}")
                return pattern
        return ""

    def warnings(self, patterns: Iterable[str], arguments: Iterable[str]) -> tuple[str, ...]:
        """One line per pattern that matched nothing, or matched only relative to a PATH argument."""
        where = "the current folder" if os.path.abspath(self.base) == os.getcwd() else self.base
        lines = []
        for pattern in dict.fromkeys(patterns):
            if pattern not in self.matched:
                lines.append(
                    f"--exclude '{pattern}' matched nothing under {', '.join(arguments)} "
                    f"(globs are relative to {where}, or name a file or folder alone)"
                )
            elif pattern in self.by_path:
                lines.append(
                    f"--exclude '{pattern}' matched relative to the PATH argument, not to {where} "
                    f"(the base of every glob): write --exclude '{self.by_path[pattern]}'"
                )
        return tuple(lines)


def _literal_folder(glob: str) -> str | None:
    """The folder a path glob is about (its components before the first wildcard one), or None for
    a glob that may name a file or folder anywhere by its name alone (one component)."""
    parts = glob.replace(os.sep, "/").rstrip("/").split("/")
    if len(parts) < 2:
        return None
    literal = []
    for part in parts:
        if _WILDCARDS.intersection(part):
            break
        literal.append(part)
    return "/".join(literal) if literal else None


def _overlaps(first: str, second: str) -> bool:
    """One of two absolute paths is the other or lies inside it."""
    return (
        first == second
        or first.startswith(second.rstrip(os.sep) + os.sep)
        or second.startswith(first.rstrip(os.sep) + os.sep)
    )


def _elsewhere(glob: str, policy: Policy, searched: list[str]) -> bool:
    """The glob is about an existing folder that no folder searched overlaps."""
    literal = _literal_folder(glob)
    if literal is None:
        return False
    folder = os.path.abspath(os.path.join(policy.root, literal))
    return os.path.isdir(folder) and not any(_overlaps(folder, path) for path in searched)


def policy_glob_warnings(policy: Policy, targets: Iterable[str], arguments: Iterable[str]) -> list[str]:
    """One line per [[path]] glob naming no checkpoint audited, when the run searched a folder it
    could have named."""
    searched = [os.path.abspath(a) for a in arguments if os.path.isdir(a)]
    if not searched or not policy.paths:
        return []
    return [
        f"{policy.source}: [[path]] glob '{glob}' matched no checkpoint audited "
        f"(globs are relative to {policy.root}, or name a file or folder alone)"
        for glob in policy.unmatched_globs(targets)
        if not _elsewhere(glob, policy, searched)
    ]
