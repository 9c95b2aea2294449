"""ONNX external data: parse a tensor's ``external_data`` entries and confine its file to the
model's folder.

Nothing here opens a file: every check uses ``os.lstat``, so a location that would leave the
folder (``..``, an absolute path, a symlink anywhere on the way) is refused before any byte of
it is read. The bytes are mapped later by the ByteStore, relative to the model's folder, which
checks when it opens the file that it is still the one checked here (``ByteStore.pin``).

The refusals mirror onnx's own (``resolve_external_data_location`` and ``open_external_data`` in
onnx/checker.cc, onnx 1.23): an absolute location; ``..`` anywhere in the location, a file name
such as ``w..bin`` included (onnx searches the normalised location for the two characters); a
symbolic link; anything but a regular file; and a file with more than one hard link (a hard link
made inside the folder reaches a file outside it, which no path check can see).

Where onnx's loader (``onnx.load`` + ``numpy_helper.to_array``) and ONNX Runtime could read
different bytes for one entry, the entry is refused rather than read one way: a backslash (a
separator on Windows, a file-name character elsewhere), numbers spelled other than as plain
digits (Python's ``int`` accepts ``+1``, `` 1`` and ``1_0``; C++ parsers do not), and a missing
length where bytes follow the tensor (onnx reads to the end of the file, ONNX Runtime reads what
the shape needs).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from tieaudit.core.errors import InputError, UnsafeInputError
from tieaudit.core.escape import quoted

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


def _parse_int(what: str, key: str, value: str, *, model_path: str) -> int:
    # At most 20 digits (2**64 has 20): int() refuses more than 4300, and no file is that large.
    if not re.fullmatch(r"[0-9]{1,20}", value):
        raise InputError(f"{what}: external data {key} {quoted(value, 40)} is not a count", model_path)
    return int(value)


def location_parts(what: str, location: str, model_path: str) -> list[str]:
    """The components of a relative location; refuses absolute paths, ``..`` and backslashes."""
    refuse = f"{what}: external data location {quoted(location)}"
    if "\x00" in location:
        raise UnsafeInputError(f"{refuse} contains a NUL byte", model_path)
    # Backslashes count as separators for these checks: the same file is read on Windows as well.
    if location.startswith(("/", "\\")) or _DRIVE.match(location) or os.path.isabs(location):
        raise UnsafeInputError(f"{refuse} is absolute; only the model's folder is read", model_path)
    if ".." in re.split(r"[/\\]", location):
        raise UnsafeInputError(f"{refuse} contains '..'; only the model's folder is read", model_path)
    if ".." in location:  # onnx refuses '..' anywhere, within a file name too
        raise UnsafeInputError(f"{refuse} contains '..' in a name, which onnx.load refuses", model_path)
    if "\\" in location:
        raise InputError(
            f"{refuse} contains a backslash, a folder separator on Windows but part of the file "
            "name elsewhere: loaders could read different files",
            model_path,
        )
    parts = location.split("/")
    if parts[-1] in ("", "."):
        raise InputError(f"{refuse} names a folder, not a file", model_path)
    return [part for part in parts if part not in ("", ".")]


def hard_links_refused(refuse: str, links: int) -> str:
    """The refusal of external data with several hard links (onnx.load refuses it: one of the
    links may have been made to a file outside the model's folder)."""
    return (
        f"{refuse} is a file with {links} hard links, which onnx.load refuses: a hard link can "
        "reach a file outside the model's folder"
    )


class ExternalFiles:
    """Confines external-data locations to one model's folder; each location is checked once."""

    def __init__(self, model_dir: str, model_path: str) -> None:
        self.model_dir = model_dir
        self.model_path = model_path
        self.root = os.path.realpath(model_dir)
        self._checked: dict[str, tuple[str, int]] = {}
        self.identities: dict[str, tuple[int, int]] = {}
        """Normalised location -> (device, inode) of the file checked: what opening it must find."""

    def _lstat_components(self, parts: list[str], refuse: str) -> os.stat_result:
        current = self.model_dir
        status: os.stat_result | None = None
        for part in parts:
            current = os.path.join(current, part)
            try:
                status = os.lstat(current)
            except FileNotFoundError as exc:
                raise InputError(f"{refuse}: {quoted(current)} does not exist", self.model_path) from exc
            except OSError as exc:
                raise InputError(
                    f"{refuse}: cannot stat {quoted(current)}: {exc.strerror or exc}", self.model_path
                ) from exc
            if stat.S_ISLNK(status.st_mode):
                raise UnsafeInputError(
                    f"{refuse} goes through the symbolic link {quoted(current)}", self.model_path
                )
        assert status is not None  # parts is never empty
        return status

    def file(self, what: str, location: str) -> tuple[str, int]:
        """(normalised location, size) of a regular file inside the model's folder."""
        known = self._checked.get(location)
        if known is not None:
            return known
        parts = location_parts(what, location, self.model_path)
        refuse = f"{what}: external data location {quoted(location)}"
        status = self._lstat_components(parts, refuse)
        if not stat.S_ISREG(status.st_mode):
            raise InputError(f"{refuse} is not a regular file", self.model_path)
        resolved = os.path.realpath(os.path.join(self.model_dir, *parts))
        if os.path.commonpath([self.root, resolved]) != self.root:
            raise UnsafeInputError(
                f"{refuse} resolves to {quoted(resolved)}, outside the model's folder", self.model_path
            )
        if status.st_nlink > 1:
            raise UnsafeInputError(hard_links_refused(refuse, status.st_nlink), self.model_path)
        normalised = "/".join(parts)
        self.identities[normalised] = (status.st_dev, status.st_ino)
        self._checked[location] = (normalised, status.st_size)
        return self._checked[location]

    def extent(self, what: str, entries: Iterable[tuple[str, str]], expected: int | None) -> ExternalRange:
        """The confined byte range ``entries`` name; ``expected`` is the byte count the tensor's
        shape and dtype need (None for a tensor tieaudit does not read: only the range is checked)."""
        fields = dict(entries)  # a repeated key: the last counts, for onnx and ONNX Runtime alike
        location = fields.get("location", "")
        if not location:
            raise InputError(f"{what}: external data has no location", self.model_path)
        offset = (
            _parse_int(what, "offset", fields["offset"], model_path=self.model_path)
            if "offset" in fields
            else 0
        )
        given = (
            _parse_int(what, "length", fields["length"], model_path=self.model_path)
            if "length" in fields
            else None
        )
        if given is not None and expected is not None and given != expected:
            raise InputError(
                f"{what}: external data length {given} does not match its shape and dtype ({expected} bytes)",
                self.model_path,
            )
        file, size = self.file(what, location)
        if given is not None:
            length = given
        elif expected is None:
            length = max(size - offset, 0)  # onnx reads from offset to the end of the file
        else:
            length = expected
            if offset <= size and size - offset > expected:
                raise InputError(
                    f"{what}: external data has no length and {quoted(file)} holds {size - offset} "
                    f"bytes after offset {offset}, not the {expected} its shape and dtype need "
                    "(onnx would read them all, ONNX Runtime only the first)",
                    self.model_path,
                )
        if offset > size or offset + length > size:
            raise InputError(
                f"{what}: external data location {quoted(location)}: bytes {offset}..{offset + length} "
                f"run past the end of the {size}-byte file",
                self.model_path,
            )
        return ExternalRange(file, offset, length)
