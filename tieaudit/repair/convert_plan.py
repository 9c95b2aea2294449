"""The convert plan: which names of a torch checkpoint are stored in safetensors, which are recorded.

torch.save keeps names that share memory as views of one storage; safetensors stores each tensor
by itself. Names that view a storage identically (same offset, shape, strides, dtype) become one
stored tensor plus ``{dropped: kept}`` records; every other view (a fused qkv sliced in three, a
slice of a larger storage) is written as its own tensor with its own bytes, never grown to the
storage. In a model folder the kept name is chosen with the tie table for every class of the
config's model type (``family_ties``): a name no class of the family ties to another, so the
encoder-only class and the seq2seq class, the base model and every head, all find it. A name the
family does not tie is stored as its own copy instead (transformers would initialise it randomly
if it were dropped). A single file has no config: the name kept is the input-embedding side
(retie's rule), and the plan says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tieaudit.core.errors import UnsafeInputError, UnsupportedFormatError
from tieaudit.core.escape import printable, quoted
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.core.units import plural
from tieaudit.formats.hf_ties import Spelling
from tieaudit.formats.tie_table import Answer, resolve, tie_table
from tieaudit.graph.detect import keep_rank
from tieaudit.repair.st_stream import DTYPE_CODES

REFUSED_GLOBALS = ("runs-code",)
"""Pickle globals convert refuses (as torch.load(weights_only=True) does): it converts state dicts."""


@dataclass(frozen=True, kw_only=True)
class Shared:
    """Names viewing one storage identically: one is stored, the others recorded."""

    kept: str
    """The name stored."""
    dropped: tuple[str, ...]
    """Names recorded as ``{dropped: kept}``."""
    copies: tuple[str, ...]
    """Names stored as their own copy (the model class does not tie them to kept)."""
    nbytes: int
    """Bytes of one of them."""
    why: str
    """Why kept was chosen."""


@dataclass(frozen=True, kw_only=True)
class PartialView:
    """A name viewing part of a storage (or the same bytes another way): written with its own bytes."""

    name: str
    """The name."""
    nbytes: int
    """Bytes written for it."""
    storage_bytes: int
    """Bytes of the storage it views."""
    shared_with: tuple[str, ...]
    """Other names of the same storage."""


@dataclass(frozen=True, kw_only=True)
class ConvertPlan:
    """Every decision for one input."""

    path: str
    """The input."""
    family: str | None
    """The model type whose classes chose the kept names (None: a file without config)."""
    note: str
    """How the kept names were chosen."""
    stored: tuple[TensorInfo, ...]
    """Tensors written, in input order."""
    shared: tuple[Shared, ...]
    """Groups of names viewing one storage identically."""
    partial: tuple[PartialView, ...]
    """Views written as their own tensors."""
    input_bytes: int
    """Bytes of the input's storages."""
    target: str = "safetensors"
    """What the output is: safetensors, or torch (the reverse: recorded names aliased again)."""
    omitted: str = ""
    """What of the input is not written, by design, or empty: a TorchScript archive's code and
    its objects' non-tensor attributes (every tensor is written or recorded)."""

    @property
    def records(self) -> dict[str, str]:
        """``{dropped: kept}`` for every dropped name."""
        return {d: s.kept for s in self.shared for d in s.dropped}

    @property
    def output_bytes(self) -> int:
        """Bytes of the tensors written (headers aside)."""
        return sum(t.nbytes for t in self.stored)


def family_ties(
    config: Mapping[str, Any] | None, stored: Sequence[str], path: str
) -> tuple[str, set[tuple[str, str]]] | None:
    """(model type, every ``(target, source)`` pair some class of that type ties under this
    config.json, spelled as stored); None when config.json names no model type the table knows.
    A class the table cannot resolve for this config contributes no pair (its names are kept)."""
    model_type = None if config is None else config.get("model_type")
    if config is None or not isinstance(model_type, str):
        return None
    table = tie_table()
    pairs: set[tuple[str, str]] = set()
    found = False
    for name in table.raw["classes"]:
        entry = table.entry(name)
        if entry is None or entry.model_type != model_type:
            continue
        found = True
        answer = resolve(entry, config, path)
        if not isinstance(answer, Answer):
            continue
        spelling = Spelling.of(entry, stored)
        for target, source in answer.ties.items():
            spelled_target, spelled_source = spelling.spell((target, source))
            pairs.add((spelled_target, spelled_source))
    return (model_type, pairs) if found else None


def _view_key(tensor: TensorInfo) -> tuple[object, ...]:
    return (tensor.storage_id, tensor.byte_offset, tensor.shape, tensor.strides, tensor.dtype)


def _whole(tensor: TensorInfo, storage_bytes: int) -> bool:
    return tensor.byte_offset == 0 and tensor.nbytes == storage_bytes


def refuse_unsafe(ckpt: Checkpoint) -> None:
    """Refuse a pickle naming globals torch.load(weights_only=True) refuses (nothing was run)."""
    named = sorted({g.name for g in ckpt.pickle_globals if g.verdict in REFUSED_GLOBALS})
    if named:
        shown = printable(", ".join(named)[:300])
        raise UnsafeInputError(
            f"its pickle names {shown} (TIE010), which torch.load(weights_only=True) refuses; "
            "convert converts state dicts only (nothing in the pickle was run)",
            ckpt.path,
        )


def _script_omitted(ckpt: Checkpoint) -> str:
    """What convert leaves out of a TorchScript archive (empty for any other input)."""
    if ckpt.format != "torchscript":
        return ""
    named = ", ".join(s.name for s in ckpt.skipped[:3])
    attributes = plural(ckpt.skipped_total, "non-tensor attribute")
    listed = f" ({named}{', ...' if ckpt.skipped_total > 3 else ''})" if named else ""
    return (
        f"its TorchScript code and {attributes}{listed}: safetensors holds tensors only "
        "(inspect --format json lists them)"
    )


