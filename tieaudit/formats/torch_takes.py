"""Whether a file would run code when torch.load takes it, whatever it is called.

A folder search skips hidden names (``.cache``, ``.git``, ``.DS_Store``), but a script loads a file
by any name, and a dot hides nothing from ``torch.load``. A hidden file, or any file under a hidden
folder, is audited when torch.load would run code from it, or when tieaudit cannot vouch that it
would not: a torch.save zip or legacy stream whose pickle names a global outside torch's
weights_only allowlist (or that tieaudit's reader refuses), a pre-0.4 tar whose pickles name code,
a bare pickle that names code before it fails. A hidden checkpoint that names no code is skipped:
hidden folders hold tools' state (``.git/lfs/objects`` keeps a copy of every LFS checkpoint of a
clone), which would otherwise be reported twice. A name alone never makes a file a checkpoint:
macOS' ``._model.safetensors`` is metadata.
"""

from __future__ import annotations

import os
import stat

from tieaudit.core.errors import InputError
from tieaudit.formats.bare_pickle import scan
from tieaudit.formats.magic import read_head
from tieaudit.formats.torch_file import TorchReader
from tieaudit.formats.torch_sniff import is_legacy_stream, is_torch_tar, is_torch_zip
from tieaudit.formats.torch_tar_walk import scan_tar

__all__ = ["hides_code"]


def _torch_file_runs_code(path: str) -> bool:
    """A torch.save zip or legacy stream naming a global torch's weights_only refuses, or one
    tieaudit's reader refuses (it cannot vouch for it)."""
    try:
        opened = TorchReader().read(path)
    except InputError:
        return True
    try:
        return any(g.verdict != "allowed" for g in opened.checkpoint.pickle_globals)
    finally:
        opened.close()


def hides_code(path: str) -> bool:
    """A regular file (not a link) that torch.load takes and would run code from, or that tieaudit
    cannot vouch for; False for a file torch.load refuses, or that cannot be read."""
    try:
        status = os.lstat(path)  # a link is not followed: not S_ISREG
        if not stat.S_ISREG(status.st_mode):
            return False
        head, _ = read_head(path)
        if is_torch_tar(path, head):
            return scan_tar(path).audited
        if is_torch_zip(path, head) or is_legacy_stream(path, head):
            return _torch_file_runs_code(path)
        found = scan(path, head, status.st_size, until_code=True)
    except (OSError, InputError):
        return False
    return found is not None and found.audited
