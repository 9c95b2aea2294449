"""``load_tied``: a checkpoint as a torch state dict in which re-tied names are one tensor again.

Needs the torch extra (imported on the first call, never by ``import tieaudit``). Bytes are read
through tieaudit's own readers (no pickle code runs) and copied out of the memory maps once per
storage, so names that share a storage in the file share one in memory too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.dtypes import itemsize
from tieaudit.core.extras import require
from tieaudit.core.records import TensorInfo
from tieaudit.formats import open_checkpoint
from tieaudit.repair.restore import Source, restored_array, sources

if TYPE_CHECKING:
    import torch

ViewKey = tuple[str, int, tuple[int, ...], tuple[int, ...], str]


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    found: torch.dtype = getattr(torch, dtype)
    return found


def _bytes_tensor(array: np.ndarray) -> torch.Tensor:
    """A new torch tensor holding array's values (any dtype, ml_dtypes included), bit for bit."""
    import torch

    contiguous = np.ascontiguousarray(array)
    raw = contiguous.reshape(-1).view(np.uint8)
    return torch.from_numpy(raw.copy()).view(_torch_dtype(str(contiguous.dtype.name))).reshape(array.shape)


class _StorageCopies:
    """One uint8 torch copy per storage; tensors are typed, strided views of it."""

    def __init__(self, opened: OpenCheckpoint) -> None:
        self.opened = opened
        self.storages: dict[str, torch.Tensor] = {}
        self.views: dict[ViewKey, torch.Tensor] = {}

    def storage(self, storage_id: str) -> torch.Tensor:
        import torch

        if storage_id not in self.storages:
            buffer = self.opened.store.buffer(self.opened.checkpoint.storages[storage_id])
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
            return _bytes_tensor(self.opened.array(tensor))
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
        return _bytes_tensor(restored_array(opened, source))
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
