"""A file that is both safetensors and torch.save data is refused, whatever its name.

The outside red team's polyglot: a safetensors header whose 8-byte length starts with the zip magic
``PK\\x03\\x04`` (so the header is 67 MB of JSON and spaces), and a complete torch.save zip, with a
payload in its data.pkl, stored as the one U8 tensor. safetensors reads one tensor from it;
torch.load, under any name but ``*.safetensors`` (or given the open file), unpickles the zip and
runs the payload. tieaudit read it as safetensors and said "ok".
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from torch_child import torch_load

HEADER_LEN = int.from_bytes(b"PK\x03\x04\x00\x00\x00\x00", "little")
"""The safetensors header length whose first 4 bytes are a zip local header."""


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, ("open('MARKER', 'w').close()",))


def _polyglot(path: Path) -> None:
    torch = pytest.importorskip("torch")
    saved = io.BytesIO()
    torch.save({"w": torch.zeros(3), "p": Payload()}, saved)
    start = 8 + HEADER_LEN
    out = io.BytesIO()
    out.write(b"\0" * start)
    with zipfile.ZipFile(io.BytesIO(saved.getvalue())) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():  # written again after the prefix: offsets count it
            target.writestr(info.filename, source.read(info))
    data = bytearray(out.getvalue())
    size = len(data) - start
    header = json.dumps({"t": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    data[0:8] = struct.pack("<Q", HEADER_LEN)
    data[8:start] = header + b" " * (HEADER_LEN - len(header))
    assert data[:4] == b"PK\x03\x04"
    path.write_bytes(bytes(data))


def _pickle_polyglot(path: Path) -> None:
    """The red team's second: the header length 0x156 starts with 'V' (UNICODE, a protocol 0
    string opcode) whose line swallows the rest of the length and the JSON header; then POP and a
    pickle calling exec, stored as the one U8 tensor."""
    length = 0x156
    rest = b"0" + pickle.dumps(Payload(), protocol=2)
    header = json.dumps({"t": {"dtype": "U8", "shape": [len(rest)], "data_offsets": [0, len(rest)]}}).encode()
    data = struct.pack("<Q", length) + header + b" " * (length - 1 - len(header)) + b"\n" + rest
    assert data[:1] == b"V"
    path.write_bytes(data)


def test_a_pickle_polyglot_runs_in_torch_and_is_refused(tmp_path: Path) -> None:
    from safetensors import safe_open

    for name in ("model.pt", "weights"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        _pickle_polyglot(folder / name)
        with safe_open(str(folder / name), framework="numpy") as opened:
            assert list(opened.keys()) == ["t"]
        torch_load([folder], weights_only=False)
        assert (folder / "MARKER").exists()  # the payload ran
        (folder / "MARKER").unlink()
        for argument in (folder / name, folder, tmp_path):
            out = subprocess.run(
                [sys.executable, "-m", "tieaudit", "check", str(argument)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert out.returncode == 2 and "polyglot" in out.stderr, out.stdout + out.stderr
            assert not (folder / "MARKER").exists()


@pytest.fixture(scope="module")
def polyglots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("polyglot")
    made = {}
    for name in ("model.pt", "weights.bin", "model.SAFETENSORS"):
        folder = root / name.replace(".", "_")
        folder.mkdir()
        _polyglot(folder / name)
        made[name] = folder
    return made


def test_torch_runs_it_and_safetensors_reads_it(polyglots: dict[str, Path]) -> None:
    from safetensors import safe_open

    folder = polyglots["model.pt"]
    with safe_open(str(folder / "model.pt"), framework="numpy") as opened:
        assert list(opened.keys()) == ["t"]
    torch_load([folder], weights_only=False)
    assert (folder / "MARKER").exists()  # the payload ran
    (folder / "MARKER").unlink()


@pytest.mark.parametrize("name", ["model.pt", "weights.bin", "model.SAFETENSORS"])
def test_a_polyglot_is_refused_in_one_line(polyglots: dict[str, Path], name: str) -> None:
    folder = polyglots[name]
    for argument in (folder / name, folder):  # named, and found in a folder
        out = subprocess.run(
            [sys.executable, "-m", "tieaudit", "check", str(argument)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        errors = [line for line in out.stderr.splitlines() if "polyglot" in line]
        assert out.returncode == 2 and len(errors) == 1, out.stdout + out.stderr
        assert not (folder / "MARKER").exists()
