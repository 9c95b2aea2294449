"""Copies across files: tensors of one checkpoint stored again, byte for byte, in another.

A repository often holds one model twice (``model.safetensors`` beside ``pytorch_model.bin``), an
export beside its source, or decoders that each carry the same weights (optimum's
``decoder_model.onnx`` and ``decoder_with_past_model.onnx``). Each checkpoint's own copy search
(``graph.detect``) cannot see that; this one compares checkpoints with each other, staged as that
one is: bucket by dtype and shape -> sampled fingerprint -> exact byte comparison. Names play no
part (an ONNX export renames every weight). Constant tensors (norm scales, zero biases) are never
candidates, nor tensors under the size threshold: equal by construction across any two models.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.records import TensorInfo
from tieaudit.graph.compare import BlockComparer, equal_bytes, is_constant, sample


@dataclass(frozen=True, kw_only=True)
class AcrossCopy:
    """A tensor of a later checkpoint whose bytes an earlier checkpoint already holds."""

    first: int
    """Index of the earlier checkpoint (the one holding the original)."""
    first_name: str
    """The original's name there."""
    first_file: str
    """The file holding it, relative to that checkpoint's folder (``TensorInfo.file``)."""
    second: int
    """Index of the later checkpoint."""
    second_name: str
    """The copy's name there."""
    second_file: str
    """The file holding the copy, relative to that checkpoint's folder."""
    nbytes: int
    """Bytes the copy occupies."""


def _candidates(opened: OpenCheckpoint, min_bytes: int) -> list[TensorInfo]:
    """One tensor per distinct view of a checkpoint, large enough to matter and readable as numbers."""
    seen: set[tuple[object, ...]] = set()
    chosen = []
    for tensor in opened.checkpoint.tensors:
        key = (tensor.storage_id, tensor.byte_offset, tensor.shape, tensor.strides, tensor.dtype)
        if tensor.nbytes >= min_bytes and tensor.numel > 1 and key not in seen:
            seen.add(key)
            chosen.append(tensor)
    return chosen


def find_across(checkpoints: Sequence[OpenCheckpoint], min_bytes: int) -> list[AcrossCopy]:
    """Every tensor of checkpoints[j] equal byte for byte to one of an earlier checkpoints[i]
    (i < j), matched to the earliest such; a copy within one checkpoint is detect's, not this."""
    buckets: dict[tuple[str, tuple[int, ...]], list[tuple[int, TensorInfo]]] = defaultdict(list)
    for index, opened in enumerate(checkpoints):
        for tensor in _candidates(opened, min_bytes):
            buckets[(tensor.dtype, tensor.shape)].append((index, tensor))
    comparer = BlockComparer()
    found: list[AcrossCopy] = []
    for members in buckets.values():
        if len({index for index, _ in members}) < 2:
            continue
        by_print: dict[bytes, list[tuple[int, TensorInfo]]] = defaultdict(list)
        for index, tensor in members:
            array = sample(checkpoints[index], tensor)
            values, size = array.tobytes(), array.itemsize
            if values == values[:size] * array.size and is_constant(checkpoints[index], tensor):
                continue  # a constant (ones, zeros): equal in any two models, not a copy
            by_print[values].append((index, tensor))
        for same in by_print.values():
            found.extend(_verified(checkpoints, same, comparer))
    return sorted(found, key=lambda c: (c.second, c.second_name))


def _verified(
    checkpoints: Sequence[OpenCheckpoint], same: list[tuple[int, TensorInfo]], comparer: BlockComparer
) -> list[AcrossCopy]:
    """Of tensors with one fingerprint, those equal to one in an earlier checkpoint."""
    if len({index for index, _ in same}) < 2:
        return []
    originals: list[tuple[int, TensorInfo]] = []  # distinct values seen so far, earliest first
    found = []
    for index, tensor in same:
        opened = checkpoints[index]
        match = next(
            (
                (at, kept)
                for at, kept in originals
                if at < index and equal_bytes(checkpoints[at], kept, tensor, comparer=comparer, other=opened)
            ),
            None,
        )
        if match is None:
            originals.append((index, tensor))
        else:
            found.append(
                AcrossCopy(
                    first=match[0],
                    first_name=match[1].name,
                    first_file=match[1].file,
                    second=index,
                    second_name=tensor.name,
                    second_file=tensor.file,
                    nbytes=tensor.nbytes,
                )
            )
    return found
