"""ONNX external data: parse a tensor's ``external_data`` entries and confine its file to the
model's folder.

Nothing here opens a file: every check uses ``os.lstat``, so a location that would leave the
folder (``..``, an absolute path, a symlink anywhere on the way) is refused before any byte of
it is read. The bytes are mapped later by the ByteStore, relative to the model's folder.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from tieaudit.errors import InputError, UnsafeInputError

_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ExternalRange:
    """Where one tensor's bytes live outside the protobuf."""

    file: str
    """Location, normalised, relative to the model's folder (``/``-separated)."""
    offset: int
    """Offset of the first byte in that file."""
    length: int
    """Number of bytes."""


def _parse_int(tensor: str, key: str, value: str, model_path: str) -> int:
    # At most 20 digits (2**64 has 20): int() refuses more than 4300, and no file is that large.
    if not re.fullmatch(r"[0-9]{1,20}", value):
        raise InputError(
            f"initializer {tensor!r}: external data {key} {value[:40]!r} is not a count", model_path
        )
    return int(value)


def parse_entries(
    tensor: str, entries: Iterable[tuple[str, str]], expected: int, model_path: str
) -> tuple[str, int, int]:
    """``(location, offset, length)`` from ``external_data`` key/value pairs.

    A missing length means ``expected`` (numel * itemsize); a different one is an error.
    """
    fields = dict(entries)
    location = fields.get("location", "")
    if not location:
        raise InputError(f"initializer {tensor!r}: external data has no location", model_path)
    offset = _parse_int(tensor, "offset", fields["offset"], model_path) if "offset" in fields else 0
    length = _parse_int(tensor, "length", fields["length"], model_path) if "length" in fields else expected
    if length != expected:
        raise InputError(
            f"initializer {tensor!r}: external data length {length} does not match its shape "
            f"and dtype ({expected} bytes)",
            model_path,
        )
    return location, offset, length


def location_parts(tensor: str, location: str, model_path: str) -> list[str]:
    """The components of a relative location; refuses absolute paths and ``..``."""
    refuse = f"initializer {tensor!r}: external data location {location!r}"
    if "\x00" in location:
        raise UnsafeInputError(f"{refuse} contains a NUL byte", model_path)
    # Backslashes count as separators too: the same file is read on Windows as well.
    if location.startswith(("/", "\\")) or _DRIVE.match(location) or os.path.isabs(location):
        raise UnsafeInputError(f"{refuse} is absolute; only the model's folder is read", model_path)
    parts = [part for part in re.split(r"[/\\]", location) if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeInputError(f"{refuse} contains '..'; only the model's folder is read", model_path)
    if not parts:
        raise InputError(f"{refuse} names no file", model_path)
    return parts


def _lstat_components(model_dir: str, parts: list[str], refuse: str, model_path: str) -> os.stat_result:
    current = model_dir
    status: os.stat_result | None = None
    for part in parts:
        current = os.path.join(current, part)
        try:
            status = os.lstat(current)
        except FileNotFoundError as exc:
            raise InputError(f"{refuse}: {current} does not exist", model_path) from exc
        except OSError as exc:
            raise InputError(f"{refuse}: cannot stat {current}: {exc.strerror or exc}", model_path) from exc
        if stat.S_ISLNK(status.st_mode):
            raise UnsafeInputError(f"{refuse} goes through the symbolic link {current}", model_path)
    assert status is not None  # parts is never empty
    return status


def confine(
    tensor: str, location: str, offset: int, length: int, model_dir: str, model_path: str
) -> ExternalRange:
    """Check that ``location`` is a regular file inside ``model_dir`` holding ``offset + length`` bytes."""
    parts = location_parts(tensor, location, model_path)
    refuse = f"initializer {tensor!r}: external data location {location!r}"
    status = _lstat_components(model_dir, parts, refuse, model_path)
    if not stat.S_ISREG(status.st_mode):
        raise InputError(f"{refuse} is not a regular file", model_path)
    root = os.path.realpath(model_dir)
    resolved = os.path.realpath(os.path.join(model_dir, *parts))
    if os.path.commonpath([root, resolved]) != root:
        raise UnsafeInputError(f"{refuse} resolves to {resolved}, outside the model's folder", model_path)
    if offset + length > status.st_size:
        raise InputError(
            f"{refuse}: bytes {offset}..{offset + length} run past the end of the {status.st_size}-byte file",
            model_path,
        )
    return ExternalRange("/".join(parts), offset, length)
