"""Atomic writes: temp file in the destination folder, fsync, rename. Never a partial file."""

from __future__ import annotations

import os
import tempfile

from tieaudit.errors import InputError, OutputError


def write_text_atomic(path: str, text: str) -> None:
    """Write text to path so that readers see the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tieaudit-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"cannot write here: {exc.strerror or exc}", path) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # disk full, quota: one line, not a traceback
            raise OutputError(f"cannot write: {exc.strerror or exc}", path) from exc
        raise
