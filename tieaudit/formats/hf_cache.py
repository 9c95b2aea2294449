"""The Hugging Face hub cache, read offline: a repository id to its snapshot folder, and whether a
path lies in a cache snapshot (so that nothing suggests writing there).

The layout is huggingface_hub's (``file_download.try_to_load_from_cache``): the cache folder
(``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``) holds ``models--ORG--NAME``
with ``refs/<revision>`` (a file holding a commit hash), ``snapshots/<commit>/`` (files are links
into ``../../blobs``) and ``blobs/``. A revision is a name under ``refs/`` or a snapshot folder's
name itself (a commit hash). Nothing here downloads, imports huggingface_hub or opens a socket.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tieaudit.core.errors import InputError
from tieaudit.core.escape import printable
from tieaudit.core.limits import NotRegularFile, TooLarge, read_limited
from tieaudit.core.shell import shell_command
from tieaudit.formats.capabilities import FILE_SUFFIXES

__all__ = [
    "CacheSnapshot",
    "cache_note",
    "cached_argument",
    "hub_address",
    "hub_cache_dir",
    "in_hub_cache",
    "looks_like_repo_id",
    "resolve",
    "snapshot_of",
]

DEFAULT_REVISION = "main"
MAX_REF_BYTES = 1024
"""Largest refs/<revision> file read: it holds one 40-character commit hash."""
REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)
"""huggingface_hub's REPO_ID_REGEX: an optional namespace, then the name."""
NOT_REPO_SUFFIXES = (*FILE_SUFFIXES, ".json", ".h5", ".git")
"""A missing argument ending like a checkpoint file (``formats.capabilities``), a JSON or HDF5 file,
or a git repository is a missing path, never looked up as a repository."""
REPO_FOLDER = re.compile(r"models--(.+)")
DOWNLOAD = ("hf", "download")
"""The command that fetches a repository into the cache: huggingface_hub's ``hf`` (1.0 on; its
``huggingface-cli`` is gone), ``hf download REPO_ID [--revision REVISION]``."""


@dataclass(frozen=True, kw_only=True)
class CacheSnapshot:
    """One snapshot of a model repository in a hub cache."""

    repo_id: str
    """The repository id (``org/name`` or ``name``)."""
    repo_folder: str
    """The repository's cache folder, ``.../models--ORG--NAME``: links of the snapshot stay in it."""
    revision: str
    """The snapshot folder's name: the commit hash the revision resolved to."""
    folder: str
    """The snapshot folder, ``<repo_folder>/snapshots/<revision>``."""


