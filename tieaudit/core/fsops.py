"""Filesystem steps that never replace what they should not.

Paths are resolved once, the way the kernel resolves them (``nosuchdir/..`` fails; ``link/..``
is the parent of the link's target), and every later call uses the resolved path. Renames that
must not overwrite use ``renameat2(RENAME_NOREPLACE)``; an atomic swap of two entries uses
``RENAME_EXCHANGE``. Both go through glibc with ctypes; where the call or the flag is not
available, ``rename_noreplace`` falls back to steps that still never replace (link + unlink for a
file, claiming the name with mkdir for a folder).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})
"""What renameat2 answers when the kernel, libc or the filesystem does not offer a flag."""


def _libc_renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # no glibc, or one older than 2.28
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    call: Callable[[int, bytes, int, bytes, int], int] = function
    return call


_RENAMEAT2 = _libc_renameat2()


def renameat2(src: str, dst: str, flags: int) -> None:
    """rename(2) with flags; OSError with the kernel's errno (ENOSYS when libc has no renameat2)."""
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), src, None, dst)
    if _RENAMEAT2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src, None, dst)


def rename_noreplace(src: str, dst: str) -> None:
    """Move src to dst; FileExistsError (nothing moved) when anything is at dst, even a dangling link."""
    try:
        renameat2(src, dst, RENAME_NOREPLACE)
        return
    except OSError as exc:
        if exc.errno not in UNSUPPORTED:
            raise
    if stat.S_ISDIR(os.lstat(src).st_mode):
        os.mkdir(dst)  # claims the name: FileExistsError when it is taken
        try:
            # Replaces only the empty folder just made; ENOTEMPTY/ENOTDIR if someone changed it since.
            os.rename(src, dst)
        except OSError:
            try:
                os.rmdir(dst)
            except OSError:
                pass
            raise
        return
    os.link(src, dst, follow_symlinks=False)  # FileExistsError when dst is taken
    os.unlink(src)


def exchange(first: str, second: str) -> None:
    """Swap two existing entries atomically (RENAME_EXCHANGE); OSError in UNSUPPORTED where unavailable."""
    renameat2(first, second, RENAME_EXCHANGE)


def same_entry(first: os.stat_result, second: os.stat_result) -> bool:
    """The two stats describe one inode (a hard link, or the same path)."""
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def real_folder(folder: str) -> str:
    """The folder's real path, resolved as the kernel resolves it.

    os.stat gives the kernel's answer (ENOENT for ``nosuchdir/..``, ENOTDIR for ``file/..``);
    realpath(strict) then names it, and must name the same inode.
    """
    folder = folder or "."
    before = os.stat(folder)
    if not stat.S_ISDIR(before.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), folder)
    real = os.path.realpath(folder, strict=True)
    if not same_entry(before, os.stat(real)):
        raise OSError(errno.ESTALE, "the folder changed while its path was resolved", folder)
    return real


@dataclass(frozen=True)
class CanonicalPath:
    """A path as the kernel resolves it: the real path of its folder, plus its own name."""

    folder: str
    """Real path of the parent folder (no symbolic link, no '.' or '..' left in it)."""
    name: str
    """The last component as given (itself possibly a symbolic link); never '', '.' or '..'."""

    @property
    def path(self) -> str:
        """folder/name."""
        return os.path.join(self.folder, self.name)

    def sibling(self, name: str) -> CanonicalPath:
        """Another entry of the same folder."""
        return CanonicalPath(self.folder, name)


def ends_in_folder_marker(path: str) -> bool:
    """path ends in '/', '.' or '..' (it names a folder's inside, not an entry one can create)."""
    return os.path.basename(path) in ("", ".", "..")


def canonical(path: str) -> CanonicalPath:
    """path resolved once; OSError as the kernel answers for its folder.

    A path ending in '/', '.' or '..' must itself be a folder: it is resolved whole.
    """
    if ends_in_folder_marker(path):
        real = real_folder(path)
        folder, name = os.path.split(real)
        if not name:  # the root folder
            return CanonicalPath(real, ".")
        return CanonicalPath(folder, name)
    folder, name = os.path.split(path)
    return CanonicalPath(real_folder(folder), name)


def fsync_path(path: str) -> None:
    """fsync a file or a folder (a folder: so that renames in it reach the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
