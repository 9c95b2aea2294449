"""Reading small metadata files from input without trusting their size or their nesting.

A policy, a baseline, config.json or a shard index is read whole and parsed, so its size is checked
before reading (a sparse 1.5 GiB config.json would otherwise cost 3 GB of memory) and again while
reading (a file growing meanwhile), and its nesting after parsing (code walking it must not recurse
without bound). A FIFO or device is refused before anything blocks on it.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

from tieaudit.errors import one_line
from tieaudit.units import human_bytes

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
