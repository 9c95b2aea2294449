"""Writing reports: atomically to regular files, directly to devices and pipes.

A regular file is replaced whole (temp file in the same folder, fsync, rename), with the mode a
plain ``open`` would give it: an existing file keeps its mode, a new one gets 0666 minus the umask.
A path that exists and is not a regular file (``/dev/null``, ``/dev/stdout``, a FIFO, a terminal)
is opened and written in place: replacing it would turn a device into a file.
"""

from __future__ import annotations

import os
import stat
import tempfile

from tieaudit.core.errors import OutputError


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it; restored at once (single-threaded here)
    os.umask(mask)
    return mask


def _special(path: str) -> bool:
    """True when path exists (after links) and is not a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", path) from exc
    if stat.S_ISDIR(mode):
        raise OutputError("is a folder; name a file to write the report to", path)
    return not stat.S_ISREG(mode)


def _write_special(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:  # no O_CREAT surprise: it exists
            handle.write(text)
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", path) from exc


def write_text_atomic(path: str, text: str) -> None:
    """Write text to path: readers of a regular file see the old file or the whole new one."""
    if _special(path):
        _write_special(path, text)
        return
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tieaudit-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"cannot write here: {exc.strerror or exc}", path) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # disk full, quota: one line, not a traceback
            raise OutputError(f"cannot write: {exc.strerror or exc}", path) from exc
        raise


def require_writable(path: str) -> None:
    """OutputError now, before any work, when ``write_text_atomic(path)`` later would fail for
    sure: path is a folder, its folder is missing or no folder, or that folder (or the device or
    FIFO path is) cannot be written by this process. Nothing is created, opened or left behind."""
    try:
        mode: int | None = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a dangling link too: the rename replaces it
        mode = None
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", path) from exc
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError("is a folder; name a file to write to", path)
    if mode is not None and not stat.S_ISREG(mode):  # written in place, never replaced
        if not os.access(path, os.W_OK):
            raise OutputError("cannot write: permission denied", path)
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(folder):
        raise OutputError(f"cannot write here: no folder {folder}", path)
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write here: {folder} is not a folder", path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write here: folder {folder} is not writable", path)
    if os.statvfs(folder).f_flag & os.ST_RDONLY:  # os.access says yes to root there
        raise OutputError(f"cannot write here: folder {folder} is on a read-only filesystem", path)
