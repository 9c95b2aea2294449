"""``load_tied``: a checkpoint as a torch state dict in which re-tied names are one tensor again.

Needs the torch extra (imported on the first call, never by ``import tieaudit``). Bytes are read
through tieaudit's own readers (no pickle code runs) and copied out of the memory maps once per
storage, so names that share a storage in the file share one in memory too.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import itemsize
from tieaudit.core.errors import OutputError, UnsupportedFormatError, UsageError
from tieaudit.core.escape import printable
from tieaudit.core.extras import require
from tieaudit.core.interrupts import signals_guarded
from tieaudit.core.records import TensorInfo
from tieaudit.formats import open_checkpoint
from tieaudit.formats.capabilities import OUT_SUFFIXES
from tieaudit.repair.convert import ConvertResult
from tieaudit.repair.convert_plan import ConvertPlan, Shared
from tieaudit.repair.publish import check_paths
from tieaudit.repair.restore import Source, restored_array, sources
from tieaudit.repair.retie import write_and_publish
from tieaudit.repair.torch_sink import save

if TYPE_CHECKING:
    import torch

ViewKey = tuple[str, int, tuple[int, ...], tuple[int, ...], str]


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    found: torch.dtype = getattr(torch, dtype)
    return found


def _bytes_tensor(array: np.ndarray, dtype: str) -> torch.Tensor:
    """A new torch tensor of canonical dtype holding array's values (bfloat16 and float8: bits),
    bit for bit."""
    import torch

    contiguous = np.ascontiguousarray(array)
    raw = contiguous.reshape(-1).view(np.uint8)
    return torch.from_numpy(raw.copy()).view(_torch_dtype(dtype)).reshape(array.shape)


class _StorageCopies:
    """One uint8 torch copy per storage; tensors are typed, strided views of it.

    With ``in_place``, no copy: the storage is a read-only view of the file's mapping, for writing
    it out again (``torch_sink.save`` gives its pages back as it goes); nothing may modify it."""

    def __init__(self, opened: OpenCheckpoint, *, in_place: bool = False) -> None:
        self.opened = opened
        self.in_place = in_place
        self.storages: dict[str, torch.Tensor] = {}
        self.views: dict[ViewKey, torch.Tensor] = {}

    def storage(self, storage_id: str) -> torch.Tensor:
        import torch

        if storage_id not in self.storages:
            buffer = self.opened.store.buffer(self.opened.checkpoint.storages[storage_id])
            if self.in_place and len(buffer):
                with warnings.catch_warnings():  # "non-writable buffer": it is only read, by torch.save
                    warnings.simplefilter("ignore", UserWarning)
                    self.storages[storage_id] = torch.frombuffer(buffer, dtype=torch.uint8)
            else:
                copied = np.array(np.frombuffer(buffer, dtype=np.uint8))  # out of the mmap
                self.storages[storage_id] = torch.from_numpy(copied)
        return self.storages[storage_id]

    def view(self, tensor: TensorInfo) -> torch.Tensor:
        """The tensor as stored; names with one layout over one storage get one object."""
        key: ViewKey = (tensor.storage_id, tensor.byte_offset, tensor.shape, tensor.strides, tensor.dtype)
        if key not in self.views:
            self.views[key] = self._strided(tensor)
        return self.views[key]

    def _strided(self, tensor: TensorInfo) -> torch.Tensor:
        data = self.storage(tensor.storage_id)
        size = itemsize(tensor.dtype)
        if tensor.byte_offset % size or len(data) % size:
            # A view at an offset the dtype cannot express: its own copy (no sharing possible).
            return _bytes_tensor(self.opened.array(tensor), tensor.dtype)
        typed = data.view(_torch_dtype(tensor.dtype))
        return typed.as_strided(tensor.shape, tensor.strides, tensor.byte_offset // size)


def _restored(opened: OpenCheckpoint, source: Source, base: torch.Tensor) -> torch.Tensor:
    """A recorded tie's value: the source object itself, its transpose (a view), or a cast copy.

    The cast is computed the way retie verified it (numpy, round to nearest even), so it is bit
    for bit the copy that was dropped, NaN payloads included.
    """
    if source.relation == "transposed":
        return base.permute(*range(base.dim() - 1, -1, -1))
    if source.relation == "cast":
        assert source.dtype is not None  # a cast record names its dtype
        return _bytes_tensor(restored_array(opened, source), source.dtype)
    return base


def load_tied(path: str) -> dict[str, torch.Tensor]:
    """Every name the checkpoint provides -> a torch tensor, ties restored as shared tensors.

    Stored names come back with their stored bytes (aliases in a .pt file share one storage);
    names recorded as ``{dropped: kept}`` are the very same object as kept; transposed copies are
    a transposed view of the kept tensor; cast copies are a new tensor cast from it. Raises
    MissingExtra (an ImportError) naming ``pip install 'tieaudit[torch]'`` when torch is missing.
    """
    require("load_tied", ("torch",))
    with open_checkpoint(path) as opened:
        copies = _StorageCopies(opened)
        state: dict[str, torch.Tensor] = {t.name: copies.view(t) for t in opened.checkpoint.tensors}
        for name, source in sources(opened.checkpoint).items():
            if name not in state:
                state[name] = _restored(opened, source, state[source.name])
        return state


def convert_to_torch(source: str, out: str | None, *, dry_run: bool = False) -> ConvertResult:
    """A safetensors file -> a torch.save file (OUT ending in .pt, .bin, ...) whose recorded ties are
    real aliasing again: ``{dropped: kept}`` names are the kept tensor itself (one storage), a
    transposed record a view of it (as retie writes .pt), a cast record its own tensor. The
    reverse of ``repair.convert.convert``; tensors are views of the input's mapping, written by
    ``torch_sink.save``: resident memory stays about one tensor.

    Verified and published like convert: the written file is read back (tieaudit's torch reader,
    then torch.load(weights_only=True)) and every name the input provides compared bit for bit.
    Raises MissingExtra without the torch extra.
    """
    require("convert to .pt", ("torch",))
    import torch

    if out is None and not dry_run:
        raise UsageError("say where the output goes: OUT (a new path), or --dry-run to print the plan")
    if out is not None and not os.path.basename(out).endswith(OUT_SUFFIXES["torch"]):
        suffixes = ", ".join(OUT_SUFFIXES["torch"])
        raise UsageError(f"OUT is a torch.save file: end its name in one of {suffixes}", out)
    if not os.path.exists(source):
        raise UsageError("no such file or folder", source)
    paths = None if dry_run or out is None else check_paths(source, out, False)
    with open_checkpoint(source if paths is None else paths.source.path) as opened:
        ckpt = opened.checkpoint
        if ckpt.format != "safetensors":
            raise UnsupportedFormatError(
                f"is a {ckpt.format} checkpoint; an OUT named as a torch file is written from one "
                "safetensors file only (to convert IN to safetensors, end OUT in .safetensors)",
                source,
            )
        found = sources(ckpt)
        groups: dict[str, list[str]] = {}
        for name, where in found.items():
            if name not in ckpt.names:
                groups.setdefault(where.name, []).append(name)
        plan = ConvertPlan(
            path=source,
            family=None,
            note="safetensors -> torch.save: recorded names become the kept tensor again (one storage)",
            stored=ckpt.tensors,
            shared=tuple(
                Shared(kept=k, dropped=tuple(d), copies=(), nbytes=ckpt.tensor(k).nbytes, why="its record")
                for k, d in groups.items()
            ),
            partial=(),
            input_bytes=sum(t.nbytes for t in ckpt.tensors),
            target="torch",
        )
        files = {os.path.basename(ckpt.path): os.path.basename(out or "")}
        if paths is None:
            return ConvertResult(source=source, plan=plan, written=None, files=files)

        def write(staged: str) -> list[str]:
            copies = _StorageCopies(opened, in_place=True)
            state: dict[str, torch.Tensor] = {t.name: copies.view(t) for t in ckpt.tensors}
            for name, where in found.items():
                if name not in state:
                    state[name] = _restored(opened, where, state[where.name])
            inputs = [os.path.join(os.path.dirname(ckpt.path), file) for file in ckpt.files]
            save(torch, state, staged, inputs=inputs)  # input pages given back behind each chunk
            return [staged]

        try:
            with signals_guarded() as guard:
                size, notes = write_and_publish(opened, paths, write, guard=guard)
        except OSError as exc:
            raise OutputError(f"cannot write: {exc.strerror or exc}", out) from exc
        return ConvertResult(
            source=source, plan=plan, written=out, files=files, output_bytes=size, notes=tuple(notes)
        )


def convert_checkpoint(source: str, out: str | None, *, dry_run: bool = False) -> ConvertResult:
    """``tieaudit convert``: to .pt (``convert_to_torch``) when OUT is named as a torch file, or, with
    no OUT, when IN is a .safetensors file; to safetensors (``repair.convert.convert``) otherwise."""
    named = out if out is not None else source
    if (out is not None and os.path.basename(out).endswith(OUT_SUFFIXES["torch"])) or (
        out is None and os.path.isfile(named) and named.endswith(".safetensors")
    ):
        return carried_copies(convert_to_torch(source, out, dry_run=dry_run), source)
    from tieaudit.repair.convert import convert

    return carried_copies(convert(source, out, dry_run=dry_run), source)


def carried_copies(result: ConvertResult, source: str) -> ConvertResult:
    """result with the untied copies its output keeps apart (``ConvertResult.copies``): the output
    audited as `check` audits it, so each fix is the retie command `check OUT` prints; a dry run
    audits the input. The output is written and verified by then: an audit that fails adds a note."""
    import dataclasses

    from tieaudit.audit import audit_path
    from tieaudit.core.errors import TieauditError

    path = result.written if result.written is not None else source
    try:
        findings = audit_path(path).findings
    except TieauditError as exc:
        note = printable(f"{path}: not audited for untied copies: {exc.message}")
        return dataclasses.replace(result, notes=(*result.notes, note))
    copies = tuple(f for f in findings if f.rule == "TIE001" and f.severity != "note")
    return dataclasses.replace(result, copies=copies)
