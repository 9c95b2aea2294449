"""Which checkpoints a `check` run audits, and what becomes of every other file under the paths given.

A path given on the command line is always audited as it is. A Hugging Face model folder is one
checkpoint (its shards are never listed alone), and what its reader does not read is searched like
any folder: an ``onnx/`` export, a ``model.fp16.safetensors`` beside ``model.safetensors``, a
``.ckpt`` are audited on their own. Every file found gets a verdict (``gate.files``). A walk
follows a link to a folder inside the folder given never (its files are searched where they lie),
and one leading outside only to search it for code (``gate.hidden``, as hidden folders are); it
follows a link to a file when the file lies inside, or, leading outside, when torch.load would run
code from it; it turns every entry it cannot read into one error for that entry (a link loop, a
link target too long, no permission): the other paths are still audited. An argument that is no path
but a repository id (``org/name[@revision]``) is the snapshot the Hugging Face cache holds for it.

``--exclude`` patterns are relative to one base, as the policy's ``[[path]]`` globs are: the policy
file's folder, or the current folder when there is none. A pattern written relative to the PATH
argument (the base before) still applies where the base misses, and the run says how to write it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tieaudit.core.errors import InputError
from tieaudit.core.globs import glob_matches, posix_relative
from tieaudit.formats.hf_cache import CacheSnapshot, cached_argument
from tieaudit.gate.files import FileVerdict
from tieaudit.gate.glob_use import ExcludeMatches, check_excludes
from tieaudit.gate.targets import Discovery, PathError, Target

__all__ = [
    "Discovery",
    "PathError",
    "Target",
    "discover",
    "folder_checkpoints",
    "glob_matches",
    "posix_relative",
]


def discover(arguments: Iterable[str], exclude: Iterable[str] = (), *, base: str = ".") -> Discovery:
    """Targets for the arguments: files and model folders as given, other folders walked; every
    file found, with its verdict. base: the folder --exclude patterns are relative to."""
    patterns = check_excludes(exclude)
    matches = ExcludeMatches(base)
    targets: dict[str, Target] = {}
    errors: list[PathError] = []
    files: dict[str, FileVerdict] = {}
    from_cache: list[tuple[str, CacheSnapshot]] = []
    for given in arguments:
        try:
            snapshot = cached_argument(given)
        except InputError as exc:  # an id the cache lacks: this argument's error, the others go on
            errors.append(PathError(path=given, message=exc.message))
            files.setdefault(
                os.path.abspath(given), FileVerdict(path=given, verdict="error", reason=exc.message)
            )
            continue
        if snapshot is not None:
            from_cache.append((given, snapshot))
        argument = snapshot.folder if snapshot is not None else given
        if os.path.isdir(argument):
            from tieaudit.gate.walk import FolderWalk  # the format knowledge a walk needs: only here

            walk = FolderWalk(argument, patterns, errors, matches=matches)
            found: Iterable[Target] = list(walk.targets())
            verdicts = walk.files
        else:  # a file, or a missing path: the audit says what is wrong with it
            found = (Target(argument, explicit=True),)
            verdicts = [FileVerdict(path=argument, verdict="audited", target=argument)]
        for target in found:
            targets.setdefault(os.path.abspath(target.path), target)
        for verdict in verdicts:
            files.setdefault(os.path.abspath(verdict.path), verdict)
    return Discovery(
        targets=tuple(targets.values()),
        errors=tuple(errors),
        files=tuple(files.values()),
        from_cache=tuple(from_cache),
        excludes=matches if patterns else None,
    )


def folder_checkpoints(folder: str) -> tuple[bool, tuple[str, ...]]:
    """Whether folder is one model (a model folder, or a config.json folder holding no checkpoint),
    and the checkpoints `check folder` audits besides it (all of them, when it is not one model)."""
    paths = tuple(t.path for t in discover([folder]).targets)
    return folder in paths, tuple(p for p in paths if p != folder)
