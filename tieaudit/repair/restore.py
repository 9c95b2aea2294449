"""Every name a checkpoint provides, stored or restored from a recorded tie, as numpy arrays.

This is what tieaudit.load_tied does without torch, and what retie's verification reads back:
stored names map to their bytes; ``{dropped: kept}`` records and ONNX Identity aliases give an
equal copy; tieaudit's own ``tieaudit.ties`` record gives a transposed or cast one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import cast
from tieaudit.core.records import Checkpoint


@dataclass(frozen=True)
class Source:
    """Where a name's values come from."""

    name: str
    """The stored tensor holding the bytes."""
    relation: str
    """stored (the name itself), equal, transposed or cast."""
    dtype: str | None = None
    """For a cast: the dtype the stored tensor is cast to."""


def sources(ckpt: Checkpoint) -> dict[str, Source]:
    """Name -> where its values come from, for every name the checkpoint provides."""
    stored = ckpt.names
    found = {name: Source(name, "stored") for name in stored}
    for alias, target in ckpt.aliases.items():
        if target in stored:
            found.setdefault(alias, Source(target, "equal"))
    for tie in ckpt.declared_ties:
        if tie.declared_by in ("metadata", "index") and tie.kept in stored and tie.dropped not in stored:
            found.setdefault(tie.dropped, Source(tie.kept, tie.relation, tie.dtype))
    return found


def restored_array(opened: OpenCheckpoint, source: Source) -> np.ndarray:
    """The values of a name (a zero-copy view except for a cast)."""
    kept = opened.checkpoint.tensor(source.name)
    array = opened.array(kept)
    if source.relation == "transposed":
        return array.T
    if source.relation == "cast" and source.dtype is not None:
        return cast(array, kept.dtype, source.dtype)
    return array
