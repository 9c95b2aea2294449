"""A name hides nothing from torch.load: what would run code is audited wherever a folder holds it.

The folder search skips hidden names (``.git``, ``.DS_Store``, macOS' ``._x.safetensors``) and
retie's stages and backups, but a script loads a file by any name: the outside red team's
``.optimizer.pt`` (a pickle running ``builtins.exec``) next to a clean ``model.pt`` was "skipped
(hidden)" and the folder passed; then ``.ckpt/payload.pt``, under a hidden folder, did the same.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tieaudit.formats.torch_takes import hides_code
from tieaudit.gate import hidden
from tieaudit.gate.discover import discover

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
def test_what_would_run_code_by_content(tmp_path: Path, content: bytes, taken: bool) -> None:
    path = tmp_path / ".hidden"
    path.write_bytes(content)
    assert hides_code(str(path)) is taken


def _torch_save(path: Path, *, payload: bool) -> None:
    torch = pytest.importorskip("torch")
    path.parent.mkdir(parents=True, exist_ok=True)
    value: dict[str, object] = {"w": torch.zeros(3)}
    if payload:
        value["p"] = Payload()
    torch.save(value, path)


def test_torch_files_by_their_pickle(tmp_path: Path) -> None:
    _torch_save(tmp_path / "clean", payload=False)
    _torch_save(tmp_path / "dirty", payload=True)
    assert not hides_code(str(tmp_path / "clean"))  # torch.load takes it and runs nothing
    assert hides_code(str(tmp_path / "dirty"))
    (tmp_path / "cut").write_bytes((tmp_path / "dirty").read_bytes()[:200])  # refused: not vouched for
    assert hides_code(str(tmp_path / "cut"))


@pytest.mark.parametrize(
    "where",
    [
        ".ckpt/payload.pt",
        ".cache/a/b/c/optimizer",
        "model.tieaudit-backup/opt.pt",
        ".m.tieaudit-stage-1/x.bin",
    ],
)
def test_a_skipped_folder_never_hides_code(tmp_path: Path, where: str) -> None:
    (tmp_path / "model.safetensors").write_bytes(CLONED.read_bytes())
    payload = tmp_path / where
    payload.parent.mkdir(parents=True)
    payload.write_bytes(pickle.dumps(Payload(), protocol=2))
    out = check(tmp_path)
    assert out.returncode == 1 and "TIE010" in out.stdout and where in out.stdout, out.stdout + out.stderr


def test_a_git_clone_is_not_reported_twice(tmp_path: Path) -> None:
    """.git/lfs/objects holds a copy of each LFS checkpoint: clean, it stays skipped; naming code,
    it fails like the working copy."""
    _torch_save(tmp_path / "model.pt", payload=False)
    lfs = tmp_path / ".git" / "lfs" / "objects" / "ab" / "cd"
    _torch_save(lfs / "clean", payload=False)
    (tmp_path / ".git" / "config").write_text("[core]\n")
    out = check(tmp_path)
    assert out.returncode == 0 and "clean" not in out.stdout, out.stdout + out.stderr
    assert "1 hidden (its name starts with '.'), searched only" in out.stderr, out.stderr
    _torch_save(lfs / "dirty", payload=True)
    out = check(tmp_path)
    assert out.returncode == 1 and "objects/ab/cd/dirty" in out.stdout, out.stdout + out.stderr
    excluded = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(tmp_path), "--exclude", ".git"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert excluded.returncode == 0 and "excluded by --exclude .git" in excluded.stderr, excluded.stderr


def test_a_hidden_link_inside_is_not_followed(tmp_path: Path) -> None:
    """A link in (or as) a hidden folder whose target lies inside PATH: the target is searched
    where it lies, once."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "payload.pt").write_bytes(pickle.dumps(Payload(), protocol=2))
    (tmp_path / ".ckpt").mkdir()
    (tmp_path / ".ckpt" / "link.pt").symlink_to(tmp_path / "real" / "payload.pt")
    (tmp_path / ".alias").symlink_to(tmp_path / "real", target_is_directory=True)
    found = discover([str(tmp_path)])
    assert [Path(t.path).relative_to(tmp_path).as_posix() for t in found.targets] == ["real/payload.pt"]
    assert not found.errors


