"""Which checkpoints a `check` run audits: files and model folders under the paths given.

A path given on the command line is always audited as it is. A folder is one checkpoint when it is
a Hugging Face model folder (its shards are never listed alone); any other folder is walked. A
walk never follows a link to a folder, follows a link to a file only when the file lies inside the
folder given, and turns every entry it cannot read into one error for that entry (a link loop, a
link target too long, no permission): the other paths are still audited.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tieaudit.core.errors import UsageError
from tieaudit.core.globs import compile_glob, glob_matches, posix_relative
from tieaudit.formats.hf_dir import SAFE_INDEX, TORCH_INDEX, TORCH_SINGLE
from tieaudit.formats.hf_ties import CONFIG
from tieaudit.formats.magic import might_be_torch
from tieaudit.repair.publish import STAGE_INFIX

__all__ = ["Discovery", "PathError", "Target", "discover", "glob_matches", "posix_relative"]

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".onnx")
LINK_OUTSIDE = "is a link to a file outside the folder searched; name it on the command line to audit it"


@dataclass(frozen=True)
class Target:
    """One checkpoint to audit."""

    path: str
    """The file or model folder: the argument itself, or joined under the folder argument."""
    explicit: bool
    """Named on the command line (not found by walking a folder)."""


@dataclass(frozen=True)
class PathError:
    """A path that could not be audited or listed (the run is then incomplete)."""

    path: str
    """The path as given or found."""
    message: str
    """One line: what is wrong."""


@dataclass(frozen=True)
class Discovery:
    """What the arguments name."""

    targets: tuple[Target, ...]
    """Checkpoints to audit, in argument order, then by name within a folder; no duplicates."""
    errors: tuple[PathError, ...]
    """Folders that could not be listed, entries that could not be read or lead outside."""


def _skipped_name(name: str) -> bool:
    # retie's staging folders are hidden too; named here so that a rename never lets one through
    return name.startswith(".") or STAGE_INFIX in name


def _holds_torch_data(path: str) -> bool:
    """A .bin is a PyTorch file (zip, or a protocol 2-5 pickle), not raw bytes such as ONNX
    external data; sniffed here so raw .bin files found by walking are not errors."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return True  # let the audit report why it cannot be read
    return might_be_torch(head)


MODEL_MARKERS = (CONFIG, SAFE_INDEX, TORCH_INDEX)
"""A folder holding one of these next to weights is one Hugging Face model (names as formats.hf_dir
reads them)."""


