"""Whether torch.load takes a file by its content alone, whatever it is called.

A folder search skips hidden names (``.cache``, ``.DS_Store``), but a script loads a file by any
name, and a dot hides nothing from ``torch.load``: a hidden file whose bytes torch.load takes (a
torch.save zip or legacy stream, a pre-0.4 tar, or a pickle that names code) is audited like any
other. Its name alone never makes it a checkpoint: macOS' ``._model.safetensors`` is metadata.
"""

from __future__ import annotations

import os
import stat

from tieaudit.core.errors import InputError
from tieaudit.formats.bare_pickle import scan
from tieaudit.formats.magic import read_head
from tieaudit.formats.torch_sniff import is_legacy_stream, is_torch_tar, is_torch_zip
from tieaudit.formats.torch_tar_walk import scan_tar

__all__ = ["taken_by_torch"]


def taken_by_torch(path: str) -> bool:
    """A regular file (not a link) whose content torch.load takes, or which names code torch.load
    (weights_only=False) would run; False for anything that cannot be read or scanned."""
    try:
        status = os.lstat(path)  # a link is not followed: not S_ISREG
        if not stat.S_ISREG(status.st_mode):
            return False
        head, _ = read_head(path)
        if is_torch_tar(path, head):
            return scan_tar(path).audited
        if is_torch_zip(path, head) or is_legacy_stream(path, head):
            return True
        found = scan(path, head, status.st_size, until_code=True)
    except (OSError, InputError):
        return False
    return found is not None and found.audited