@pytest.mark.parametrize(
    "layout",
    ["hidden folder is a link", "file link in a hidden folder", "folder link in a hidden folder"],
)
def test_a_hidden_link_leading_outside_is_searched(tmp_path: Path, layout: str) -> None:
    """Red team 4: `.cache -> /outside`, `.cache/model -> /outside/x`, `.git/objs -> /outside`
    passed (exit 0); a link leading outside is searched wherever it is found."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "evil").write_bytes(pickle.dumps(Payload(), protocol=2))
    root = tmp_path / "root"
    root.mkdir()
    (root / "model.safetensors").write_bytes(CLONED.read_bytes())
    if layout == "hidden folder is a link":
        (root / ".cache").symlink_to(outside, target_is_directory=True)
        expected = ".cache/sub/evil"
    elif layout == "file link in a hidden folder":
        (root / ".cache").mkdir()
        (root / ".cache" / "model").symlink_to(outside / "sub" / "evil")
        expected = ".cache/model"
    else:
        (root / ".git").mkdir()
        (root / ".git" / "objs").symlink_to(outside, target_is_directory=True)
        expected = ".git/objs/sub/evil"
    found = discover([str(root)])
    assert sorted(Path(t.path).relative_to(root).as_posix() for t in found.targets) == [
        expected,
        "model.safetensors",
    ]
    out = check(root)
    assert out.returncode == 1 and expected in out.stdout, out.stdout + out.stderr


def test_a_skipped_folder_too_large_to_search_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hidden, "MAX_HIDDEN_ENTRIES", 5)
    (tmp_path / "model.safetensors").write_bytes(CLONED.read_bytes())
    objects = tmp_path / ".git" / "objects"
    objects.mkdir(parents=True)
    for n in range(10):
        (objects / f"{n:02d}").write_bytes(b"x" * 10)
    (tmp_path / ".small").mkdir()
    (tmp_path / ".small" / "payload.pt").write_bytes(pickle.dumps(Payload(), protocol=2))
    found = discover([str(tmp_path)])
    assert [
        (e.path, "more than 5 entries" in e.message and "--exclude" in e.message) for e in found.errors
    ] == [(str(tmp_path / ".git"), True)]
    # the limit is per skipped folder: the next one is searched whole, its payload found
    assert sorted(Path(t.path).name for t in found.targets) == ["model.safetensors", "payload.pt"]


def test_a_link_leading_outside_never_hides_code(tmp_path: Path) -> None:
    """A link to a folder outside PATH is searched for code like a hidden folder; a link to a file
    outside, whatever its name, is audited when torch.load would run code from its file."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m.pt").write_bytes(pickle.dumps(Payload(), protocol=2))
    (outside / "clean.pt").write_bytes(pickle.dumps({"vocab": [1]}, protocol=2))
    root = tmp_path / "root"
    root.mkdir()
    (root / "model.safetensors").write_bytes(CLONED.read_bytes())
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "weights").symlink_to(outside / "m.pt")
    found = discover([str(root)])
    assert sorted(Path(t.path).relative_to(root).as_posix() for t in found.targets) == [
        "link/m.pt",
        "model.safetensors",
        "weights",
    ]
    out = check(root)
    assert out.returncode == 1 and "link/m.pt" in out.stdout and "weights" in out.stdout, out.stdout


def test_a_link_to_a_folder_inside_is_not_followed(tmp_path: Path) -> None:
    """Its files are searched where they lie, once."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "m.pt").write_bytes(pickle.dumps(Payload(), protocol=2))
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    found = discover([str(tmp_path)])
    assert [Path(t.path).relative_to(tmp_path).as_posix() for t in found.targets] == ["real/m.pt"]
    assert [f.reason for f in found.files if f.path.endswith("alias/")] == [
        "a link to a folder, not followed"
    ]
