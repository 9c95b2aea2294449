"""core.bytestore from several threads: verification and writing read one store from two."""

from __future__ import annotations

import mmap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tieaudit.core.bytestore import ByteStore
from tieaudit.core.records import StorageInfo


def test_two_threads_map_a_file_once_so_its_pages_can_be_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mapped twice, a file's second map would be the one drop() advises: pages read through the
    first stayed resident (a whole 1 GB tensor, now and then, in bench/scale.py's retie). A slow
    mmap widens the window the threads race in."""
    (tmp_path / "w.bin").write_bytes(bytes(range(256)) * 64)
    storage = StorageInfo(storage_id="s", file="w.bin", file_offset=0, nbytes=256 * 64, dtype="uint8")
    real = mmap.mmap

    def slow(*args: Any, **kwargs: Any) -> mmap.mmap:
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", slow)
    store = ByteStore(str(tmp_path))
    start = threading.Barrier(8)
    views: list[memoryview] = []
    fds: list[int] = []

    def read() -> None:
        start.wait()
        views.append(store.buffer(storage))
        fds.append(store._fd("w.bin"))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(view.obj) for view in views}) == 1  # one map, the one drop() advises
    assert views[0].obj is store._maps["w.bin"]
    assert len(set(fds)) == 1  # one descriptor: none leaked
    assert bytes(views[3][:4]) == b"\x00\x01\x02\x03"
    views.clear()  # the maps close only once no view is left
    store.close()
