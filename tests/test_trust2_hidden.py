"""A dot hides nothing from torch.load: a hidden file torch.load takes is audited in a folder.

The folder search skips hidden names (``.DS_Store``, macOS' ``._x.safetensors``), but a script
loads a file by any name: the outside red team's ``.optimizer.pt`` (a pickle running
``builtins.exec``) next to a clean ``model.pt`` was "skipped (hidden)" and the folder passed.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tieaudit.formats.torch_takes import taken_by_torch

ROOT = Path(__file__).resolve().parent.parent
CLONED = ROOT / "fixtures" / "generated" / "safetensors" / "untied_lm.safetensors"


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, ("open('marker', 'w').close()",))


def check(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_hidden_pickle_naming_code_fails_the_folder(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(CLONED.read_bytes())
    (tmp_path / ".optimizer.pt").write_bytes(pickle.dumps(Payload(), protocol=2))
    out = check(tmp_path)
    assert out.returncode == 1 and "TIE010" in out.stdout and ".optimizer.pt" in out.stdout, out.stdout


def test_hidden_metadata_stays_skipped(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(CLONED.read_bytes())
    (tmp_path / "._model.safetensors").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)  # AppleDouble
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + b"\x00" * 60)
    out = check(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 hidden" in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("content", "taken"),
    [
        (pickle.dumps(Payload(), protocol=2), True),
        (pickle.dumps({"vocab": [1, 2]}, protocol=2), False),  # plain data: torch.load refuses it
        (b"cat\ndog\n", True),  # torch.load imports module 'at': a global outside the allowlist
        (b"just text", False),
    ],
)
def test_what_torch_takes_by_content(tmp_path: Path, content: bytes, taken: bool) -> None:
    path = tmp_path / ".hidden"
    path.write_bytes(content)
    assert taken_by_torch(str(path)) is taken
