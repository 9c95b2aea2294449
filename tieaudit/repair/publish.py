"""Where retie's output goes: IN and OUT resolved and checked once, a staging folder beside OUT,
renames that never overwrite, and an --in-place that keeps the original reachable at every instant.

Every comparison and every filesystem call uses the resolved paths (``core.fsops.canonical``), so
``IN/.``, ``IN/``, ``nosuchdir/../IN`` or a link cannot name IN once checked and another entry
once written. OUT is refused when it is IN (same path or same inode) without --in-place, or lies
inside an IN folder. Publishing uses RENAME_NOREPLACE: whatever appears at OUT while retie runs
is left as it is. --in-place keeps the original at IN or its backup IN.tieaudit-backup at every
instant: a file gets a hard link IN.tieaudit-backup before the new file is renamed over IN; a folder
output is first moved to IN.tieaudit-backup, then swapped with IN (RENAME_EXCHANGE). A run killed in
between leaves traces the next run names. The backup's name is one ``check`` skips (gate.discover):
a backup folder is a whole model folder, which would otherwise be audited beside the new one.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass

from tieaudit.core.errors import OutputError, UsageError
from tieaudit.core.escape import printable
from tieaudit.core.fsops import (
    UNSUPPORTED,
    CanonicalPath,
    canonical,
    ends_in_folder_marker,
    exchange,
    fsync_path,
    rename_noreplace,
    same_entry,
)
from tieaudit.formats.hf_cache import in_hub_cache
from tieaudit.repair import BACKUP_SUFFIX, LEGACY_BACKUP_SUFFIX, STAGE_INFIX

IN_PLACE_MARKER = "in-place-original"
"""In the stage of an --in-place folder run: 'device inode' of IN before the swap."""
LINK_UNSUPPORTED = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV})
"""What link(2) answers where the filesystem has no hard links (or no more for this file)."""


@dataclass(frozen=True, kw_only=True)
class RetiePaths:
    """IN and OUT as given and as resolved once."""

    source: CanonicalPath
    """IN, resolved."""
    out: CanonicalPath
    """OUT, resolved."""
    backup: CanonicalPath | None
    """IN.tieaudit-backup (beside IN), with --in-place."""
    out_given: str
    """OUT as the user typed it, for messages."""


def resolve(path: str, what: str) -> CanonicalPath:
    """path resolved once (what: IN or OUT, for the message when it cannot be)."""
    try:
        return canonical(path)
    except FileNotFoundError as exc:
        missing = "no such file or folder" if what == "IN" else "the folder for OUT does not exist"
        raise UsageError(missing, path) from exc
    except NotADirectoryError as exc:
        raise UsageError(f"a part of {what}'s path before its last name is not a folder", path) from exc
    except OSError as exc:
        raise UsageError(f"cannot resolve {what}'s folder: {exc.strerror or exc}", path) from exc


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _inside(folder: str, target: os.stat_result) -> bool:
    """folder is target or lies under it, compared by inode (links and bind mounts included)."""
    while True:
        if same_entry(os.stat(folder), target):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


def check_paths(source: str, out: str, in_place: bool) -> RetiePaths:
    """Resolve IN and OUT once and refuse every way OUT could reach IN; raise UsageError."""
    src = resolve(source, "IN")
    if not os.path.exists(src.path):
        _interrupted(src, source)
        raise UsageError("no such file or folder", source)
    if ends_in_folder_marker(out):
        raise UsageError("OUT must end in the name of the file or folder to create, not in '/' or '.'", out)
    dst = resolve(out, "OUT")
    if in_hub_cache(dst.path):  # huggingface_hub's: its snapshots are links into shared blobs
        raise UsageError("OUT lies in a Hugging Face cache; write it outside the cache", out)
    in_stat = os.stat(src.path)
    if _lstat(dst.path) is not None:
        same = os.path.exists(dst.path) and same_entry(os.stat(dst.path), in_stat)
        if not same:
            raise UsageError("OUT already exists; remove it or choose another path", out)
        if not in_place:
            raise UsageError("OUT is the input; pass --in-place to replace it (a backup is kept)", out)
        if dst != src:
            raise UsageError("--in-place needs OUT to be IN itself, not another name (link) for it", out)
        return RetiePaths(source=src, out=dst, backup=_free_backup(src), out_given=out)
    if in_place:
        raise UsageError("--in-place needs OUT to be the input itself", out)
    if stat.S_ISDIR(in_stat.st_mode) and _inside(dst.folder, in_stat):
        raise UsageError("OUT is inside the input folder; choose a path outside it", out)
    return RetiePaths(source=src, out=dst, backup=None, out_given=out)


def _interrupted(src: CanonicalPath, source: str) -> None:
    """IN is missing: raise naming the backup an interrupted --in-place run left (this version's
    name, or IN.bak of an earlier version), if one is there."""
    earlier = (LEGACY_BACKUP_SUFFIX, "if an earlier tieaudit's interrupted")
    for suffix, whose in ((BACKUP_SUFFIX, "an interrupted"), earlier):
        backup = src.sibling(src.name + suffix)
        if os.path.lexists(backup.path):
            raise UsageError(
                f"missing, and {printable(backup.name)} is there: {whose} --in-place run left "
                f"the original in it; move it back ({printable(backup.name)} -> "
                f"{printable(src.name)}) and run again",
                source,
            )


def _stages(out: CanonicalPath) -> list[tuple[str, int]]:
    """(entry, pid) of the staging folders of dead runs that wrote this OUT."""
    prefix = f".{out.name}{STAGE_INFIX}"
    found = []
    try:
        entries = os.listdir(out.folder)
    except OSError:  # a folder one may write but not list: no stage of ours can be found there
        return []
    for entry in entries:
        pid = entry[len(prefix) :]
        if entry.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            found.append((entry, int(pid)))
    return found


def _marker(src: CanonicalPath, entry: str) -> str | None:
    try:
        with open(os.path.join(src.folder, entry, IN_PLACE_MARKER), encoding="ascii") as handle:
            return handle.read(100)
    except (OSError, UnicodeDecodeError):
        return None


def _identity(info: os.stat_result) -> str:
    return f"{info.st_dev} {info.st_ino}"


def _free_backup(src: CanonicalPath) -> CanonicalPath:
    """IN.tieaudit-backup, which must not exist; a leftover of an interrupted run is named as such."""
    backup = src.sibling(src.name + BACKUP_SUFFIX)
    backup_stat = _lstat(backup.path)
    if backup_stat is None:
        return backup
    name = printable(backup.name)
    if same_entry(backup_stat, os.lstat(src.path)):
        raise UsageError(
            f"a second name (hard link) of IN left by an interrupted --in-place run; IN is unchanged: "
            f"delete {name} and run again",
            backup.path,
        )
    in_identity = _identity(os.lstat(src.path))
    if any(_marker(src, entry) == in_identity for entry, _ in _stages(src)):
        raise UsageError(
            f"holds the unfinished output of an interrupted --in-place run; IN is unchanged: "
            f"delete {name} and run again",
            backup.path,
        )
    raise UsageError("the backup path already exists; move it away first", backup.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stage_path(out: CanonicalPath) -> tuple[str, list[str]]:
    """A staging folder beside OUT, and notes: stale ones of killed runs (dead pid) are removed first."""
    notes = []
    for entry, pid in _stages(out):
        shutil.rmtree(os.path.join(out.folder, entry), ignore_errors=True)
        notes.append(f"removed {printable(entry)}, the staging folder of an interrupted run (process {pid})")
    return os.path.join(out.folder, f".{out.name}{STAGE_INFIX}{os.getpid()}"), notes


def _appeared(name: str, path: str) -> OutputError:
    return OutputError(
        f"{printable(name)} appeared while retie ran; it was left untouched and OUT was not written", path
    )


def publish(stage: str, *, out: CanonicalPath, out_given: str) -> None:
    """Move the staged entries beside OUT, the main one last (a visible OUT is complete), never over
    anything: an entry that appears meanwhile stays, and the entries already moved go back. retie
    and export both publish through here (out_given: OUT as typed, for messages)."""
    entries = sorted(os.listdir(stage), key=lambda e: e == out.name)
    for entry in entries:
        target = out.sibling(entry).path
        if entry != out.name and os.path.lexists(target):
            raise UsageError(f"{printable(entry)} already exists beside OUT; it would be overwritten", target)
    moved: list[tuple[str, os.stat_result]] = []
    for entry in entries:
        identity = os.lstat(os.path.join(stage, entry))
        try:
            rename_noreplace(os.path.join(stage, entry), out.sibling(entry).path)
        except FileExistsError:
            _take_back(stage, out, moved)
            where = out_given if entry == out.name else out.sibling(entry).path
            raise _appeared(entry, where) from None
        moved.append((entry, identity))
    fsync_path(out.folder)


def _take_back(stage: str, out: CanonicalPath, moved: list[tuple[str, os.stat_result]]) -> None:
    """Return published side files to the stage (only while they are still the ones moved)."""
    for entry, identity in moved:
        target = out.sibling(entry).path
        current = _lstat(target)
        if current is not None and same_entry(current, identity):
            try:
                rename_noreplace(target, os.path.join(stage, entry))
            except OSError:
                pass


def publish_in_place(stage: str, paths: RetiePaths) -> None:
    """Replace IN by the staged output; the original is at IN or its backup at every instant."""
    assert paths.backup is not None
    if len(os.listdir(stage)) > 1:
        raise UsageError(
            "--in-place cannot replace a model with side files (external data); write a new OUT",
            paths.out_given,
        )
    staged = os.path.join(stage, paths.out.name)
    if not stat.S_ISDIR(os.lstat(staged).st_mode):
        try:
            os.link(paths.source.path, paths.backup.path, follow_symlinks=False)
        except FileExistsError:
            raise _appeared(paths.backup.name, paths.backup.path) from None
        except OSError as exc:
            if exc.errno not in LINK_UNSUPPORTED:
                raise
        else:
            fsync_path(paths.source.folder)  # the backup on disk before IN changes
            os.rename(staged, paths.source.path)
            fsync_path(paths.source.folder)
            return
    _swap(stage, staged, paths)


def _swap(stage: str, staged: str, paths: RetiePaths) -> None:
    """backup <- staged output, then IN and the backup exchanged: IN is the original until the swap,
    the backup after it. The marker lets the next run tell which one a kill in between left where."""
    assert paths.backup is not None
    source, backup = paths.source.path, paths.backup.path
    marker = os.path.join(stage, IN_PLACE_MARKER)
    with open(marker, "w", encoding="ascii") as handle:
        handle.write(_identity(os.lstat(source)))
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(stage)
    try:
        rename_noreplace(staged, backup)
    except FileExistsError:
        raise _appeared(paths.backup.name, backup) from None
    fsync_path(paths.source.folder)
    try:
        exchange(source, backup)
    except OSError as exc:
        rename_noreplace(backup, staged)  # the output back in the stage, IN untouched
        if exc.errno not in UNSUPPORTED:
            raise
        # No atomic swap on this filesystem: two renames; the backup holds the original between them.
        rename_noreplace(source, backup)
        fsync_path(paths.source.folder)
        rename_noreplace(staged, source)
    fsync_path(paths.source.folder)
