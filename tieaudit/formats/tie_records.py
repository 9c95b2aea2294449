"""The tie-record codec: how a file records that a name it does not store is another name's values.

Two records exist. ``{dropped: kept}`` entries in safetensors ``__metadata__`` (and a shard index's
``metadata``) are safetensors.torch.save_model's convention for equal copies; tieaudit's own
``tieaudit.ties`` entry (JSON ``{dropped: {"source", "relation", "dtype"}}``, in safetensors
metadata or ONNX ``metadata_props``) adds transposed and cast copies. Readers turn them into
``DeclaredTie``; retie writes them from ``TieRecord``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tieaudit.core.dtypes import ITEMSIZE
from tieaudit.core.errors import InputError, UsageError, one_line
from tieaudit.core.records import DeclaredBy, DeclaredTie

TIES_METADATA_KEY = "tieaudit.ties"
"""Namespaced metadata key for relations other loaders do not restore (transposed, cast)."""


@dataclass(frozen=True, kw_only=True)
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


def metadata_ties(
    metadata: dict[str, str], stored: set[str], where: str, *, declared_by: DeclaredBy
) -> list[DeclaredTie]:
    """``{dropped: kept}`` records (safetensors.torch.save_model's convention) as declared ties,
    plus tieaudit's own ``tieaudit.ties`` record (JSON) for transposed and cast relations."""
    ties = []
    for dropped, kept in sorted(metadata.items()):
        # Other metadata ("format": "pt", ...) names no stored tensor; a tie record always does.
        if kept in stored and dropped != kept:
            ties.append(DeclaredTie(dropped=dropped, kept=kept, declared_by=declared_by, where=where))
    ties.extend(tieaudit_ties(metadata.get(TIES_METADATA_KEY), where, declared_by))
    return ties


def tieaudit_ties(record: str | None, where: str, declared_by: DeclaredBy) -> list[DeclaredTie]:
    """Parse a ``tieaudit.ties`` record: ``{dropped: {"source", "relation", "dtype"}}``."""
    if record is None:
        return []
    try:
        entries = json.loads(record)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{TIES_METADATA_KEY} is not valid JSON ({one_line(exc, 200)})", where) from exc
    if not isinstance(entries, dict):
        raise InputError(f"{TIES_METADATA_KEY} must be a JSON object", where)
    ties = []
    for dropped, entry in sorted(entries.items()):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("source"), str)
            or entry.get("relation") not in ("equal", "transposed", "cast")
            # str(): a JSON list or object as dtype is unhashable; no such value names a dtype.
            or (entry["relation"] == "cast" and str(entry.get("dtype")) not in ITEMSIZE)
        ):
            raise InputError(f"{TIES_METADATA_KEY} entry for {dropped!r} is malformed", where)
        ties.append(
            DeclaredTie(
                dropped=dropped,
                kept=entry["source"],
                declared_by=declared_by,
                where=f"{where}:{TIES_METADATA_KEY}",
                relation=entry["relation"],
                dtype=entry.get("dtype"),
            )
        )
    return ties


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
            records.append(TieRecord(dropped=key, kept=value, relation="equal"))
        else:
            plain[key] = value
    record = metadata.get(TIES_METADATA_KEY)
    ties = tieaudit_ties(record if isinstance(record, str) else None, where, "metadata")
    records.extend(
        TieRecord(dropped=tie.dropped, kept=tie.kept, relation=tie.relation, dtype=tie.dtype) for tie in ties
    )
    return plain, records


def composed_relation(outer: str, inner: str) -> str | None:
    """The relation of X to Z when X is ``outer`` of Y and Y is ``inner`` of Z: equal is the
    identity, two transposes cancel; None when no single relation expresses the chain (a cast of a
    transpose, a cast of a cast)."""
    if outer == "equal":
        return inner
    if inner == "equal":
        return outer
    return "equal" if outer == inner == "transposed" else None


def compose(record: TieRecord, via: TieRecord) -> TieRecord:
    """record (dropped from via.dropped) re-expressed from via.kept."""
    relation = composed_relation(record.relation, via.relation)
    if relation is None:
        raise UsageError(
            f"{record.dropped} is recorded as a {record.relation} copy of {record.kept}, itself a "
            f"{via.relation} copy of {via.kept}; that chain has no record: pass --keep {record.kept}"
        )
    dtype = record.dtype if record.relation == "cast" else via.dtype if via.relation == "cast" else None
    return TieRecord(dropped=record.dropped, kept=via.kept, relation=relation, dtype=dtype)


def rebase(records: Iterable[TieRecord], applied: Iterable[TieRecord]) -> list[TieRecord]:
    """Existing records re-pointed where the name they point to is dropped by this retie."""
    by_dropped = {r.dropped: r for r in applied}
    return [compose(r, by_dropped[r.kept]) if r.kept in by_dropped else r for r in records]


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
