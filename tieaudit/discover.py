"""Which checkpoints a `check` run audits: files and model folders under the paths given.

A path given on the command line is always audited as it is. A folder is one checkpoint when it is
a Hugging Face model folder (its shards are never listed alone); any other folder is walked.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".onnx")
MODEL_MARKERS = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
"""A folder holding one of these next to weights is one Hugging Face model."""
STAGE_MARK = ".tieaudit-stage-"
"""retie's temporary outputs (hidden too; named here so a rename never lets one through)."""


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
    """Folders that could not be listed."""


@functools.lru_cache(maxsize=64)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex: ``**`` spans folders, ``*`` and ``?`` stay inside one, ``[...]`` a class."""
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
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            members = (body[1:] if negate else body).replace("\\", "\\\\").replace("[", "\\[")
            parts.append("[" + ("^" if negate else "") + members + "]")
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts) + r"\Z")


def glob_matches(pattern: str, relative: str) -> bool:
    """pattern names relative (a POSIX path) or its last component."""
    regex = _glob_regex(pattern.replace(os.sep, "/").rstrip("/"))
    return bool(regex.match(relative) or regex.match(relative.rsplit("/", 1)[-1]))


def posix_relative(path: str, root: str) -> str:
    """path relative to root, with / separators ('..' where path lies outside root)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root)).replace(os.sep, "/")


def _skipped_name(name: str) -> bool:
    return name.startswith(".") or STAGE_MARK in name


def _holds_torch_data(path: str) -> bool:
    """A .bin is a PyTorch file (zip, or a protocol 2-5 pickle), not raw bytes such as ONNX
    external data; sniffed here so raw .bin files found by walking are not errors."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return True  # let the audit report why it cannot be read
    return head.startswith(b"PK\x03\x04") or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _names(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def is_model_folder(path: str) -> bool:
    """A Hugging Face model folder: config.json or a shard index, next to weight files."""
    names = _names(path)
    if not names.intersection(MODEL_MARKERS):
        return False
    weights = (n for n in names if n.endswith(".safetensors") or n == "pytorch_model.bin")
    return any(weights) or bool(names.intersection(MODEL_MARKERS[1:]))


def _is_candidate(path: str, name: str) -> bool:
    if not name.endswith(CHECKPOINT_SUFFIXES):
        return False
    return not name.endswith(".bin") or _holds_torch_data(path)


def _target(root: str, path: str) -> Target:
    """The argument itself as given; what is found under it, normalised (no ./ or //)."""
    return Target(path, explicit=True) if path == root else Target(os.path.normpath(path), explicit=False)


def _folder(root: str, folder: str, exclude: tuple[str, ...], errors: list[PathError]) -> Iterator[Target]:
    """A model folder as one target; any other folder walked. A config.json folder holding nothing
    to audit (no weights, no ONNX export beside it) is one target too: its audit says what is missing."""
    if is_model_folder(folder):
        yield _target(root, folder)
        return
    found = list(_walk(root, folder, exclude, errors))
    yield from found if found or "config.json" not in _names(folder) else [_target(root, folder)]


def _walk(root: str, folder: str, exclude: tuple[str, ...], errors: list[PathError]) -> Iterator[Target]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        errors.append(PathError(folder, f"cannot list folder: {exc.strerror or exc}"))
        return
    for entry in entries:
        if _skipped_name(entry.name):
            continue
        relative = posix_relative(entry.path, root)
        if any(glob_matches(pattern, relative) for pattern in exclude):
            continue
        if entry.is_dir(follow_symlinks=False):  # linked folders are not followed: no cycles
            yield from _folder(root, entry.path, exclude, errors)
        elif entry.is_file() and _is_candidate(entry.path, entry.name):
            yield _target(root, entry.path)


def discover(arguments: Iterable[str], exclude: Iterable[str] = ()) -> Discovery:
    """Targets for the arguments: files and model folders as given, other folders walked."""
    patterns = tuple(exclude)
    targets: dict[str, Target] = {}
    errors: list[PathError] = []
    for argument in arguments:
        if os.path.isdir(argument):
            found: Iterable[Target] = _folder(argument, argument, patterns, errors)
        else:  # a file, or a missing path: the audit says what is wrong with it
            found = (Target(argument, explicit=True),)
        for target in found:
            targets.setdefault(os.path.abspath(target.path), target)
    return Discovery(tuple(targets.values()), tuple(errors))