def _more(count: int) -> str:
    return f" (and {count} more)" if count > 0 else ""


def refuse_unwritable(ckpt: Checkpoint) -> None:
    """Refuse an input with an entry safetensors cannot hold, naming it: a tensor tieaudit lists but
    does not read (quantized, sparse, meta, complex32, conj bit, ...) or a non-tensor value (an
    epoch, a learning rate). Converting without it would drop an entry torch.load returns. A
    Trainer folder's training files are copied as they are, so their entries are not in question."""
    layout = ckpt.training if ckpt.format == "hf-dir" else None
    beside = {p.path for p in layout.parts if p.role != "model"} if layout else set()
    unread = [u for u in ckpt.unread if u.file not in beside]
    if unread:
        first = unread[0]
        raise UnsupportedFormatError(
            f"{quoted(first.name)} is a tensor safetensors cannot hold as torch.load returns it "
            f"({printable(first.describe())}){_more(len(unread) - 1)}; convert writes every entry or "
            "nothing, so nothing was written",
            ckpt.path,
        )
    values = [s for s in ckpt.skipped if s.file and s.file not in beside]
    if values and ckpt.format != "torchscript":  # a module's attributes, not state-dict entries: omitted
        value = values[0]
        raise UnsupportedFormatError(
            f"{quoted(value.name)} is not a tensor ({printable(value.reason)}){_more(len(values) - 1)}, "
            "and safetensors holds tensors only; convert writes every entry or nothing, so nothing was "
            "written (save the state dict alone to convert it)",
            ckpt.path,
        )


def _group(
    names: list[TensorInfo], order: Mapping[str, int], ties: set[tuple[str, str]] | None
) -> tuple[Shared, list[str]]:
    """One group of identical views: the Shared decision and the names stored."""
    every = [t.name for t in names]
    if ties is None:
        best = min(names, key=lambda t: keep_rank(t, order[t.name], frozenset()))
        shared = Shared(
            kept=best.name,
            dropped=tuple(n for n in every if n != best.name),
            copies=(),
            nbytes=best.nbytes,
            why="no config.json: the input-embedding side (an embedding-like name), else the first stored",
        )
        return shared, [best.name]
    targets = {t for t, _ in ties}
    sources = frozenset(s for _, s in ties)
    candidates = [t for t in names if t.name not in targets] or names
    best = min(candidates, key=lambda t: keep_rank(t, order[t.name], frozenset(), sources=sources))
    tied = {t for t, s in ties if s == best.name} & set(every)
    if not tied:
        why = "the model class ties none of these names to another: each is stored"
    elif best.name in targets:
        why = "every name is tied by some class of the family; kept by retie's rule"
    else:
        why = "no class of the family ties it to another name, so every class finds it"
    dropped = tuple(n for n in every if n != best.name and n in tied)
    copies = tuple(n for n in every if n != best.name and n not in tied)
    return Shared(kept=best.name, dropped=dropped, copies=copies, nbytes=best.nbytes, why=why), [
        best.name,
        *copies,
    ]


def make_convert_plan(ckpt: Checkpoint, config: Mapping[str, Any] | None) -> ConvertPlan:
    """Decide, for every name of a torch checkpoint (file or folder), how safetensors stores it."""
    refuse_unsafe(ckpt)
    refuse_unwritable(ckpt)
    unknown = sorted({t.dtype for t in ckpt.tensors} - set(DTYPE_CODES))
    if unknown:
        raise UnsupportedFormatError(f"safetensors cannot store dtypes {unknown}", ckpt.path)
    order = {t.name: i for i, t in enumerate(ckpt.tensors)}
    family = family_ties(config, [t.name for t in ckpt.tensors], ckpt.path)
    ties = None if family is None else family[1]
    by_storage: dict[str, list[TensorInfo]] = {}
    for tensor in ckpt.tensors:
        by_storage.setdefault(tensor.storage_id, []).append(tensor)
    shared: list[Shared] = []
    partial: list[PartialView] = []
    keep: set[str] = set()
    for storage_id, tensors in by_storage.items():
        storage_bytes = ckpt.storages[storage_id].nbytes
        views: dict[tuple[object, ...], list[TensorInfo]] = {}
        for tensor in tensors:
            views.setdefault(_view_key(tensor), []).append(tensor)
        for group in views.values():
            if len(group) == 1:
                keep.add(group[0].name)
            else:
                decision, stored = _group(group, order, ties)
                shared.append(decision)
                keep.update(stored)
            if len(views) > 1 or not _whole(group[0], storage_bytes):
                others = tuple(t.name for t in tensors if _view_key(t) != _view_key(group[0]))
                partial.extend(
                    PartialView(name=t.name, nbytes=t.nbytes, storage_bytes=storage_bytes, shared_with=others)
                    for t in group
                    if t.name in keep
                )
    if family is not None:
        note = f"kept names chosen so that every {family[0]} class of the tie table loads the output"
    elif config is not None:
        note = "config.json names no model type the tie table knows: kept names by retie's rule"
    else:
        note = "a single file has no config.json: kept names are the input-embedding side (retie's rule)"
    return ConvertPlan(
        omitted=_script_omitted(ckpt),
        path=ckpt.path,
        family=None if family is None else family[0],
        note=note,
        stored=tuple(t for t in ckpt.tensors if t.name in keep),
        shared=tuple(shared),
        partial=tuple(partial),
        input_bytes=sum(s.nbytes for s in ckpt.storages.values()),
    )
