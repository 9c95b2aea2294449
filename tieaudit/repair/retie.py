"""retie: plan -> write to a staging folder beside OUT -> re-read and verify -> fsync -> rename.

The input is never modified. OUT appears only after the output has been read back and every
original name compared bit for bit with the input; any failure removes the staging folder.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tieaudit.errors import OutputError, UsageError
from tieaudit.formats import open_checkpoint
from tieaudit.graph import build_graph
from tieaudit.model import Format
from tieaudit.repair.interface import Writer
from tieaudit.repair.plan import RetiePlan, make_plan
from tieaudit.repair.verify import verify_output

_WRITERS: dict[Format, tuple[str, str]] = {
    "safetensors": ("tieaudit.repair.safetensors_writer", "SafetensorsWriter"),
    "hf-dir": ("tieaudit.repair.hf_writer", "HfDirWriter"),
    "torch": ("tieaudit.repair.torch_writer", "TorchWriter"),
    "onnx": ("tieaudit.repair.onnx_writer", "OnnxWriter"),
}

before_rename: Callable[[str], None] = lambda staged: None  # noqa: E731 - a seam for fault-injection tests


@dataclass(frozen=True)
class RetieResult:
    """What retie did."""

    plan: RetiePlan
    """The decisions."""
    written: str | None
    """OUT, once written and verified (None for a dry run)."""
    backup: str | None
    """With --in-place: where the original now is."""
    input_bytes: int
    """Bytes of the input's files."""
    output_bytes: int
    """Bytes of the output's files (0 for a dry run)."""


def _writer(format: Format) -> Writer:
    module, name = _WRITERS[format]
    writer: Writer = getattr(importlib.import_module(module), name)()
    return writer


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_all(files: list[str]) -> None:
    for file in files:
        _fsync(file)


def _check_paths(source: str, out: str, in_place: bool) -> None:
    same = os.path.exists(out) and os.path.samefile(source, out)
    if same and not in_place:
        raise UsageError("OUT is the input; pass --in-place to replace it (a backup is kept)", out)
    if in_place and not same:
        raise UsageError("--in-place needs OUT to be the input itself", out)
    if not same and (os.path.exists(out) or os.path.islink(out)):
        raise UsageError("OUT already exists; remove it or choose another path", out)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise UsageError("the folder for OUT does not exist", out)


def _stage_name(out: str) -> str:
    """A staging folder beside OUT; stale ones from killed runs (dead pid) are removed first."""
    folder, base = os.path.split(os.path.abspath(out))
    prefix = f".{base}.tieaudit-stage-"
    for entry in os.listdir(folder):
        pid = entry[len(prefix) :]
        if entry.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)
    return os.path.join(folder, f"{prefix}{os.getpid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _publish(stage: str, out: str, backup: str | None) -> None:
    """Move the staged entries beside OUT, the main one last, so a visible OUT is complete."""
    folder, base = os.path.split(os.path.abspath(out))
    entries = sorted(os.listdir(stage), key=lambda e: e == base)
    if backup is not None and len(entries) > 1:
        raise UsageError(
            "--in-place cannot replace a model with side files (external data); write a new OUT", out
        )
    for entry in entries:
        target = os.path.join(folder, entry)
        if entry != base and os.path.exists(target):
            raise UsageError(f"{entry} already exists beside OUT; it would be overwritten", target)
    if backup is not None:
        os.rename(out, backup)
    for entry in entries:
        os.rename(os.path.join(stage, entry), os.path.join(folder, entry))
    _fsync(folder)


def retie(
    source: str,
    out: str,
    relations: frozenset[str] | None = None,
    keep: str | None = None,
    dry_run: bool = False,
    in_place: bool = False,
    min_bytes: int = 1024,
) -> RetieResult:
    """Turn the copies in source back into ties and write the result to out, verified."""
    if not os.path.exists(source):
        raise UsageError("no such file or folder", source)
    backup = None
    if not dry_run:
        _check_paths(source, out, in_place)
        backup = _backup_name(out) if in_place else None
    with open_checkpoint(source) as ckpt:
        plan = make_plan(build_graph(ckpt), relations, keep, min_bytes)
        # A folder is measured whole, like the output folder; a file with its external data.
        root = os.path.dirname(os.path.abspath(source))
        single = not os.path.isdir(source) and ckpt.files
        input_bytes = sum(_size(os.path.join(root, f)) for f in ckpt.files) if single else _size(source)
        if dry_run:
            return RetieResult(plan, None, None, input_bytes, 0)
        stage = _stage_name(out)
        try:
            os.mkdir(stage)
            staged = os.path.join(stage, os.path.basename(os.path.abspath(out)))
            files = _writer(ckpt.format).write(ckpt, plan, staged)
            # Flushing to disk and reading back overlap; the rename waits for both.
            with ThreadPoolExecutor(max_workers=1) as pool:
                syncing = pool.submit(_fsync_all, files)
                verify_output(ckpt, staged)
                syncing.result()
            output_bytes = _size(staged) + sum(
                _size(os.path.join(stage, e)) for e in os.listdir(stage) if e != os.path.basename(staged)
            )
            before_rename(staged)
            _publish(stage, out, backup)
        except OSError as exc:  # disk full, quota, permissions: OUT never appears
            raise OutputError(f"cannot write: {exc.strerror or exc}", out) from exc
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return RetieResult(plan, out, backup, input_bytes, output_bytes)


def _backup_name(out: str) -> str:
    backup = out.rstrip("/") + ".bak"
    if os.path.exists(backup):
        raise UsageError("the backup path already exists; move it away first", backup)
    return backup
