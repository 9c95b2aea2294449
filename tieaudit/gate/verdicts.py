"""Every file's final verdict, once the audits are back: discovery's verdicts, with each target's
outcome (audited, or the error it met) and the files each audit read (a model folder's files, an
ONNX model's external data) marked as covered by it."""

from __future__ import annotations

import os
from collections.abc import Sequence

from tieaudit.audit import Audit
from tieaudit.formats.magic import LFS_POINTER
from tieaudit.gate.discover import PathError, Target
from tieaudit.gate.files import EXTERNAL_DATA, FileVerdict, covered_reason


def _key(path: str) -> str:
    return os.path.abspath(path)


def final_verdicts(
    files: Sequence[FileVerdict],
    targets: Sequence[Target],
    outcomes: Sequence[Audit | PathError | FileVerdict],
) -> tuple[FileVerdict, ...]:
    """files with each target's outcome (one per target, in order: an Audit, a PathError, or the
    FileVerdict a skipped or covered target gets) and the files each Audit read."""
    verdicts = {_key(f.path): f for f in files}
    for target, outcome in zip(targets, outcomes, strict=True):
        key = _key(target.path)
        if isinstance(outcome, FileVerdict):
            verdicts[key] = outcome
        elif isinstance(outcome, PathError):  # a model folder's error is listed too: counts agree
            shown = target.path.rstrip(os.sep) + os.sep if os.path.isdir(target.path) else target.path
            verdicts[key] = FileVerdict(path=shown, verdict="error", reason=outcome.message)
        else:
            if not os.path.isdir(target.path):
                verdicts[key] = FileVerdict(path=target.path, verdict="audited", target=target.path)
            _mark_read(verdicts, outcome, target.path)
    return tuple(verdicts.values())


def _mark_read(verdicts: dict[str, FileVerdict], audit: Audit, target: str) -> None:
    """Files the audit read, other than the target itself, are covered by it (unless audited, or
    covered by another: a folder's config.json is the folder's, though its variants read it too)."""
    ckpt = audit.graph.checkpoint
    folder = os.path.isdir(target)
    base = target if folder else os.path.dirname(target)
    for name in ckpt.files:
        key = _key(os.path.join(base, name))
        known = verdicts.get(key)
        if key == _key(target) or (known is not None and known.verdict in ("audited", "covered")):
            continue
        path = known.path if known is not None else os.path.normpath(os.path.join(base, name))
        reason = covered_reason(target, folder=folder, onnx=ckpt.format == "onnx")
        verdicts[key] = FileVerdict(path=path, verdict="covered", reason=reason, target=target)


def lfs_skip(target: Target) -> FileVerdict:
    """The verdict of a target skipped as, or for holding, a Git LFS pointer (--skip-lfs-pointers);
    the note printed for it names the pointer file of a model folder."""
    return FileVerdict(path=target.path, verdict="skipped", reason=LFS_POINTER)


def data_covered(error: PathError, audited: set[str]) -> FileVerdict | None:
    """The verdict of a target that is the external data of an ONNX model this run audits."""
    model = next((m for m in error.data_of if _key(m) in audited), None)
    if model is None:
        return None
    return FileVerdict(
        path=error.path, verdict="covered", reason=EXTERNAL_DATA.format(target=model), target=model
    )