def is_model_folder(path: str) -> bool:
    """A Hugging Face model folder: config.json or a shard index, next to weight files (a shard
    index alone counts: its shards are what it lists)."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return False
    if not names.intersection(MODEL_MARKERS):
        return False
    weights = (n for n in names if n.endswith(".safetensors") or n == TORCH_SINGLE)
    return any(weights) or bool(names.intersection(MODEL_MARKERS[1:]))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@dataclass(frozen=True)
class _Folder:
    """A folder being walked: its entries still to look at, and how many targets came before it."""

    path: str
    """The folder."""
    entries: Iterator[os.DirEntry[str]]
    """Its entries not yet looked at, by name."""
    found_before: int
    """Targets found before entering it (none found inside: a config.json folder is one target)."""


class _Walk:
    """A depth-first walk of one folder argument, without recursion (a deep tree cannot exhaust
    the stack) and without entering a folder twice (bind mounts cannot make it endless)."""

    def __init__(self, root: str, exclude: tuple[str, ...], errors: list[PathError]) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.exclude = exclude
        self.errors = errors
        self.found = 0
        self.seen: set[tuple[int, int]] = set()
        self.stack: list[_Folder] = []

    def _target(self, path: str) -> Target:
        """The argument itself as given; what is found under it, normalised (no ./ or //)."""
        self.found += 1
        if path == self.root:
            return Target(path, explicit=True)
        return Target(os.path.normpath(path), explicit=False)

    def _error(self, path: str, message: str) -> None:
        self.errors.append(PathError(path, message))

    def _enter(self, folder: str) -> None:
        try:
            status = os.stat(folder)
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            self._error(folder, f"cannot list folder: {_reason(exc)}")
            return
        if (status.st_dev, status.st_ino) in self.seen:
            return  # the same folder again, through a bind mount
        self.seen.add((status.st_dev, status.st_ino))
        self.stack.append(_Folder(folder, iter(entries), self.found))

    def _is_folder(self, entry: os.DirEntry[str]) -> bool | None:
        """A folder to look into (True), a file to consider (False), or None (error recorded)."""
        try:
            return entry.is_dir(follow_symlinks=False)  # a link to a folder is not followed
        except OSError as exc:
            self._error(entry.path, f"cannot read: {_reason(exc)}")
            return None

    def _is_checkpoint(self, entry: os.DirEntry[str]) -> bool:
        """A regular file (a link to one inside the folder searched) with a checkpoint's name."""
        if not entry.name.endswith(CHECKPOINT_SUFFIXES):
            return False
        try:
            link = entry.is_symlink()  # from the listing: known even where lstat is refused
        except OSError:
            link = False
        try:
            status = os.stat(entry.path)  # follows links: loops and over-long targets fail here
        except OSError as exc:
            what = "a link that cannot be followed" if link else "cannot read"
            self._error(entry.path, f"{what}: {_reason(exc)}")
            return False
        if not stat.S_ISREG(status.st_mode):
            return False  # FIFOs, devices, folders reached through links: not checkpoints
        if link and not _inside(os.path.realpath(entry.path), self.real_root):
            self._error(entry.path, LINK_OUTSIDE)
            return False
        return not entry.name.endswith((".bin", ".ckpt")) or _holds_torch_data(entry.path)

    def _excluded(self, entry: os.DirEntry[str]) -> bool:
        relative = posix_relative(entry.path, self.root)
        return any(glob_matches(pattern, relative) for pattern in self.exclude)

    def targets(self) -> Iterator[Target]:
        """Model folders as one target each, other folders walked, checkpoint files found."""
        if is_model_folder(self.root):
            yield self._target(self.root)
            return
        self._enter(self.root)
        while self.stack:
            folder = self.stack[-1]
            entry = next(folder.entries, None)
            if entry is None:
                self.stack.pop()
                # a config.json folder holding nothing to audit (no weights, no ONNX export beside
                # it) is one target: its audit says what is missing
                if self.found == folder.found_before and os.path.lexists(os.path.join(folder.path, CONFIG)):
                    yield self._target(folder.path)
                continue
            if _skipped_name(entry.name) or self._excluded(entry):
                continue
            is_folder = self._is_folder(entry)
            if is_folder and is_model_folder(entry.path):
                yield self._target(entry.path)
            elif is_folder:
                self._enter(entry.path)
            elif is_folder is False and self._is_checkpoint(entry):
                yield self._target(entry.path)


def check_excludes(exclude: Iterable[str]) -> tuple[str, ...]:
    """The --exclude patterns, each checked before anything is walked."""
    patterns = tuple(exclude)
    try:
        for pattern in patterns:
            compile_glob(pattern)
    except UsageError as exc:
        raise UsageError(exc.message, "--exclude") from exc
    return patterns


def discover(arguments: Iterable[str], exclude: Iterable[str] = ()) -> Discovery:
    """Targets for the arguments: files and model folders as given, other folders walked."""
    patterns = check_excludes(exclude)
    targets: dict[str, Target] = {}
    errors: list[PathError] = []
    for argument in arguments:
        if os.path.isdir(argument):
            found: Iterable[Target] = _Walk(argument, patterns, errors).targets()
        else:  # a file, or a missing path: the audit says what is wrong with it
            found = (Target(argument, explicit=True),)
        for target in found:
            targets.setdefault(os.path.abspath(target.path), target)
    return Discovery(tuple(targets.values()), tuple(errors))
