"""repair.torch_sink: torch.save through a file that gives the input's mapped pages back.

What is measured is the resident size of the input file's own mappings (/proc/self/smaps), not the
process's: it is exact, whatever else the test process holds."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from tieaudit.repair.torch_sink import CHUNK_BYTES, file_mappings, release_tensor, save

MIB = 1 << 20


def resident(path: Path) -> int:
    """Bytes of path's mappings resident in this process."""
    ranges = set(file_mappings([str(path)]))
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            start, end = (int(part, 16) for part in head[0].split("-"))
            inside = (start, end) in ranges
        elif inside and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


@pytest.fixture
def big(tmp_path: Path) -> Path:
    path = tmp_path / "big.pt"
    weight = torch.randn(96 * MIB // 4)  # 96 MiB: six write chunks
    torch.save({"a": weight, "b": weight.clone(), "c": torch.arange(10)}, path)
    return path


def test_the_input_pages_are_given_back_as_they_are_written(big: Path, tmp_path: Path) -> None:
    loaded = torch.load(big, weights_only=True, mmap=True)
    total = sum(float(t.double().sum()) for t in loaded.values())  # every page read: resident
    assert resident(big) >= 150 * MIB
    save(torch, loaded, str(tmp_path / "out.pt"), inputs=[str(big)])
    # torch's zip writer reads a whole storage for its CRC before it writes it: one tensor at most
    # stays resident until the chunks behind it are released
    assert resident(big) <= CHUNK_BYTES + MIB
    again = torch.load(tmp_path / "out.pt", weights_only=True)
    assert sum(float(t.double().sum()) for t in again.values()) == total
    for name in loaded:
        assert torch.equal(again[name], loaded[name])  # released pages read back the same bytes


def members(path: Path) -> list[tuple[str, int, bytes]]:
    """(name below the archive's root folder, CRC, bytes) of every zip member."""
    with zipfile.ZipFile(path) as archive:
        return [(i.filename.split("/", 1)[1], i.CRC, archive.read(i)) for i in archive.infolist()]


def test_the_archive_holds_what_torch_save_writes_to_a_path(big: Path, tmp_path: Path) -> None:
    """The same records, bytes and CRCs; only the root folder differs: torch names it after the file
    when given a path, `archive` when given a file object (as for any non-ASCII file name)."""
    loaded = torch.load(big, weights_only=True, mmap=True)
    torch.save(loaded, tmp_path / "by-path.pt")
    save(torch, loaded, str(tmp_path / "by-sink.pt"), inputs=[str(big)])
    assert members(tmp_path / "by-path.pt") == members(tmp_path / "by-sink.pt")
    with zipfile.ZipFile(tmp_path / "by-sink.pt") as archive:
        assert archive.testzip() is None  # every CRC matches its bytes


def test_memory_that_is_not_a_mapping_of_an_input_is_never_released(big: Path, tmp_path: Path) -> None:
    """MADV_DONTNEED on anonymous memory would zero it: tensors built in memory keep their values."""
    built = {"x": torch.arange(32 * MIB // 8, dtype=torch.int64)}
    save(torch, built, str(tmp_path / "built.pt"), inputs=[str(big)])
    assert int(built["x"][-1]) == 32 * MIB // 8 - 1 and int(built["x"].sum()) == sum(range(32 * MIB // 8))
    release_tensor(built["x"], file_mappings([str(big)]))  # not inside big.pt's mappings: a no-op
    assert int(built["x"][-1]) == 32 * MIB // 8 - 1


def test_out_must_not_exist(big: Path, tmp_path: Path) -> None:
    (tmp_path / "taken.pt").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        save(torch, {"a": torch.zeros(2)}, str(tmp_path / "taken.pt"), inputs=[str(big)])
    assert (tmp_path / "taken.pt").read_bytes() == b"mine"
