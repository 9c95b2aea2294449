"""convert: a torch checkpoint (.pt/.bin file, or a model folder of pytorch_model*.bin) to safetensors.

torch-free and streaming: the pickle is read by tieaudit's torch reader (no code runs), the plan
(``convert_plan``) says which names are stored and which recorded, and each stored tensor's bytes
are copied from the input's mapped storages one tensor at a time, so memory stays bounded by a
tensor rather than the model. The output is written in a staging folder beside OUT, read back and
compared with the input name by name, bit for bit (tieaudit's safetensors reader, then
``safetensors.safe_open`` against ``torch.load(weights_only=True)`` of the input, where installed:
``repair.verify``), fsynced and renamed into place like
retie's output; a failure or a signal leaves no OUT.

A folder keeps its layout: ``pytorch_model.bin`` becomes ``model.safetensors``, the shards
``pytorch_model-0000k-of-0000n.bin`` become ``model-0000k-of-0000n.safetensors`` listed in
``model.safetensors.index.json``; the other files are copied. The ``{dropped: kept}`` records go
in the file's ``__metadata__`` (single file) or in the index ``metadata`` (shards).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import OutputError, TieauditError, UnsupportedFormatError, UsageError
from tieaudit.core.interrupts import signals_guarded
from tieaudit.formats import open_checkpoint
from tieaudit.formats.capabilities import FILE_SUFFIXES
from tieaudit.formats.hf.variants import weights_folder, weights_target
from tieaudit.formats.hf_covered import not_copied
from tieaudit.formats.hf_dir import read_config, torch_weights
from tieaudit.formats.hf_reader import weights_at
from tieaudit.repair.convert_plan import ConvertPlan, make_convert_plan
from tieaudit.repair.hf_writer import copy_file, side_files, write_json
from tieaudit.repair.publish import check_paths
from tieaudit.repair.retie import write_and_publish
from tieaudit.repair.st_stream import write_safetensors
from tieaudit.rules.finding import Finding

SAFE_FORMAT = {"format": "pt"}
"""The ``__metadata__`` entry transformers requires of a safetensors file it loads."""
SAFE_SUFFIX = ".safetensors"


@dataclass(frozen=True, kw_only=True)
class ConvertResult:
    """What convert did."""

    source: str
    """IN as the caller gave it (the plan's path is the resolved one)."""
    plan: ConvertPlan
    """The decisions."""
    written: str | None
    """OUT, once written and verified (None for a dry run)."""
    files: dict[str, str]
    """Input weight file -> output weight file (relative, for folders; basenames for a file)."""
    output_bytes: int = 0
    """Bytes of the output's files (0 for a dry run)."""
    notes: tuple[str, ...] = ()
    """Stale staging folders of interrupted runs, removed; a reference loader not installed (that
    side verified by tieaudit's own reader only)."""
    copies: tuple[Finding, ...] = ()
    """Untied copies carried through (TIE001 at warning or above: equal, transposed or cast tensors
    stored apart), as auditing the output finds them, each with the fix that re-ties the output;
    for a dry run, as auditing the input finds them (their fixes name the input)."""


def out_weight_name(file: str) -> str:
    """The safetensors name of a folder's torch weight file (transformers' naming)."""
    folder, name = os.path.split(file)
    stem = next((name[: -len(s)] for s in (".bin", ".pth", ".pt") if name.endswith(s)), name)
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model") :]
    return os.path.join(folder, stem + SAFE_SUFFIX).replace(os.sep, "/")


def _check_out(folder: bool, out: str) -> None:
    name = os.path.basename(os.path.normpath(out))
    if folder:
        suffix = next((s for s in FILE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            raise UsageError(
                f"IN is a model folder and OUT is written as a folder; name it without {suffix}", out
            )
    elif not name.endswith(SAFE_SUFFIX):
        raise UsageError(f"OUT is a safetensors file: end its name in {SAFE_SUFFIX}", out)


def convert(source: str, out: str | None, *, dry_run: bool = False) -> ConvertResult:
    """Convert source (a torch file or a folder of .bin weights) to safetensors at out, verified.

    out may be None only with dry_run. Raises UsageError for bad paths, InputError (and its
    subclasses) for inputs convert cannot convert, VerificationError when the output does not
    reproduce the input (nothing is written then).
    """
    if out is None and not dry_run:
        raise UsageError("say where the output goes: OUT (a new path), or --dry-run to print the plan")
    if not os.path.exists(source):
        raise UsageError("no such file or folder", source)
    folder = os.path.isdir(source) or weights_target(source)
    if out is not None:
        _check_out(folder, out)
    paths = None if dry_run or out is None else check_paths(source, out, False)
    try:
        with open_checkpoint(source if paths is None else paths.source.path) as opened:
            ckpt = opened.checkpoint
            weights = None
            if ckpt.format == "hf-dir":
                weights = weights_at(ckpt.path)[1]
                if not torch_weights(weights.files) or not all(torch_weights((f,)) for f in weights.files):
                    raise UnsupportedFormatError(
                        "the folder's weights are not (all) pytorch_model*.bin files; nothing to convert",
                        source,
                    )
            elif ckpt.format not in ("torch", "torchscript"):
                raise UnsupportedFormatError(
                    f"is a {ckpt.format} checkpoint; convert reads torch files", source
                )
            config = read_config(weights_folder(ckpt.path))[0] if weights is not None else None
            plan = make_convert_plan(ckpt, config)
            files = (
                {f: out_weight_name(f) for f in weights.files}
                if weights is not None
                else {os.path.basename(ckpt.path): os.path.basename(out or "")}
            )
            if paths is None:
                return ConvertResult(source=source, plan=plan, written=None, files=files)
            try:
                with signals_guarded() as guard:
                    size, notes = write_and_publish(
                        opened, paths, lambda staged: _write(opened, plan, staged, files=files), guard=guard
                    )
            except OSError as exc:
                raise OutputError(f"cannot write: {exc.strerror or exc}", out) from exc
            return ConvertResult(
                source=source, plan=plan, written=out, files=files, output_bytes=size, notes=tuple(notes)
            )
    except TieauditError as exc:
        if paths is not None and exc.path == paths.source.path:
            exc.path = source
        raise


def _write(opened: OpenCheckpoint, plan: ConvertPlan, staged: str, *, files: dict[str, str]) -> list[str]:
    if opened.checkpoint.format == "hf-dir":
        return write_folder(opened, plan, staged, files=files)
    write_safetensors(staged, opened, plan.stored, metadata={**SAFE_FORMAT, **plan.records})
    return [staged]


def write_folder(
    opened: OpenCheckpoint, plan: ConvertPlan, staged: str, *, files: dict[str, str]
) -> list[str]:
    """The folder at staged: safetensors weights, the index for shards, every other file copied."""
    ckpt = opened.checkpoint
    folder, weights = weights_at(ckpt.path)
    os.mkdir(staged)
    skip = not_copied(folder, weights, alone=weights_target(ckpt.path))
    written = [copy_file(folder, rel, staged) for rel in side_files(folder, skip)]
    records = plan.records
    holder = {t.name: t.file for t in plan.stored}
    weight_map: dict[str, str] = {}
    for file in weights.files:
        tensors = [t for t in plan.stored if t.file == file]
        if not tensors:
            continue
        metadata = dict(SAFE_FORMAT)
        if weights.index is None:
            metadata.update({d: k for d, k in records.items() if holder[k] == file})
        target = os.path.join(staged, files[file])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_safetensors(target, opened, tensors, metadata=metadata)
        written.append(target)
        weight_map.update({t.name: files[file] for t in tensors})
    if weights.index is not None:
        index = {"metadata": {"total_size": plan.output_bytes, **records}, "weight_map": weight_map}
        written.append(write_json(os.path.join(staged, "model.safetensors.index.json"), index))
    return written + [root for root, _, _ in os.walk(staged)]
