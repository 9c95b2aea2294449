"""retie for single safetensors files: the kept tensor stored once, the copies recorded.

An equal copy is recorded as ``{dropped: kept}`` in ``__metadata__`` (the convention of
``safetensors.torch.save_model``); a transposed or cast copy under ``tieaudit.ties`` (JSON), which
only ``tieaudit.load_tied`` restores. The input's other metadata is kept; its existing tie records
are kept too, re-pointed when the name they point to is itself dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tieaudit.core.errors import UsageError
from tieaudit.core.records import Checkpoint
from tieaudit.formats.safetensors import TIES_METADATA_KEY, read_header, tieaudit_ties
from tieaudit.repair.interface import Writer
from tieaudit.repair.plan import RetiePlan
from tieaudit.repair.st_stream import write_safetensors


@dataclass(frozen=True)
class TieRecord:
    """How a name that is not stored is restored from one that is."""

    dropped: str
    """The name not stored."""
    kept: str
    """The stored name holding its values."""
    relation: str
    """equal, transposed (dropped == kept.T) or cast (dropped == kept cast to dtype)."""
    dtype: str | None = None
    """For a cast: the canonical dtype of dropped."""


def decision_records(ckpt: Checkpoint, plan: RetiePlan) -> list[TieRecord]:
    """One record per applied decision; refuses what a record cannot express."""
    records = []
    for decision in plan.applied:
        if decision.relation == "cast" and decision.transposed:
            raise UsageError(
                f"{decision.dropped} is a transposed cast of {decision.kept}; a {TIES_METADATA_KEY} "
                "record cannot express a transposed cast yet: leave cast out of --relations",
                plan.path,
            )
        dtype = ckpt.tensor(decision.dropped).dtype if decision.relation == "cast" else None
        records.append(TieRecord(decision.dropped, decision.kept, decision.relation, dtype))
    return records


def split_metadata(
    metadata: Mapping[str, object], stored: Iterable[str], where: str
) -> tuple[dict[str, object], list[TieRecord]]:
    """(entries that are not tie records, the tie records) of a ``__metadata__`` or index metadata."""
    names = frozenset(stored)
    plain: dict[str, object] = {}
    records: list[TieRecord] = []
    for key, value in metadata.items():
        if key == TIES_METADATA_KEY:
            continue
        if isinstance(value, str) and value in names and key != value and key not in names:
            records.append(TieRecord(key, value, "equal"))
        else:
            plain[key] = value
    record = metadata.get(TIES_METADATA_KEY)
    ties = tieaudit_ties(record if isinstance(record, str) else None, where, "metadata")
    records.extend(TieRecord(tie.target, tie.source, tie.relation, tie.dtype) for tie in ties)
    return plain, records


def _compose(record: TieRecord, via: TieRecord) -> TieRecord:
    """record (dropped from via.dropped) re-expressed from via.kept."""
    if record.relation == "equal":
        return TieRecord(record.dropped, via.kept, via.relation, via.dtype)
    if via.relation == "equal":
        return TieRecord(record.dropped, via.kept, record.relation, record.dtype)
    if record.relation == via.relation == "transposed":
        return TieRecord(record.dropped, via.kept, "equal")
    raise UsageError(
        f"{record.dropped} is recorded as a {record.relation} copy of {record.kept}, itself a "
        f"{via.relation} copy of {via.kept}; that chain has no record: pass --keep {record.kept}"
    )


def rebase(records: Iterable[TieRecord], applied: Iterable[TieRecord]) -> list[TieRecord]:
    """Existing records re-pointed where the name they point to is dropped by this retie."""
    by_dropped = {r.dropped: r for r in applied}
    return [_compose(r, by_dropped[r.kept]) if r.kept in by_dropped else r for r in records]


def record_metadata(plain: Mapping[str, object], records: Iterable[TieRecord]) -> dict[str, object]:
    """plain entries, then ``{dropped: kept}`` for equal records and ``tieaudit.ties`` for the rest."""
    metadata = dict(plain)
    ties: dict[str, dict[str, str]] = {}
    for record in records:
        if record.relation == "equal":
            metadata[record.dropped] = record.kept
            continue
        entry = {"source": record.kept, "relation": record.relation}
        if record.dtype is not None:
            entry["dtype"] = record.dtype
        ties[record.dropped] = entry
    if ties:
        metadata[TIES_METADATA_KEY] = json.dumps(ties, sort_keys=True, separators=(",", ":"))
    return metadata


def string_metadata(metadata: Mapping[str, object]) -> dict[str, str]:
    """A ``__metadata__`` map: safetensors allows strings only (the input's were already strings)."""
    return {key: value for key, value in metadata.items() if isinstance(value, str)}


class SafetensorsWriter(Writer):
    """Single safetensors files, rewritten in the input's tensor order."""

    format = "safetensors"

    def write(self, ckpt: Checkpoint, plan: RetiePlan, out: str) -> list[str]:
        file = os.path.basename(ckpt.path)
        header = read_header(ckpt.path, file)
        applied = decision_records(ckpt, plan)
        dropped = {r.dropped for r in applied}
        plain, existing = split_metadata(header.metadata, ckpt.names, file)
        metadata = record_metadata(plain, [*rebase(existing, applied), *applied])
        tensors = [t for t in ckpt.tensors if t.name not in dropped]
        write_safetensors(out, ckpt, tensors, string_metadata(metadata))
        return [out]
