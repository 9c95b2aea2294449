"""retie for Hugging Face model folders: weight files and index rewritten, everything else copied.

This module writes safetensors weights; a folder of ``pytorch_model.bin`` files is written by
``bin_writer`` (copies become views; the config and the other files are handled here alike).

Dropped names leave the weight files and the index ``weight_map``; each is recorded where the
readers look: ``{dropped: kept}`` (and ``tieaudit.ties`` for transposed or cast copies) in the
index ``metadata`` for a sharded folder (huggingface_hub's convention), else in the
``__metadata__`` of the file holding the kept tensor. When the re-tied pair is the one the
model class ties under ``tie_word_embeddings``, config.json gets the flag set true so that
transformers ties it again on load (the plan re-ties the class's other pairs the flag ties, such
as a masked-LM head's bias, when their bytes are equal); an equal copy the class does not tie is
refused, as transformers would load it randomly initialised, unless the plan was made with
--all-equal (which prints that consequence). Other files are copied byte for byte (link targets are
copied, never links, and only from inside the folder).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import UnsafeInputError, UnsupportedFormatError, UsageError
from tieaudit.core.records import Checkpoint, TensorInfo
from tieaudit.formats.hf.variants import weights_folder, weights_target
from tieaudit.formats.hf_covered import not_copied
from tieaudit.formats.hf_dir import (
    WeightSet,
    confined_path,
    load_json,
    read_config,
    torch_weights,
)
from tieaudit.formats.hf_reader import weights_at
from tieaudit.formats.hf_ties import CONFIG, TIE_FLAG, class_pairs, with_flag
from tieaudit.formats.safetensors import read_header
from tieaudit.formats.tie_records import TieRecord, rebase, record_metadata, split_metadata, string_metadata
from tieaudit.repair.interface import Writer
from tieaudit.repair.plan import RetiePlan
from tieaudit.repair.safetensors_writer import decision_records
from tieaudit.repair.st_stream import write_safetensors


def side_files(folder: str, skip: Iterable[str]) -> list[str]:
    """Every file of the folder (relative, ``/``-separated) except skip; refuses linked subfolders."""
    skipped = set(skip)
    found = []
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                rel = os.path.relpath(os.path.join(root, name), folder)
                raise UnsafeInputError(f"{rel} is a link to a folder; retie copies files only", folder)
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel not in skipped:
                found.append(rel)
    return sorted(found)


def copy_file(folder: str, rel: str, out: str) -> str:
    """Copy one file's content (a link's target, confined to the folder) to out/rel."""
    source = confined_path(folder, rel)
    target = os.path.join(out, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(source, target)
    return target


def write_json(path: str, value: object) -> str:
    """Write value as indented JSON (the layout transformers writes) at a new path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "x", encoding="utf-8") as handle:
        handle.write(json.dumps(value, indent=2) + "\n")
    return path


def file_tensors(ckpt: Checkpoint, file: str, dropped: set[str]) -> list[TensorInfo]:
    """The tensors of one weight file that the output keeps, in stored order."""
    return [t for t in ckpt.tensors if t.file == file and t.name not in dropped]


FileMetadata = dict[str, tuple[dict[str, object], list[TieRecord]]]
"""Weight file -> (its metadata entries that are not tie records, its tie records re-pointed)."""


def file_metadata(ckpt: Checkpoint, weights: WeightSet, applied: list[TieRecord]) -> FileMetadata:
    """Each weight file's own ``__metadata__``, its tie records re-pointed past dropped names."""
    found: FileMetadata = {}
    for file in weights.files:
        metadata = read_header(confined_path(weights_folder(ckpt.path), file), file).metadata
        names = [t.name for t in ckpt.tensors if t.file == file]
        plain, existing = split_metadata(metadata, names, file)
        found[file] = (plain, rebase(existing, applied))
    return found


def place_records(
    ckpt: Checkpoint, weights: WeightSet, per_file: FileMetadata, *, applied: list[TieRecord]
) -> tuple[dict[str, list[TieRecord]], list[TieRecord]]:
    """(records per weight file, records for the index).

    Without an index every record goes to the file holding its kept name (where the readers
    look); with one, a file keeps the records it had while their kept name is still its own, and
    everything else goes to the index (huggingface_hub's convention).
    """
    dropped = {r.dropped for r in applied}
    holder = {t.name: t.file for t in ckpt.tensors if t.name not in dropped}

    def held_by(records: Iterable[TieRecord], file: str) -> list[TieRecord]:
        return [r for r in records if holder.get(r.kept) == file]

    if weights.index is None:
        every = [r for _, records in per_file.values() for r in records] + applied
        return {file: held_by(every, file) for file in weights.files}, []
    placed = {file: held_by(records, file) for file, (_, records) in per_file.items()}
    moved = [r for file, (_, records) in per_file.items() for r in records if r not in placed[file]]
    return placed, moved + applied


def rewrite_weights(
    opened: OpenCheckpoint, weights: WeightSet, applied: list[TieRecord], *, out: str
) -> tuple[list[str], list[TieRecord]]:
    """Write every weight file that still holds a tensor; returns (files written, records for the index)."""
    ckpt = opened.checkpoint
    per_file = file_metadata(ckpt, weights, applied)
    placed, for_index = place_records(ckpt, weights, per_file, applied=applied)
    dropped = {r.dropped for r in applied}
    written = []
    for file in weights.files:
        tensors = file_tensors(ckpt, file, dropped)
        if not tensors:
            continue  # every tensor of this shard was a copy: the shard is not written at all
        metadata = string_metadata(record_metadata(per_file[file][0], placed[file]))
        target = os.path.join(out, file)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_safetensors(target, opened, tensors, metadata=metadata)
        written.append(target)
    return written, for_index


