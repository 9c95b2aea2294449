"""Work on input bounded before it happens: metadata files read without trusting their size or
nesting, and arithmetic on sizes taken from files.

A policy, a baseline, config.json or a shard index is read whole and parsed, so its size is checked
before reading (a sparse 1.5 GiB config.json would otherwise cost 3 GB of memory) and again while
reading (a file growing meanwhile), and its nesting after parsing (code walking it must not recurse
without bound). A FIFO or device is refused before anything blocks on it.

A shape read from a file can hold integers of thousands of digits; multiplied together they take
seconds to compute and cannot even be printed (Python's int-to-str limit is 4300 digits). Every
product of sizes from input goes through ``bounded_product``, which checks the bound before each
multiplication, so no intermediate ever grows past it.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable
from typing import Any

from tieaudit.core.errors import one_line
from tieaudit.core.units import human_bytes

_CHUNK = 1 << 20
"""Bytes asked of the kernel per read."""


class TooLarge(Exception):
    """A file larger than the limit for its kind (checked before reading)."""

    def __init__(self, size: int, limit: int, name: str) -> None:
        super().__init__(f"{name} is {human_bytes(size)}, over the {human_bytes(limit)} limit")
        self.size = size
        self.limit = limit


class NotRegularFile(OSError):
    """A FIFO, device, socket or folder where a file is expected (reading it could block forever)."""


def read_limited(path: str, limit: int, name: str) -> bytes:
    """The whole regular file at path; TooLarge past limit bytes, NotRegularFile or OSError else.

    name is how a message calls the file (``config.json``). At most limit + 1 bytes are ever read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOCTTY", 0)  # a terminal given as the file never becomes ours
    fd = os.open(path, flags)  # non-blocking: opening a FIFO returns at once instead of waiting
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise NotRegularFile(0, "not a regular file")
        if status.st_size > limit:
            raise TooLarge(status.st_size, limit, name)
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(_CHUNK, remaining))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # grew after the size was checked
        raise TooLarge(len(data), limit, name)
    return data


def nesting_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether lists and dicts nest deeper than limit in value (parsed JSON or TOML).

    Iterative and stopping at the first container past the limit: each container is visited once.
    """
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def parse_failure(exc: ValueError | RecursionError) -> str:
    """Why JSON or TOML text could not be parsed, in one line a user understands."""
    if isinstance(exc, RecursionError):
        return "arrays or objects nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    if "integer string conversion" in str(exc):  # int()'s digit limit (CVE-2020-10735)
        limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
        return f"an integer has more than {limit} digits"
    return one_line(exc, 200)


# --- arithmetic on sizes from files ----------------------------------------------------------

U64_MAX = 2**64 - 1
"""Largest value of a u64 field (safetensors dims and offsets, zip64 sizes)."""
NPY_INTP_MAX = 2**63 - 1
"""Largest element count, byte extent, stride or offset a numpy view can express (npy_intp)."""


def bounded_product(factors: Iterable[int], bound: int) -> int | None:
    """The product of non-negative factors, left to right, or None as soon as a factor or a partial
    product would exceed bound (a later zero does not undo that: Rust's ``checked_mul`` fold, which
    the safetensors library uses, fails the same way)."""
    product = 1
    for factor in factors:
        if factor > bound or (factor and product > bound // factor):
            return None
        product *= factor
    return product


def shown_int(value: int) -> str:
    """value for a message: digits when it fits 64 bits, its size otherwise (str() of an int past
    4300 digits raises, and one of 4000 would fill the line)."""
    return str(value) if value.bit_length() <= 64 else f"<a {value.bit_length()}-bit number>"


def shown_dims(shape: Iterable[int], limit: int = 8) -> str:
    """A shape for a message, like ``[16, 4]``, at most limit dimensions shown."""
    dims = list(shape)
    more = ", ..." if len(dims) > limit else ""
    return "[" + ", ".join(shown_int(dim) for dim in dims[:limit]) + more + "]"
