"""ONNX ties kept by sharing: one initializer the model reads both as embedding and as head.

A dynamo export of a tied language model stores the tied matrix once and feeds it to a Gather
(the embedding) and to a Transpose -> MatMul or a Gemm (the head): no two names share a storage,
yet the tie is there, and it is the good outcome (nothing to re-tie). Built from the reader's
consumer map alone; no tensor bytes are read.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tieaudit.core.records import Checkpoint, Consumer


@dataclass(frozen=True, kw_only=True)
class ConsumerTie:
    """One stored tensor read as a lookup table and as a matrix-product input."""

    initializer: str
    """The tensor's name (an initializer, or a Constant node's output)."""
    consumers: tuple[Consumer, ...]
    """Every node input slot reading it, with its role (at least one embedding and one head)."""
    nbytes: int
    """Bytes of the tensor, stored once for both uses."""
    aliases: tuple[str, ...] = ()
    """Identity outputs that are other names for it."""


def consumer_ties(ckpt: Checkpoint) -> tuple[ConsumerTie, ...]:
    """The tensors of ckpt read both as embedding and as head, in stored order."""
    aliases_of: dict[str, list[str]] = defaultdict(list)
    for alias, target in ckpt.aliases.items():
        aliases_of[target].append(alias)
    return tuple(
        ConsumerTie(
            initializer=name,
            consumers=uses,
            nbytes=ckpt.tensor(name).nbytes,
            aliases=tuple(aliases_of.get(name, ())),
        )
        for name, uses in ckpt.consumers.items()
        if any(u.role == "embedding" for u in uses) and any(u.role == "head" for u in uses)
    )
