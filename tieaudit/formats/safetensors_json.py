"""A safetensors header's JSON, accepted only where the safetensors library's parser accepts it.

The library parses headers with serde_json (Rust). Python's json module is more lenient in ways
a crafted header can use to make tieaudit read a file the library refuses: it guesses UTF-16 and
UTF-32 from the bytes, accepts ``NaN`` and ``Infinity``, turns ``1e400`` into infinity and a
300-digit integer into an int (serde: out of range, or a float), keeps lone surrogate escapes
(``"\\ud800"``), nests as deep as the interpreter's stack allows, and keeps the last of two equal
keys without a word. Each of those is refused here, with the library's limit where it has one
(checked by running it on crafted headers: tests/test_differential_safetensors.py).

Duplicate keys are refused everywhere, although the library itself keeps the last of two tensor
entries with one name, and the last of two equal keys inside ``__metadata__``, silently (it
refuses a repeated field inside an entry and a repeated ``__metadata__``): other readers of the
format keep the first, so such a file means different tensors to different loaders.
"""

from __future__ import annotations

import json
import math
import sys
from typing import NoReturn

from tieaudit.core.escape import quoted
from tieaudit.core.limits import U64_MAX

MAX_DEPTH = 127
"""Deepest nesting of objects and lists: serde_json's recursion limit (128) refuses any deeper."""
_I64_MIN = -(2**63)
_DBL_MAX = sys.float_info.max


class HeaderJsonError(ValueError):
    """The header is not JSON the safetensors library would accept; the message says why."""


class DuplicateKeyError(HeaderJsonError):
    """A key appears twice in one JSON object: readers differ on which one counts."""


def _refuse(message: str) -> NoReturn:
    raise HeaderJsonError(message)


def _parse_float(text: str) -> float:
    value = float(text)
    # serde_json refuses numbers past the largest double; near it its rounding is looser than
    # Python's, so anything that rounds to the largest double is refused too.
    if math.isinf(value) or abs(value) == _DBL_MAX:
        _refuse(f"the number {text[:24]}{'...' if len(text) > 24 else ''} is out of range")
    return value


def _parse_int(text: str) -> int | float:
    if text == "-0":  # serde_json keeps the sign: a float, which no shape or offset accepts
        return -0.0
    digits = len(text) - text.startswith("-")
    if digits <= 20:  # int() of at most 20 digits is cheap and within Python's digit limit
        value = int(text)
        if _I64_MIN <= value <= U64_MAX:
            return value
    # serde_json reads an integer outside i64/u64 as a double; the shape and offset checks then
    # refuse it as not an integer, as the library does ("invalid type: floating point").
    return _parse_float(text)


def _parse_constant(name: str) -> NoReturn:
    _refuse(f"{name} is not a JSON number")


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(
                    f"the key {quoted(key, 80)} appears twice in one object, and JSON readers "
                    "differ on which one counts"
                )
            seen.add(key)
    return result


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(root: object, may_hold_surrogates: bool) -> None:
    """Refuse nesting past MAX_DEPTH and strings holding lone surrogates, without recursion."""
    stack: list[tuple[object, int]] = [(root, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)) and depth > MAX_DEPTH:
            _refuse(f"nested deeper than {MAX_DEPTH} levels, the safetensors library's limit")
        if isinstance(item, dict):
            for key, child in item.items():
                if may_hold_surrogates and _has_surrogate(key):
                    _refuse(f"the key {quoted(key)} holds a lone UTF-16 surrogate escape")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and may_hold_surrogates and _has_surrogate(item):
            _refuse(f"the string {quoted(item)} holds a lone UTF-16 surrogate escape")


def parse_header_json(raw: bytes) -> object:
    """The header's JSON value; HeaderJsonError (or RecursionError, for nesting past the stack)
    when the safetensors library would refuse it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _refuse(f"not UTF-8: byte {exc.start} is {raw[exc.start : exc.start + 1]!r}")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_float=_parse_float,
            parse_int=_parse_int,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as exc:
        _refuse(f"{exc.msg} at line {exc.lineno} column {exc.colno}")
    # Only a \u escape can put a surrogate into a string decoded from valid UTF-8.
    _check_tree(value, "\\u" in text)
    return value
