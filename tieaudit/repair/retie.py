"""retie: plan -> write to a staging folder beside OUT -> re-read and verify -> fsync -> rename.

The input is never modified. A plan that re-ties nothing writes nothing (no OUT, no backup). OUT
is named for the input's format (``out_name``). OUT appears only after the output has been read
back (by tieaudit's readers and by the format's reference loader) and every original name compared
bit for bit with the input; any failure, SIGINT or SIGTERM removes the staging folder. Paths,
publishing and --in-place are in repair.publish.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import OutputError, TieauditError, UnsupportedFormatError, UsageError
from tieaudit.core.fsops import fsync_path
from tieaudit.core.interrupts import SignalGuard, signals_guarded, worker_pool
from tieaudit.core.records import Format
from tieaudit.formats import open_checkpoint
from tieaudit.formats.gguf_heads import RECONVERT
from tieaudit.formats.hf.variants import weights_target
from tieaudit.formats.torchscript import REEXPORT
from tieaudit.graph import DEFAULT_MIN_BYTES
from tieaudit.graph.alias import build_graph
from tieaudit.repair import BACKUP_SUFFIX
from tieaudit.repair.interface import Writer
from tieaudit.repair.out_name import check_out_name
from tieaudit.repair.plan import RetiePlan, make_plan
from tieaudit.repair.publish import (
    RetiePaths,
    check_paths,
    publish,
    publish_in_place,
    stage_path,
)
from tieaudit.repair.reference import ReferenceMismatch, compare_input
from tieaudit.repair.reference_loaders import preload_ml_dtypes
from tieaudit.repair.verify import VerificationError, verify_output

_WRITERS: dict[Format, tuple[str, str]] = {
    "safetensors": ("tieaudit.repair.safetensors_writer", "SafetensorsWriter"),
    "hf-dir": ("tieaudit.repair.hf_writer", "HfDirWriter"),
    "torch": ("tieaudit.repair.torch_writer", "TorchWriter"),
    "onnx": ("tieaudit.repair.onnx_writer", "OnnxWriter"),
}

before_rename: Callable[[str], None] = lambda staged: None  # noqa: E731 - a seam for fault-injection tests


@dataclass(frozen=True, kw_only=True)
class RetieResult:
    """What retie did."""

    plan: RetiePlan
    """The decisions."""
    written: str | None
    """OUT, once written and verified (None for a dry run, or when the plan re-ties nothing)."""
    backup: str | None
    """With --in-place: where the original now is."""
    input_bytes: int
    """Bytes of the input's files."""
    output_bytes: int
    """Bytes of the output's files (0 for a dry run)."""
    notes: tuple[str, ...] = ()
    """Traces of interrupted runs found and cleaned up (stale staging folders), and a reference
    loader that was not installed (that side verified by tieaudit's own reader only)."""
    dry_run: bool = False
    """Only the plan was asked for."""

    @property
    def nothing_to_retie(self) -> bool:
        """The plan applies no copy, so nothing is (or would be) written (unless write_unchanged)."""
        return not self.plan.applied and self.written is None


def _writer(format: Format) -> Writer:
    module, name = _WRITERS[format]
    writer: Writer = getattr(importlib.import_module(module), name)()
    return writer


def _file_size(path: str) -> int:
    """Bytes of a file as a copy reads it; a link that leads nowhere counts as the link itself."""
    try:
        return os.stat(path).st_size
    except OSError:
        try:
            return os.lstat(path).st_size
        except OSError:
            return 0


