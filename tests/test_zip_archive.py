"""The strict zip reader: torch.save's layouts read (zip64 included), everything else refused.

torch.save writes each non-empty member with a data descriptor and ends with zip64 records;
archives past 4 GiB carry zip64 extra fields and 24-byte descriptors, as built here by hand and
checked against torch.load itself. Deviations from that clean layout are refused with a message
saying what is wrong.
"""

from __future__ import annotations

import io
import struct
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from tieaudit.core.errors import InputError
from tieaudit.formats import zip_archive
from tieaudit.formats.torch_file import TorchReader
from tieaudit.formats.zip_archive import read_archive, read_member

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / "hostile"))
from builders import pickle_of, state_dict, tensor, weights  # type: ignore[import-not-found]
from cases_torch import VERSION, Raw, archive, raw_zip  # type: ignore[import-not-found]


def zip64_everywhere(members: list[Raw]) -> bytes:
    """Every member as torch writes members past 4 GiB: sizes and offsets in zip64 extra fields,
    local zip64 fields, 24-byte data descriptors; end records pointing through zip64."""
    out, central = bytearray(), bytearray()
    for m in members:
        crc, offset = zlib.crc32(m.data), len(out)
        descriptor = bool(m.data)
        flags = 0x800 | (0x8 if descriptor else 0)
        local_extra = struct.pack("<HHQQ", 1, 16, len(m.data), 0) + b"FB\x00\x00"
        out += struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 45, flags, 0, 0, 0, 0, 0, 0, len(m.name), len(local_extra)
        )
        out += m.name + local_extra + m.data
        if descriptor:
            out += struct.pack("<IIQQ", 0x08074B50, crc, len(m.data), len(m.data))
        extra = struct.pack("<HHQQQ", 1, 24, len(m.data), len(m.data), offset)
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 0x31E, 45, flags, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF,
            len(m.name), len(extra), 0, 0, 0, 0, 0xFFFFFFFF,
        )  # fmt: skip
        central += m.name + extra
    cd_offset, count = len(out), len(members)
    out += central
    record = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x31E, 45, 0, 0, count, count, len(central), cd_offset)
    out += struct.pack("<IIQI", 0x07064B50, 0, record, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


def two_tensors() -> list[Raw]:
    obj = state_dict(("a", tensor("0", 4, (2, 2))), ("b", tensor("1", 3, (3,))), ("e", tensor("2", 0, (0,))))
    return [
        Raw(b"archive/data.pkl", pickle_of(obj)),
        Raw(b"archive/data/0", weights(4)),
        Raw(b"archive/data/1", struct.pack("<3f", 2, 1, 0)),
        Raw(b"archive/data/2", b""),
        Raw(b"archive/version", VERSION),
    ]


def read_both(path: Path) -> tuple[dict[str, list[object]], dict[str, list[object]]]:
    loaded = torch.load(path, weights_only=True, map_location="cpu")
    theirs = {name: value.tolist() for name, value in loaded.items()}
    with TorchReader().read(str(path)) as opened:
        ours = {t.name: np.asarray(opened.array(t)).tolist() for t in opened.checkpoint.tensors}
    return theirs, ours


def test_zip64_layout_reads_as_torch_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "zip64.pt"
    path.write_bytes(zip64_everywhere(two_tensors()))
    theirs, ours = read_both(path)
    assert theirs == ours and ours["b"] == [2.0, 1.0, 0.0]


def test_torch_save_and_zipfile_layouts_read(tmp_path: Path) -> None:
    saved = tmp_path / "saved.pt"
    torch.save({"x": torch.arange(6.0).reshape(2, 3), "empty": torch.zeros(0), "i": torch.arange(3)}, saved)
    theirs, ours = read_both(saved)
    assert theirs == ours
    with zipfile.ZipFile(saved) as source:
        members = {name: source.read(name) for name in source.namelist()}
    rewritten = tmp_path / "rewritten.pt"
    with zipfile.ZipFile(rewritten, "w") as target:
        for name, data in members.items():
            target.writestr(name, data)  # no data descriptors, no zip64, no padding
    assert read_both(rewritten) == (theirs, ours)


def _refused(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "bad.pt"
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        TorchReader().read(str(path))
    return str(caught.value)


def _patched(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def test_local_and_central_headers_must_agree(tmp_path: Path) -> None:
    good = raw_zip(archive())
    second = good.find(b"PK\x03\x04", 4)
    assert "local and central headers disagree" in _refused(
        tmp_path, _patched(good, second + 6, "<H", 0x808 | 2)
    )
    renamed = good[: second + 30] + b"ARCHIVE" + good[second + 37 :]
    assert "no matching local header" in _refused(tmp_path, renamed)
    plain = raw_zip(archive()[:2] + [Raw(b"archive/version", VERSION, descriptor=False)])
    third = plain.find(b"PK\x03\x04", plain.find(b"PK\x03\x04", 4) + 4)
    assert "disagree on its size" in _refused(tmp_path, _patched(plain, third + 18, "<I", 1))


def test_data_descriptors_must_match(tmp_path: Path) -> None:
    good = raw_zip(archive())
    descriptor = good.find(b"PK\x07\x08")
    assert "no record covers" in _refused(tmp_path, _patched(good, descriptor + 4, "<I", 1234))
    missing = raw_zip(
        [
            Raw(b"archive/data.pkl", pickle_of(state_dict()), descriptor=False),
            Raw(b"archive/version", VERSION),
        ]
    )
    flagged = _patched(missing, 6, "<H", 0x808)
    at = flagged.find(b"PK\x01\x02")
    assert "lacks the data descriptor" in _refused(tmp_path, _patched(flagged, at + 8, "<H", 0x808))


def test_end_records_must_end_the_file_and_agree(tmp_path: Path) -> None:
    good = raw_zip(archive())
    with_comment = _patched(good, len(good) - 2, "<H", 3) + b"abc"
    assert "end-of-central-directory" in _refused(tmp_path, with_comment)
    record = good.rfind(b"PK\x06\x06")
    counts = _patched(_patched(good, record + 24, "<Q", 7), record + 32, "<Q", 7)
    assert "disagree" in _refused(tmp_path, counts)
    short = raw_zip(archive(), zip64=False)
    at = short.rfind(b"PK\x05\x06")
    assert "not where the end record says" in _refused(tmp_path, _patched(short, at + 16, "<I", 5))


def test_extra_fields_must_be_well_formed(tmp_path: Path) -> None:
    good = zip64_everywhere(two_tensors())
    at = good.find(b"PK\x01\x02")
    name_len = struct.unpack_from("<H", good, at + 28)[0]
    assert "zip64 field" in _refused(tmp_path, _patched(good, at + 46 + name_len + 2, "<H", 16))


def test_member_count_and_directory_size_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = raw_zip(archive(extra=[Raw(b"archive/e/%d" % i, b"") for i in range(10)]))
    monkeypatch.setattr(zip_archive, "MAX_MEMBERS", 5)
    assert "13 members; at most 5" in _refused(tmp_path, data)
    monkeypatch.setattr(zip_archive, "MAX_MEMBERS", 100)
    monkeypatch.setattr(zip_archive, "MAX_CENTRAL_DIRECTORY_BYTES", 100)
    assert "central directory is" in _refused(tmp_path, data)


def test_deflated_members_are_bounded_and_must_inflate_exactly(tmp_path: Path) -> None:
    pickle = pickle_of(state_dict(("w", tensor("0", 2, (2,)))))
    members = [
        Raw(b"archive/data.pkl", pickle, deflate=True),
        Raw(b"archive/data/0", weights(2)),
        Raw(b"archive/version", VERSION),
    ]
    path = tmp_path / "deflated.pt"
    path.write_bytes(raw_zip(members))
    theirs, ours = read_both(path)
    assert theirs == ours
    with open(path, "rb") as handle:
        fd = handle.fileno()
        found = read_archive(fd, path.stat().st_size, str(path)).find("archive/data.pkl")
        assert found is not None and read_member(fd, found, 1 << 20, path=str(path)) == pickle
        with pytest.raises(InputError, match="larger than 10 bytes"):
            read_member(fd, found, 10, path=str(path))
    bomb = [Raw(b"archive/data.pkl", pickle + b" " * 200_000, deflate=True), Raw(b"archive/version", VERSION)]
    assert "zip bomb" in _refused(tmp_path, raw_zip(bomb))


def test_torch_save_to_a_buffer_and_a_file_name_both_read(tmp_path: Path) -> None:
    """torch names the archive's folder after the file (or 'archive' for a buffer)."""
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    (tmp_path / "from_buffer.pt").write_bytes(buffer.getvalue())
    torch.save({"w": torch.ones(2)}, tmp_path / "my model (v2).pt")
    for name in ("from_buffer.pt", "my model (v2).pt"):
        theirs, ours = read_both(tmp_path / name)
        assert theirs == ours == {"w": [1.0, 1.0]}
