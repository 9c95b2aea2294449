"""What became of every file under the paths a `check` run searched: audited, covered, skipped, error.

A file is *audited* when it is a checkpoint of its own (a target); *covered* when a target reads it
(a model folder's config.json and shards, an ONNX model's external data); *skipped* with the reason
(not a checkpoint format, a Git LFS pointer, a format recognised but not read, hidden, excluded);
an *error* when it could not be read or audited. Nothing under a searched path goes unlisted: a
folder that is not entered (hidden, excluded, a link) is listed once, as a whole.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from tieaudit.formats.magic import LFS_POINTER, is_lfs_pointer, recognised_unsupported
from tieaudit.repair import BACKUP_SUFFIX, STAGE_INFIX

__all__ = [
    "EXCLUDED",
    "HIDDEN",
    "LFS_POINTER",
    "LINKED_FOLDER",
    "OUTSIDE_FOLDER",
    "OUTSIDE_LINK",
    "NOT_A_CHECKPOINT",
    "NOT_REGULAR",
    "RETIE_BACKUP",
    "STAGING",
    "CHECKPOINT_SUFFIXES",
    "TORCH_SUFFIXES",
    "skipped_name",
    "FileVerdict",
    "Verdict",
    "skip_reason",
    "skipped_by_reason",
]

Verdict = Literal["audited", "covered", "skipped", "error"]
"""What became of one file."""

NOT_A_CHECKPOINT = "not a checkpoint format"
HIDDEN = "hidden (its name starts with '.')"
STAGING = "a retie staging folder (a run in progress, or one killed midway)"
RETIE_BACKUP = "a retie backup: the original kept by --in-place"
LINKED_FOLDER = "a link to a folder, not followed"
NOT_REGULAR = "not a regular file (a FIFO, socket or device)"
OUTSIDE_LINK = "a link to a file outside the folder searched"
OUTSIDE_FOLDER = "a link to a folder outside the folder searched"
EXCLUDED = "excluded by --exclude {pattern}"
READ_WITH_FOLDER = "read with the model folder {target}"
EXTERNAL_DATA = "ONNX external data of {target}"
READ_WITH_FILE = "read with {target}"


@dataclass(frozen=True, kw_only=True)
class FileVerdict:
    """One file (or a folder not entered) and what became of it."""

    path: str
    """As found under the argument (normalised), or as given on the command line."""
    verdict: Verdict
    """audited, covered, skipped or error."""
    reason: str = ""
    """Why skipped or an error; what a covering target reads it as; empty when audited."""
    target: str = ""
    """The target that audits or covers it (its own path when audited); empty otherwise."""

    def as_dict(self) -> dict[str, str | None]:
        """The check/1 document's entry: ``target`` and ``reason`` null when they do not apply."""
        return {
            "path": self.path,
            "verdict": self.verdict,
            "reason": self.reason or None,
            "target": self.target or None,
        }


def skip_reason(head: bytes, name: str, size: int) -> str:
    """Why a file that is not a checkpoint is skipped, from its first bytes (``head``), name and
    size: a Git LFS pointer, a format tieaudit recognises and does not read (NumPy, HDF5,
    ...), or not a checkpoint format."""
    if is_lfs_pointer(head, size):
        return LFS_POINTER
    return recognised_unsupported(head, name) or NOT_A_CHECKPOINT


def covered_reason(target: str, *, folder: bool, onnx: bool) -> str:
    """How a covering target reads a file: with its model folder, as its ONNX external data."""
    if folder:
        return READ_WITH_FOLDER.format(target=target)
    return (EXTERNAL_DATA if onnx else READ_WITH_FILE).format(target=target)


def skipped_by_reason(files: tuple[FileVerdict, ...]) -> list[tuple[str, int]]:
    """(reason, count) over the skipped files, the most common first, then by reason."""
    counts = Counter(f.reason for f in files if f.verdict == "skipped")
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".safetensors", ".onnx", ".gguf")
"""Audited by name (unless a Git LFS pointer): the audit says what is wrong with one that is not
what its name says."""
TORCH_SUFFIXES = (".bin", ".ckpt", ".tar")
"""Audited when they start like torch.save data (a zip or a pickle): a raw ``.bin`` is ONNX external
data, a ``.ckpt`` may be TensorFlow's, a ``.tar`` an archive (``.pth.tar`` is torch's convention).
Any other file, whatever its name, is audited when its content is what torch.load takes
(``formats.torch_sniff``): torch.load never looks at the name; so is a pickle that is not
torch.save data but names code, which torch.load(weights_only=False) runs before it fails
(``formats.bare_pickle``), and so is a tar archive (torch's pre-0.4 format) whose pickles name code
or cannot be walked to their end (``formats.torch_tar_walk``); one naming none is skipped, saying why."""


def skipped_name(name: str) -> str:
    """Why a name is never searched (hidden, retie's staging folders, named so that a rename never
    lets one through, and the originals retie --in-place kept: a backup folder is a whole model), or
    empty."""
    if STAGE_INFIX in name:
        return STAGING
    if name.endswith(BACKUP_SUFFIX):
        return RETIE_BACKUP
    return HIDDEN if name.startswith(".") else ""
