"""retie for single safetensors files: the kept tensor stored once, the copies recorded.

An equal copy is recorded as ``{dropped: kept}`` in ``__metadata__`` (the convention of
``safetensors.torch.save_model``); a transposed or cast copy under ``tieaudit.ties`` (JSON), which
only ``tieaudit.load_tied`` restores. The input's other metadata is kept; its existing tie records
are kept too, re-pointed when the name they point to is itself dropped.
"""

from __future__ import annotations

import os

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import UsageError
from tieaudit.core.records import Checkpoint
from tieaudit.formats.safetensors import read_header
from tieaudit.formats.tie_records import (
    TIES_METADATA_KEY,
    TieRecord,
    rebase,
    record_metadata,
    split_metadata,
    string_metadata,
)
from tieaudit.repair.interface import Writer
from tieaudit.repair.plan import RetiePlan
from tieaudit.repair.st_stream import write_safetensors


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
        records.append(
            TieRecord(dropped=decision.dropped, kept=decision.kept, relation=decision.relation, dtype=dtype)
        )
    return records


class SafetensorsWriter(Writer):
    """Single safetensors files, rewritten in the input's tensor order."""

    format = "safetensors"

    def write(self, opened: OpenCheckpoint, plan: RetiePlan, out: str) -> list[str]:
        ckpt = opened.checkpoint
        file = os.path.basename(ckpt.path)
        header = read_header(ckpt.path, file)
        applied = decision_records(ckpt, plan)
        dropped = {r.dropped for r in applied}
        plain, existing = split_metadata(header.metadata, ckpt.names, file)
        metadata = record_metadata(plain, [*rebase(existing, applied), *applied])
        tensors = [t for t in ckpt.tensors if t.name not in dropped]
        write_safetensors(out, opened, tensors, metadata=string_metadata(metadata))
        return [out]