def hub_cache_dir(environ: Mapping[str, str] | None = None) -> str:
    """The hub cache folder, from the same variables and defaults huggingface_hub reads."""
    env = os.environ if environ is None else environ

    def expand(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return expand(env[name])
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.join(expand(home), "hub")


def split_revision(argument: str) -> tuple[str, str]:
    """``org/name@revision`` -> (``org/name``, ``revision``); the revision defaults to main."""
    repo_id, at, revision = argument.partition("@")
    return repo_id, revision if at else DEFAULT_REVISION


def looks_like_repo_id(argument: str) -> bool:
    """Whether a path that does not exist is read as a repository id (``org/name``, ``name``, each
    with an optional ``@revision``): huggingface_hub's rule, and no file suffix."""
    repo_id, revision = split_revision(argument)
    return (
        REPO_ID.fullmatch(repo_id) is not None
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(NOT_REPO_SUFFIXES)
        and _safe_revision(revision)
    )


def _safe_revision(revision: str) -> bool:
    """A revision names a file under refs/ (``refs/pr/1`` too) or a snapshot: no empty, . or .. part."""
    parts = revision.split("/")
    return (
        bool(revision)
        and "\\" not in revision
        and "\0" not in revision
        and all(part not in ("", ".", "..") for part in parts)
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_ref(path: str) -> str | None:
    """The commit a refs/ file names; None when there is no such regular file (a FIFO is never
    waited on) or it holds no plausible snapshot name."""
    try:
        data = read_limited(path, MAX_REF_BYTES, os.path.basename(path))
    except (TooLarge, NotRegularFile, OSError):
        return None
    text = data.decode("utf-8", "replace").strip()
    return text if _safe_revision(text) and "/" not in text else None


def resolve(argument: str, cache: str | None = None) -> CacheSnapshot:
    """The snapshot ``org/name[@revision]`` names in the cache (default: hub_cache_dir()), offline.

    The revision is looked up in ``refs/`` first (a branch or tag), else taken as a snapshot
    folder's name (a commit hash), as huggingface_hub does. InputError, naming the cache, when the
    repository or the revision is not there, or the snapshot folder is a link leading outside
    the repository's folder.
    """
    cache = hub_cache_dir() if cache is None else cache
    repo_id, revision = split_revision(argument)
    repo_folder = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    where = f"the Hugging Face cache at {cache}"
    if not os.path.isdir(repo_folder):
        raise InputError(
            f"no such file or folder, and not in {where} (tieaudit never downloads: "
            f"`{shell_command(*DOWNLOAD, repo_id)}` fetches it)",
            argument,
        )
    snapshots = os.path.join(repo_folder, "snapshots")
    commit = _read_ref(os.path.join(repo_folder, "refs", revision)) or revision
    folder = os.path.join(snapshots, commit)
    if "/" in commit or not os.path.isdir(folder):
        raise InputError(
            f"revision {revision} of {repo_id} is not in {where} (tieaudit never downloads: "
            f"`{shell_command(*DOWNLOAD, repo_id, '--revision', revision)}` fetches it)",
            argument,
        )
    if not _inside(os.path.realpath(folder), os.path.realpath(repo_folder)):
        raise InputError(f"snapshot {printable(commit)} is a link leading outside {repo_folder}", argument)
    return CacheSnapshot(repo_id=repo_id, repo_folder=repo_folder, revision=commit, folder=folder)


def _views(path: str) -> tuple[str, ...]:
    """path as named, resolved, and with only its folder resolved (a snapshot's file resolves into
    the blobs, its folder into the snapshot)."""
    absolute = os.path.abspath(path)
    folder = os.path.realpath(os.path.dirname(absolute))
    return absolute, os.path.join(folder, os.path.basename(absolute)), os.path.realpath(absolute)


def _layout(path: str, inner: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(repository folder, parts below it) when path runs ``.../models--X/<one of inner>/...``."""
    parts = path.split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in inner and REPO_FOLDER.fullmatch(parts[i - 1]):
            return os.sep.join(parts[:i]), parts[i:]
    return None


def _snapshot_view(path: str) -> tuple[CacheSnapshot, list[str]] | None:
    """The snapshot path lies in, and the parts of path below the snapshot folder."""
    for view in _views(path):
        found = _layout(view, ("snapshots",))
        if found is not None and len(found[1]) > 1 and found[1][1]:
            repo_folder, below = found
            match = REPO_FOLDER.fullmatch(os.path.basename(repo_folder))
            assert match is not None
            snapshot = CacheSnapshot(
                repo_id=match.group(1).replace("--", "/"),
                repo_folder=repo_folder,
                revision=below[1],
                folder=os.path.join(repo_folder, "snapshots", below[1]),
            )
            return snapshot, [part for part in below[2:] if part]
    return None


def snapshot_of(path: str) -> CacheSnapshot | None:
    """The hub cache snapshot path lies in (``.../models--ORG--NAME/snapshots/<revision>/...``), by
    its layout wherever the cache is, as named or through links; None elsewhere."""
    found = _snapshot_view(path)
    return found[0] if found is not None else None


def hub_address(path: str) -> str | None:
    """``hf://ORG/NAME[/file]`` for a path in a cache snapshot (huggingface_hub's HfFileSystem
    spelling): the same for every revision and every machine's cache; None elsewhere."""
    found = _snapshot_view(path)
    if found is None:
        return None
    snapshot, inner = found
    return "/".join([f"hf://{snapshot.repo_id}", *inner])


def in_hub_cache(path: str) -> bool:
    """Whether path lies in a hub cache repository's snapshots, blobs or refs (by layout, as named
    or through links): a place huggingface_hub owns, where nothing should be written."""
    return any(_layout(view, ("snapshots", "blobs", "refs")) is not None for view in _views(path))


def cached_argument(argument: str, cache: str | None = None) -> CacheSnapshot | None:
    """The cache snapshot a command-line PATH names: None when it is a path (it exists, even as a
    dangling link) or cannot be a repository id; InputError when it is an id the cache lacks."""
    if os.path.lexists(argument) or not looks_like_repo_id(argument):
        return None
    return resolve(argument, cache)


def cache_note(argument: str, snapshot: CacheSnapshot, *, verb: str = "audited") -> str:
    """The one stderr note saying which snapshot a repository id was audited (or read) from."""
    return f"note: {argument}: {verb} snapshot {snapshot.revision} from {snapshot.repo_folder}"
