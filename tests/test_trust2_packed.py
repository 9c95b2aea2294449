"""Sub-byte quantized tensors (quint4x2, quint2x4) are bounded as torch bounds them.

torch counts the storage of a packed dtype in bytes and its view bound in the bytes the packed
elements take: 8 quint4x2 elements fit a storage of 4. tieaudit refused such files as "a view
past its storage" although torch loads them (issue 23, red-team finding 3); now it lists them as
tensors it does not read, and refuses exactly the views torch's set_ refuses.
"""

from __future__ import annotations

import json
import pickletools
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def quantized(shape: tuple[int, ...], dtype: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.rand(shape), 0.1, 0, dtype)


def inspect(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", "inspect", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("dtype", ["quint4x2", "quint2x4"])
@pytest.mark.parametrize("shape", [(8,), (7,), (3, 5), (0,)])
def test_packed_tensors_torch_loads_are_listed(tmp_path: Path, dtype: str, shape: tuple[int, ...]) -> None:
    path = tmp_path / "packed.pt"
    torch.save({"q": quantized(shape, getattr(torch, dtype))}, path)
    assert torch.load(path, weights_only=True)["q"].shape == shape
    out = inspect(path)
    assert out.returncode == 0, out.stderr
    unread = json.loads(out.stdout)["unread_tensors"]
    assert [(entry["name"], entry["dtype"], tuple(entry["shape"])) for entry in unread] == [
        ("q", dtype, shape)
    ]


@pytest.mark.parametrize(
    ("dtype", "size", "offset"), [("quint4x2", 9, 0), ("quint4x2", 8, 1), ("quint2x4", 9, 0)]
)
def test_views_past_the_packed_bytes_are_refused_as_torch_refuses_them(
    tmp_path: Path, dtype: str, size: int, offset: int
) -> None:
    """A view torch's set_ refuses is refused: the same storage, a larger size or offset."""
    path = tmp_path / "packed.pt"
    torch.save({"q": quantized((8,), getattr(torch, dtype))}, path)
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    name = next(member for member in members if member.endswith("data.pkl"))
    pickle = members[name]
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(pickle)]
    assert ("BININT1", 8) in ops  # the size, as torch.save writes it
    # offset 0 and size 8 are the only BININT1 0 / 8 right after the storage's persistent id
    patched = pickle.replace(b"K\x00K\x08\x85", bytes([0x4B, offset, 0x4B, size, 0x85]), 1)
    assert patched != pickle
    members[name] = patched
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(broken, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.load(broken, weights_only=True)
    out = inspect(broken)
    assert out.returncode == 2 and "a view reaching element" in out.stderr, out.stderr
