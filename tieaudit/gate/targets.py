"""What a folder search yields: the checkpoints to audit, the paths that could not be, and the
verdict of every file found (``gate.discover`` builds them)."""

from __future__ import annotations

from dataclasses import dataclass

from tieaudit.formats.hf_cache import CacheSnapshot
from tieaudit.gate.files import FileVerdict
from tieaudit.gate.glob_use import ExcludeMatches

__all__ = ["Discovery", "PathError", "Target"]


@dataclass(frozen=True)
class Target:
    """One checkpoint to audit."""

    path: str
    """The file or model folder: the argument itself, or joined under the folder argument."""
    explicit: bool
    """Named on the command line (not found by walking a folder)."""


@dataclass(frozen=True, kw_only=True)
class PathError:
    """A path that could not be audited or listed (the run is then incomplete)."""

    path: str
    """The path as given or found."""
    message: str
    """One line: what is wrong."""
    lfs_pointer: bool = False
    """The path (or a file of the model folder) is a Git LFS pointer: skipped under --skip-lfs-pointers."""
    data_of: tuple[str, ...] = ()
    """The path is external data of these ONNX models: covered when one of them is audited."""


@dataclass(frozen=True, kw_only=True)
class Discovery:
    """What the arguments name."""

    targets: tuple[Target, ...]
    """Checkpoints to audit, in argument order, then by name within a folder; no duplicates."""
    errors: tuple[PathError, ...]
    """Folders that could not be listed, entries that could not be read or lead outside."""
    files: tuple[FileVerdict, ...] = ()
    """Every file found (and every folder not entered), in walk order, with its verdict so far."""
    from_cache: tuple[tuple[str, CacheSnapshot], ...] = ()
    """Arguments that name no path but a repository in the Hugging Face cache, with the snapshot
    searched in their place (``formats.hf_cache``)."""
    excludes: ExcludeMatches | None = None
    """What each --exclude pattern matched (None without patterns)."""