def _size(path: str) -> int:
    """Bytes of a file, or of every file in a folder (for the report's before and after sizes)."""
    if os.path.isdir(path):
        return sum(_file_size(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    return _file_size(path)


def _fsync_all(files: list[str]) -> None:
    for file in files:
        fsync_path(file)


def _out(source: str, out: str | None, *, dry_run: bool, in_place: bool) -> str:
    """OUT, or IN for --in-place or a dry run without OUT; a usage error naming the three choices."""
    if out is not None:
        return out
    if in_place or dry_run:
        return source
    raise UsageError(
        f"say where the output goes: OUT (a new path), --in-place (replace IN, keeping the original "
        f"as IN{BACKUP_SUFFIX}) or --dry-run (print the plan, write nothing)"
    )


def retie(
    source: str,
    out: str | None,
    *,
    relations: frozenset[str] | None = None,
    keep: str | None = None,
    dry_run: bool = False,
    in_place: bool = False,
    min_bytes: int = DEFAULT_MIN_BYTES,
    all_equal: bool = False,
    force_format: bool = False,
    write_unchanged: bool = False,
) -> RetieResult:
    """Turn the copies in source back into ties and write the result to out, verified.

    out None: IN itself with in_place (given, it must be IN), nothing with dry_run. OUT's name must
    fit the format (``out_name``) unless force_format. A plan that re-ties nothing writes nothing,
    unless write_unchanged (export: every file it exports is written, re-read and verified the same way).
    By default an equal copy in a safetensors file or model folder is re-tied only where the
    format's loader restores it (``repair.loaders``); all_equal re-ties every equal copy, and the
    plan carries each consequence.
    """
    if in_place and weights_target(source):
        raise UsageError(
            "--in-place replaces IN, and this IN names one weight set of its folder (a shard index, a "
            "variant or an adapter), read with the folder's configs; write the re-tied folder to OUT instead",
            source,
        )
    named = None if in_place else out  # an OUT whose name is checked against the format
    target = _out(source, out, dry_run=dry_run, in_place=in_place)
    paths = None if dry_run else check_paths(source, target, in_place)
    if paths is None and not os.path.exists(source):
        raise UsageError("no such file or folder", source)
    try:
        options = _Request(
            relations=relations,
            keep=keep,
            min_bytes=min_bytes,
            all_equal=all_equal,
            named=named,
            force_format=force_format,
            write_unchanged=write_unchanged,
        )
        return _retie(source, target, paths, request=options)
    except TieauditError as exc:
        if paths is not None and exc.path == paths.source.path:
            exc.path = source  # IN as the user typed it, not as resolved
        raise


SCRIPT_REFUSED = (
    f"retie cannot rewrite TorchScript archives (only torch.jit.save writes them, and tieaudit never "
    f"runs torch.jit); {REEXPORT}, or convert its tensors to safetensors (tieaudit convert IN "
    "OUT.safetensors) and retie that"
)
"""Why retie refuses a TorchScript archive, and what to do instead."""


@dataclass(frozen=True, kw_only=True)
class _Request:
    """What to re-tie, as given to ``retie``."""

    relations: frozenset[str] | None
    """Relations to apply (None: the format's default)."""
    keep: str | None
    """The name to keep in its copy group."""
    min_bytes: int
    """Smaller tensors are never copy candidates."""
    all_equal: bool
    """Re-tie every equal copy, also those the format's loader does not restore."""
    named: str | None
    """OUT as given, when its name must fit the input's format (not with --in-place)."""
    force_format: bool
    """Accept OUT's name whatever its suffix."""
    write_unchanged: bool = False
    """Write OUT even when the plan re-ties nothing."""


def _retie(source: str, out: str, paths: RetiePaths | None, *, request: _Request) -> RetieResult:
    with open_checkpoint(source if paths is None else paths.source.path) as opened:
        ckpt = opened.checkpoint
        if ckpt.format == "gguf":
            raise UnsupportedFormatError(f"retie does not write GGUF; {RECONVERT}", source)
        if ckpt.format == "torchscript":
            raise UnsupportedFormatError(SCRIPT_REFUSED, source)
        if request.named is not None:  # before planning, which may read every byte
            check_out_name(ckpt.format, request.named, force=request.force_format)
        made = make_plan(
            build_graph(ckpt),
            opened,
            relations=request.relations,
            keep=request.keep,
            min_bytes=request.min_bytes,
            all_equal=request.all_equal,
        )
        plan = dataclasses.replace(made, path=source)
        # A folder is measured whole, like the output folder; a file with its external data.
        root = os.path.dirname(os.path.abspath(ckpt.path))
        single = not os.path.isdir(ckpt.path) and ckpt.files
        input_bytes = sum(_size(os.path.join(root, f)) for f in ckpt.files) if single else _size(ckpt.path)
        if paths is None or not (plan.applied or request.write_unchanged):  # dry run, or nothing to re-tie
            return RetieResult(
                plan=plan,
                written=None,
                backup=None,
                input_bytes=input_bytes,
                output_bytes=0,
                dry_run=paths is None,
            )
        try:
            with signals_guarded() as guard:
                write = functools.partial(_writer(ckpt.format).write, opened, plan)
                output_bytes, notes = write_and_publish(
                    opened, paths, write, guard=guard, renamed=plan.renamed, rewritten=plan.rewritten
                )
        except OSError as exc:  # disk full, quota, permissions: OUT never appears
            raise OutputError(f"cannot write: {exc.strerror or exc}", out) from exc
    backup = None if paths.backup is None else out + BACKUP_SUFFIX
    return RetieResult(
        plan=plan,
        written=out,
        backup=backup,
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        notes=tuple(notes),
    )


def write_and_publish(
    opened: OpenCheckpoint,
    paths: RetiePaths,
    write: Callable[[str], list[str]],
    *,
    guard: SignalGuard,
    renamed: Mapping[str, str | None] | None = None,
    rewritten: tuple[str, ...] = (),
) -> tuple[int, list[str]]:
    """write(staged) in a stage beside OUT (it returns the files written), verify against opened
    (renamed, rewritten: see verify_output), fsync, publish (in place when paths has a backup); the stage is
    removed whatever happens, signals included. Returns (output bytes, notes: stale stages removed,
    verification done without a reference loader). retie, convert and
    the reverse conversion (tieaudit.load) all publish through it."""
    stage, notes = stage_path(paths.out)
    try:
        os.mkdir(stage)
        staged = os.path.join(stage, paths.out.name)
        preload_ml_dtypes(opened.checkpoint)  # what verification needs, imported while writing
        # The reference loader reads the input while the output is written; the output is read
        # back while it is flushed to disk; the rename waits for all of them.
        with worker_pool(1, "input") as reader, worker_pool(1, "fsync") as pool:
            reading = reader.submit(compare_input, opened)
            files = write(staged)
            syncing = pool.submit(_fsync_all, files)
            try:
                compared = reading.result()
                notes += verify_output(
                    opened, staged, renamed=renamed, rewritten=rewritten, input_reading=compared
                )
            except (VerificationError, ReferenceMismatch) as exc:  # named as OUT: the stage goes away
                raise type(exc)(f"{exc.message}; nothing was written", paths.out_given) from exc
            except TieauditError as exc:  # the output read back fails: named as OUT, never the stage
                if exc.path is None or not os.path.abspath(exc.path).startswith(os.path.abspath(stage)):
                    raise
                exc.message = f"the output written cannot be read back ({exc.message}); nothing was written"
                exc.path = paths.out_given
                raise
            syncing.result()
        output_bytes = sum(_size(os.path.join(stage, entry)) for entry in os.listdir(stage))
        before_rename(staged)
        guard.check()  # a signal caught, even one a library swallowed: nothing is published
        with guard.deferred():  # a signal now waits until OUT (or IN and its backup) is whole
            if paths.backup is None:
                publish(stage, out=paths.out, out_given=paths.out_given)
            else:
                publish_in_place(stage, paths)
    finally:
        with guard.deferred():
            shutil.rmtree(stage, ignore_errors=True)
    return output_bytes, notes
