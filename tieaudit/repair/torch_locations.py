"""Each storage's recorded location (``cpu``, ``cuda:0``) carried from a torch input to its output.

The torch writers load their input onto the CPU, whatever device its storages were saved from: no
GPU is needed and none is touched. ``torch.save`` then records the device a storage is on now, so
a checkpoint saved from ``cuda:0`` came out recorded as ``cpu`` (and loaded onto the CPU where
its users' ``torch.load`` put it on the GPU). Two hooks torch documents carry the location over:

- loading, ``map_location`` is ``StorageLocations.restore``: torch calls it with each storage and
  the location string the file records for it, before any device is touched; the storage stays on
  the CPU and its location is noted, by the storage's identity (``_cdata``, the key torch.save
  itself uses for a storage), holding the storage so that no other one can take its address;
- saving, a tagger in ``torch.serialization.register_package`` ahead of torch's own answers, while
  ``recorded`` is active in this thread, with the noted location of each storage it knows; for any
  other storage (one built in memory, as the safetensors -> .pt conversion builds every one) it
  answers nothing and torch's taggers record the device as usual.

The tagger is registered once per process and is inert outside ``recorded``: torch keeps no way to
remove one, and other code saving at the same time in another thread sees torch's own behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_PRIORITY = -1_000_003
"""Before torch's taggers (cpu is 10, cuda 20, ...). Unique: the registry sorts its (priority,
tagger, deserializer) tuples, and two equal priorities would compare functions."""

_active: ContextVar[StorageLocations | None] = ContextVar("tieaudit_storage_locations", default=None)
_registered = False
_register_lock = threading.Lock()


class StorageLocations:
    """The location string the input recorded for each storage one torch.load returned."""

    def __init__(self) -> None:
        self._noted: dict[int, tuple[Any, str]] = {}

    def restore(self, storage: Any, location: str) -> Any:
        """``map_location`` for torch.load: note location, leave the storage where it was loaded (CPU)."""
        self._noted[storage._cdata] = (storage, location)
        return storage

    def location_of(self, storage: Any) -> str | None:
        """The location noted for this storage (None: it did not come from the input)."""
        noted = self._noted.get(getattr(storage, "_cdata", -1))
        return None if noted is None else noted[1]

    def __len__(self) -> int:
        return len(self._noted)


def _tag(storage: Any) -> str | None:
    locations = _active.get()
    return None if locations is None else locations.location_of(storage)


def _deserialize(storage: Any, location: str) -> None:
    """Loading is left to torch's own deserializers."""
    return None


def _register(torch: Any) -> None:
    global _registered
    with _register_lock:
        if not _registered:
            torch.serialization.register_package(_PRIORITY, _tag, _deserialize)
            _registered = True


@contextmanager
def recorded(torch: Any, locations: StorageLocations | None) -> Iterator[None]:
    """While active in this thread, torch.save records each storage of locations where the input
    recorded it (locations None: torch's own behaviour)."""
    if locations is None:
        yield
        return
    _register(torch)
    token = _active.set(locations)
    try:
        yield
    finally:
        _active.reset(token)
