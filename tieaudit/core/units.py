"""Human-readable sizes, both ways: 1536 -> '1.5 KiB', and '4GiB' / '512MB' / '1048576' -> bytes;
counts with the noun agreeing: plural(1, 'error') -> '1 error', plural(2, 'copy') -> '2 copies'; and
the numbers options take checked (no NaN, no infinity: ``checked_seconds``, ``checked_tolerance``)."""

from __future__ import annotations

import math
import re

from tieaudit.core.errors import UsageError

SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
"""Suffixes parse_size accepts (any letter case): decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB, B or none."""
MAX_SIZE_TEXT = 64
"""Characters of a size argument: '1099511627776' is 13; anything longer is not a size someone typed."""
MAX_SECONDS = 86_400.0
"""Longest wait an option accepts (--connect-timeout, --timeout): a day. Longer, or infinite, or NaN
(which compares false with everything, so no deadline is ever reached) is a typo, not a plan."""
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
_AMBIGUOUS = {"k": "kB", "m": "MB", "g": "GB", "t": "TB"}


def human_bytes(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """'4GiB' -> 4294967296, '512MB' -> 512000000, '1.5KiB' -> 1536, '1048576' -> 1048576 (bytes).

    Decimal units are powers of 1000 and binary ones powers of 1024, as in human_bytes; a bare
    number is bytes; fractions round down to whole bytes. A one-letter unit ('4G') is refused:
    it means GB to some tools and GiB to others. ValueError says what is wrong, in one line.
    """
    stripped = text.strip()
    if len(stripped) > MAX_SIZE_TEXT:
        raise ValueError(f"a size is at most {MAX_SIZE_TEXT} characters, like 4GiB, 512MB or 1048576")
    match = _SIZE.fullmatch(stripped.lower())
    if match is None:
        raise ValueError(f"{stripped!r} is not a size: use a number of bytes or a unit, like 4GiB or 512MB")
    number, unit = match.groups()
    if unit in _AMBIGUOUS:
        big = _AMBIGUOUS[unit]
        raise ValueError(
            f"{stripped!r} is ambiguous: say {number}{big} (x1000) or {number}{big[0]}iB (x1024)"
        )
    if unit not in SIZE_UNITS:
        raise ValueError(f"{stripped!r}: unknown unit {unit!r} (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)")
    whole, _, fraction = number.partition(".")
    scale = SIZE_UNITS[unit]
    parts = (int(fraction) * scale) // 10 ** len(fraction) if fraction else 0
    return int(whole) * scale + parts


def checked_seconds(seconds: float, option: str) -> float:
    """seconds when it is a finite number above 0 and at most MAX_SECONDS; else UsageError naming
    option (nan, inf, '1e400' which reads as inf, 0, negative)."""
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_SECONDS:
        raise UsageError(f"{option} {seconds}: give a number of seconds above 0 and at most {MAX_SECONDS:g}")
    return seconds


def checked_tolerance(value: float, option: str) -> float:
    """value when it is a finite number of at least 0; else UsageError naming option (a NaN tolerance
    would accept every difference, as no comparison with it is true)."""
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{option} {value}: give a finite number of at least 0")
    return value


_IRREGULAR = {"is": "are", "was": "were", "has": "have", "this": "these", "that": "those", "it": "they"}
"""Words whose plural is not the noun rule's (verbs and pronouns that agree with a count)."""


def plural_word(word: str) -> str:
    """The plural of one English word: 'copy' -> 'copies', 'entry' -> 'entries', 'class' ->
    'classes', 'is' -> 'are', 'tensor' -> 'tensors'."""
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """'1 error', '0 errors', '2 copies', '3 baselined findings': the count and the noun agreeing
    with it (the last word of the noun is made plural, or plural_form is used when given)."""
    if count == 1:
        return f"{count} {noun}"
    if plural_form is None:
        head, _, last = noun.rpartition(" ")
        plural_form = f"{head} {plural_word(last)}" if head else plural_word(last)
    return f"{count} {plural_form}"


def agree(count: int, word: str) -> str:
    """A word agreeing with a count, without the count: agree(2, 'is') -> 'are'."""
    return word if count == 1 else plural_word(word)
