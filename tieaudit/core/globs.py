"""Globs for ``--exclude`` and a policy's ``[[path]]`` entries, checked when they are read.

``**`` spans folders, ``*`` and ``?`` stay inside one, ``[...]`` is a class (``[!...]`` or
``[^...]`` negated, ``a-z`` a range, a ``]`` right after the opening ``[`` a member). A pattern
names a POSIX relative path or its last component. The translation to a regular expression is
written here rather than taken from pathspec/wcmatch (gitignore and bash semantics differ on
``**`` and on names) so that every pattern keeps the meaning it had; a class is rebuilt member by
member, so no pattern can make an invalid or warning-raising regular expression.
"""

from __future__ import annotations

import functools
import os
import re

from tieaudit.core.errors import UsageError
from tieaudit.core.escape import printable

MAX_GLOB_LENGTH = 4096
"""Longest pattern accepted: PATH_MAX, as no longer pattern can name a path on Linux."""
_CLASS_SPECIAL = frozenset("\\]^-[&~|")
"""Characters escaped inside a regex class: its syntax, and the pairs re warns about (&&, ~~, ||, --)."""


def _class_char(char: str) -> str:
    return "\\" + char if char in _CLASS_SPECIAL else char


def _class(body: str, pattern: str) -> str:
    """A regex class for the body of ``[...]`` (without the brackets)."""
    negate = body[:1] in ("!", "^")
    members = body[1:] if negate else body
    parts: list[str] = []
    index = 0
    while index < len(members):
        low = members[index]
        if index + 2 < len(members) and members[index + 1] == "-":
            high = members[index + 2]
            if low > high:
                raise UsageError(
                    f"invalid glob '{printable(pattern)}': range {printable(low)}-{printable(high)} "
                    "is reversed (write the lower end first)"
                )
            parts.append(f"{_class_char(low)}-{_class_char(high)}")
            index += 3
        else:
            parts.append(_class_char(low))
            index += 1
    return "[" + ("^" if negate else "") + "".join(parts) + "]"


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at start, or -1 (then ``[`` is literal)."""
    first = start + 1
    if pattern[first : first + 1] in ("!", "^"):
        first += 1
    return pattern.find("]", first + 1)  # a ']' first in the class is a member


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The pattern as a regular expression; UsageError naming it when it is invalid."""
    if len(pattern) > MAX_GLOB_LENGTH:
        raise UsageError(f"glob of {len(pattern)} characters is longer than {MAX_GLOB_LENGTH}")
    pattern = pattern.replace(os.sep, "/").rstrip("/")
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := _class_end(pattern, i)) > 0:
            parts.append(_class(pattern[i + 1 : end], pattern))
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    try:
        return re.compile("".join(parts) + r"\Z")
    except re.error as exc:  # not expected after the checks above; still one line, never a traceback
        raise UsageError(f"invalid glob '{printable(pattern)}': {exc}") from exc


def glob_matches(pattern: str, relative: str) -> bool:
    """pattern names relative (a POSIX path) or its last component."""
    regex = compile_glob(pattern)
    return bool(regex.match(relative) or regex.match(relative.rsplit("/", 1)[-1]))


def posix_relative(path: str, root: str) -> str:
    """path relative to root, with / separators ('..' where path lies outside root)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root)).replace(os.sep, "/")