def rewrite_index(
    ckpt: Checkpoint, index: str, records: list[TieRecord], *, names: set[str], out: str
) -> str:
    """The index without the dropped names, with the tie records and updated totals in ``metadata``."""
    raw: dict[str, Any] = dict(load_json(weights_folder(ckpt.path), index))
    dropped = [ckpt.tensor(name) for name in sorted(names)]
    raw["weight_map"] = {k: v for k, v in raw["weight_map"].items() if k not in names}
    plain, existing = split_metadata(raw.get("metadata") or {}, ckpt.names, index)
    totals = {"total_size": sum(t.nbytes for t in dropped), "total_parameters": sum(t.numel for t in dropped)}
    for key, less in totals.items():
        value = plain.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            plain[key] = value - less
    by_dropped = {r.dropped: r for r in [*rebase(existing, records), *records]}
    raw["metadata"] = record_metadata(plain, by_dropped.values())
    return write_json(os.path.join(out, index), raw)


def refuse_unrestorable(ckpt: Checkpoint, applied: list[TieRecord], pairs: set[tuple[str, str]]) -> None:
    """transformers restores a dropped name only through the class's own ties: an equal copy that
    is not one of them would come back randomly initialised, so it is refused rather than written.
    (Transposed and cast copies are applied only on request, for tieaudit.load_tied.)"""
    for record in applied:
        if (
            record.relation == "equal"
            and not {(record.dropped, record.kept), (record.kept, record.dropped)} & pairs
        ):
            raise UsageError(
                f"{record.dropped} is an equal copy of {record.kept}, but the model class in {CONFIG} does "
                "not tie them (or is not known): transformers would initialise it randomly on load, "
                "so it is not re-tied here",
                ckpt.path,
            )


def retied_config(
    ckpt: Checkpoint, config: Mapping[str, Any], applied: list[TieRecord], *, all_equal: bool = False
) -> dict[str, Any] | None:
    """config with the flag set, when an equal re-tie is a pair the class ties and the config does
    not tie yet; None when config.json stays as it is.

    Refuses what transformers would not restore (``refuse_unrestorable``; unless all_equal, where
    the plan states that consequence), and a flag that would also tie another pair of the class
    whose names both stay stored (the plan re-ties those it found equal: ``loaders.flag_companions``,
    which also refuses a flag the class's forward reads, before anything is written).
    """
    pairs = class_pairs(ckpt, config)
    if not all_equal:
        refuse_unrestorable(ckpt, applied, pairs)
    current = {(t.dropped, t.kept) for t in ckpt.declared_ties if t.declared_by == "config"}
    retied = {(r.dropped, r.kept) for r in applied if r.relation == "equal"}
    hits = {p for p in pairs if p in retied or p[::-1] in retied}
    if not hits or hits <= current:
        return None
    stored = ckpt.names - {r.dropped for r in applied}
    for target, source in sorted(pairs - current - hits):
        if target in stored and source in stored:
            raise UsageError(
                f"setting {TIE_FLAG} in {CONFIG} would also tie {target} to {source}, which both stay "
                "stored and were not found equal; re-tie them too or edit the config yourself",
                ckpt.path,
            )
    return with_flag(config)


def _folders(out: str) -> list[str]:
    """out and its subfolders, deepest first, so their entries are fsynced too."""
    found = [root for root, _, _ in os.walk(out)]
    return sorted(found, key=len, reverse=True)


class HfDirWriter(Writer):
    """Hugging Face model folders: safetensors weights (single, sharded or loose) lose their
    dropped names; pytorch_model.bin weights keep them as views (``bin_writer``)."""

    format = "hf-dir"

    def write(self, opened: OpenCheckpoint, plan: RetiePlan, out: str) -> list[str]:
        ckpt = opened.checkpoint
        folder, weights = weights_at(ckpt.path)
        pickles = torch_weights(weights.files)
        if pickles and not all(torch_weights((file,)) for file in weights.files):
            raise UnsupportedFormatError("the folder's weights mix torch and safetensors files", folder)
        applied = decision_records(ckpt, plan)
        config, _ = read_config(folder)
        # In a .bin every name stays (a view), so none comes back randomly initialised.
        lenient = plan.all_equal or pickles
        edited = None if config is None else retied_config(ckpt, config, applied, all_equal=lenient)
        os.mkdir(out)
        rewritten = not_copied(folder, weights, alone=weights_target(ckpt.path))
        if edited is not None:
            rewritten.add(CONFIG)
        written = [copy_file(folder, rel, out) for rel in side_files(folder, rewritten)]
        if edited is not None:
            written.append(write_json(os.path.join(out, CONFIG), edited))
        if pickles:
            from tieaudit.repair.bin_writer import bin_index, write_bin_weights

            weight_files, moved = write_bin_weights(ckpt, weights, plan, out=out)
            written += weight_files
            if weights.index is not None:
                index = bin_index(ckpt, weights.index, moved, saved=plan.saved_bytes)
                written.append(write_json(os.path.join(out, weights.index), index))
            return written + _folders(out)
        weight_files, for_index = rewrite_weights(opened, weights, applied, out=out)
        written += weight_files
        if weights.index is not None:
            written.append(
                rewrite_index(ckpt, weights.index, for_index, names={r.dropped for r in applied}, out=out)
            )
        return written + _folders(out)
