"""retie never replaces IN unless asked, and never overwrites what appears at OUT.

Every spelling of OUT that reaches IN (``IN/.``, ``IN/``, ``nosuchdir/../IN``, ``IN/../IN``, links,
hard links, a path inside an IN folder) is refused with IN byte-identical and nothing created; a
``link/..`` goes where the kernel says; a file appearing at OUT while retie runs is left as it is;
and an --in-place run killed at any step leaves the original at IN or IN.tieaudit-backup, with IN's
path never empty, and the next run names what the killed one left behind (also IN.bak, the backup
name of earlier versions).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import tieaudit.repair.retie as retie_module
from tieaudit.cli.main import main
from tieaudit.formats import open_checkpoint
from tieaudit.repair import BACKUP_SUFFIX, LEGACY_BACKUP_SUFFIX

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _clone(path: Path, rows: int = 256, cols: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    tensors = {EMBED: rng.standard_normal((rows, cols)).astype(np.float32)}
    tensors[HEAD] = tensors[EMBED].copy()
    save_file(tensors, str(path), metadata={HEAD: EMBED})  # the record: retie's default re-ties it
    return tensors


def _digest(path: Path) -> str:
    """sha256 of a file, or of a folder's relative names and contents."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else "").encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _tree(root: Path) -> list[str]:
    """Every entry under root (hidden ones, links and link targets' names included)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) + sorted(os.listdir(root))


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: ") and "Traceback" not in stderr, stderr
    return lines[0]


def _values(path: Path) -> dict[str, np.ndarray]:
    from tieaudit.repair.restore import restored_array, sources

    with open_checkpoint(str(path)) as opened:
        return {name: np.array(restored_array(opened, s)) for name, s in sources(opened.checkpoint).items()}


def _assert_same_values(path: Path, expected: dict[str, np.ndarray]) -> None:
    found = _values(path)
    assert set(found) == set(expected)
    for name, values in expected.items():
        assert found[name].tobytes() == values.tobytes(), name


# --- OUT reaching IN ----------------------------------------------------------------------------

FILE_VARIANTS = {
    "IN/.": ("in.safetensors/.", False),
    "IN/": ("in.safetensors/", False),
    "IN/..": ("in.safetensors/..", False),
    "nosuchdir/../IN": ("nosuchdir/../in.safetensors", False),
    "IN/../IN": ("in.safetensors/../in.safetensors", False),
    "./IN": ("./in.safetensors", False),
    "symlink to IN": ("link.safetensors", False),
    "symlink to IN/.": ("link.safetensors/.", False),
    "hard link to IN": ("hard.safetensors", False),
    "folder link/IN": ("alias/in.safetensors", False),
    "symlink to IN, --in-place": ("link.safetensors", True),
    "hard link to IN, --in-place": ("hard.safetensors", True),
    "IN/., --in-place": ("in.safetensors/.", True),
    "nosuchdir/../IN, --in-place": ("nosuchdir/../in.safetensors", True),
}


@pytest.mark.parametrize("variant", list(FILE_VARIANTS))
def test_out_reaching_an_input_file_is_refused(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, in_place = FILE_VARIANTS[variant]
    _clone(tmp_path / "in.safetensors")
    (tmp_path / "link.safetensors").symlink_to("in.safetensors")
    os.link(tmp_path / "in.safetensors", tmp_path / "hard.safetensors")
    (tmp_path / "alias").symlink_to(".")
    before, listing = _digest(tmp_path / "in.safetensors"), _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["retie", "in.safetensors", out, *(["--in-place"] if in_place else [])]) == 2
    _one_line(capsys.readouterr().err)
    assert _digest(tmp_path / "in.safetensors") == before
    assert _tree(tmp_path) == listing  # nothing created, renamed or replaced (no stage, no .bak)


FOLDER_VARIANTS = {
    "IN/sub": "model/sub",
    "IN/.": "model/.",
    "IN/": "model/",
    "IN/..": "model/..",
    "link to IN/sub": "model-link/sub",
    "IN/nosuch/../sub": "model/nosuch/../sub",
}


@pytest.mark.parametrize("variant", list(FOLDER_VARIANTS))
def test_out_inside_or_at_an_input_folder_is_refused(
    variant: str,
    corpus: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(corpus.path("hf_llama_cloned_head"), tmp_path / "model")
    (tmp_path / "model-link").symlink_to("model")
    before, listing = _digest(tmp_path / "model"), _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["retie", "model", FOLDER_VARIANTS[variant]]) == 2
    _one_line(capsys.readouterr().err)
    assert _digest(tmp_path / "model") == before
    assert _tree(tmp_path) == listing


@pytest.mark.parametrize("name", ["out.safetensors", "in.safetensors"])
def test_a_link_then_dotdot_goes_where_the_kernel_goes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """jump -> sub/deep, so jump/../NAME is sub/NAME for the kernel, not ./NAME (os.path.abspath)."""
    expected = _clone(tmp_path / "in.safetensors")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "jump").symlink_to("sub/deep")
    before = _digest(tmp_path / "in.safetensors")
    monkeypatch.chdir(tmp_path)
    assert main(["retie", "in.safetensors", f"jump/../{name}"]) == 0, capsys.readouterr().err
    assert _digest(tmp_path / "in.safetensors") == before
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors", "jump", "sub"]
    assert sorted(os.listdir(tmp_path / "sub")) == ["deep", name]
    _assert_same_values(tmp_path / "sub" / name, expected)


# --- something appears at OUT while retie runs ----------------------------------------------------


def _stages(folder: Path) -> list[str]:
    return [e for e in os.listdir(folder) if ".tieaudit-stage-" in e]


@pytest.mark.parametrize("kind", ["safetensors", "hf-folder", "onnx-with-data-file"])
def test_an_entry_appearing_at_out_is_never_overwritten(
    kind: str,
    corpus: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if kind == "safetensors":
        source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        _clone(source)
    elif kind == "hf-folder":
        source, out = tmp_path / "model", tmp_path / "model-tied"
        shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
    else:  # the external data goes to OUT.data, which is published before OUT itself
        import onnx

        source, out = tmp_path / "in" / "model.onnx", tmp_path / "out.onnx"
        source.parent.mkdir()
        duplicate = onnx.load(str(corpus.path("onnx_helper_duplicate")))  # E_copy: a copy of E
        onnx.save(duplicate, str(source), save_as_external_data=True, location="data.bin", size_threshold=0)
    before = _digest(source)

    def someone_writes_out(staged: str) -> None:
        if kind == "hf-folder":
            out.mkdir()  # an empty folder: a plain rename(2) would replace it
        else:
            out.write_bytes(b"theirs")

    monkeypatch.setattr(retie_module, "before_rename", someone_writes_out)
    assert main(["retie", str(source), str(out)]) == 2
    assert "appeared" in _one_line(capsys.readouterr().err)
    if kind == "hf-folder":
        assert out.is_dir() and os.listdir(out) == []
    else:
        assert out.read_bytes() == b"theirs"
    assert not Path(f"{out}.data").exists()  # a side file already moved is taken back
    assert _stages(tmp_path) == []
    assert _digest(source) == before


def test_a_backup_appearing_during_in_place_is_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "model.safetensors"
    _clone(source)
    before = _digest(source)
    backup = tmp_path / f"model.safetensors{BACKUP_SUFFIX}"
    monkeypatch.setattr(retie_module, "before_rename", lambda staged: backup.write_bytes(b"theirs"))
    assert main(["retie", str(source), "--in-place"]) == 2
    assert "appeared" in _one_line(capsys.readouterr().err)
    assert backup.read_bytes() == b"theirs"
    assert _digest(source) == before
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", backup.name]


# --- --in-place killed at every step ----------------------------------------------------------------

KILL_AT = textwrap.dedent(
    """
    import os, signal, sys
    import tieaudit.repair.retie as retie_module
    from tieaudit.cli.main import main

    step, calls, armed = int(sys.argv[1]), [0], [False]

    def arm(staged):
        armed[0] = True

    def counted(function):
        def call(*args, **kwargs):
            if armed[0]:
                calls[0] += 1
                if calls[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
            return function(*args, **kwargs)
        return call

    retie_module.before_rename = arm  # count only the steps that publish and clean up
    for name in ("rename", "replace", "link", "unlink", "rmdir", "mkdir", "symlink"):
        setattr(os, name, counted(getattr(os, name)))
    try:
        import tieaudit.core.fsops as fsops
        fsops.renameat2 = counted(fsops.renameat2)
    except ImportError:
        pass
    sys.exit(main(["retie", sys.argv[2], sys.argv[2], "--in-place", "--all-equal"]))
    """
)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_in_place_killed_at_every_step_keeps_the_original(
    kind: str, corpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in range(1, 30):
        folder = tmp_path / f"step{step}"
        folder.mkdir()
        source = folder / ("model.safetensors" if kind == "file" else "model")
        if kind == "file":
            _clone(source)
        else:
            shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
        expected, before = _values(source), _digest(source)
        backup = Path(f"{source}{BACKUP_SUFFIX}")
        child = subprocess.run(
            [sys.executable, "-c", KILL_AT, str(step), str(source)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode in (0, -signal.SIGKILL), child.stderr
        assert os.path.lexists(source), f"step {step}: nothing at IN's path"
        assert _digest(source) == before or (backup.exists() and _digest(backup) == before), f"step {step}"
        if _digest(source) != before:  # the swap happened: IN is the whole, verified output
            _assert_same_values(source, expected)
        if child.returncode == 0:
            assert _digest(backup) == before and step > 2
            return
        left_backup, in_unchanged = os.path.lexists(backup), _digest(source) == before
        capsys.readouterr()
        code = main(["retie", str(source), str(source), "--in-place", "--all-equal"])
        message = capsys.readouterr().err
        if left_backup and in_unchanged:
            # Killed before the swap: the next run says IN is the original and what to remove.
            assert code == 2 and "interrupted" in _one_line(message), (step, message)
            _remove(backup)
            assert main(["retie", str(source), str(source), "--in-place", "--all-equal"]) == 0
        elif left_backup:
            assert code == 2 and "already exists" in _one_line(message), (step, message)
        else:
            assert code == 0, message
        assert _digest(backup) == before
        _assert_same_values(source, expected)
    pytest.fail("the run never completed")


# --- traces of interrupted runs -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [BACKUP_SUFFIX, LEGACY_BACKUP_SUFFIX])
def test_in_missing_beside_its_backup_is_named(
    suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a kill between the two renames of an older --in-place left: no IN, the original in its
    backup (this version's name, or IN.bak of an earlier one)."""
    source, backup = tmp_path / "model.safetensors", tmp_path / f"model.safetensors{suffix}"
    _clone(backup)
    before = _digest(backup)
    assert main(["retie", str(source), "--in-place"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "interrupted" in line and f"move it back (model.safetensors{suffix} ->" in line, line
    assert _digest(backup) == before and os.listdir(tmp_path) == [backup.name]


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_a_stale_stage_is_removed_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    expected = _clone(source)
    stale = tmp_path / f".out.safetensors.tieaudit-stage-{_dead_pid()}"
    stale.mkdir()
    (stale / "out.safetensors").write_bytes(b"\0" * 4096)
    assert main(["retie", str(source), str(out)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tieaudit: note:")]
    assert len(notes) == 1 and stale.name in notes[0] and "interrupted" in notes[0], notes
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors", "out.safetensors"]
    _assert_same_values(out, expected)


# --- where renameat2 flags or hard links are not offered -------------------------------------------


def _no_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import tieaudit.core.fsops as fsops

    def unsupported(src: str, dst: str, flags: int) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), src, None, dst)

    monkeypatch.setattr(fsops, "renameat2", unsupported)


@pytest.mark.parametrize("flags", ["renameat2", "fallback"])
def test_rename_noreplace_never_replaces(flags: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tieaudit.core.fsops import rename_noreplace

    if flags == "fallback":
        _no_flags(monkeypatch)
    (tmp_path / "file").write_bytes(b"new")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inside").write_bytes(b"new")
    (tmp_path / "taken").write_bytes(b"theirs")
    (tmp_path / "taken-folder").mkdir()
    (tmp_path / "dangling").symlink_to("nowhere")
    for src in ("file", "folder"):
        for dst in ("taken", "taken-folder", "dangling"):
            with pytest.raises(FileExistsError):
                rename_noreplace(str(tmp_path / src), str(tmp_path / dst))
    assert (tmp_path / "taken").read_bytes() == b"theirs" and os.listdir(tmp_path / "taken-folder") == []
    assert os.readlink(tmp_path / "dangling") == "nowhere"
    rename_noreplace(str(tmp_path / "file"), str(tmp_path / "file-moved"))
    rename_noreplace(str(tmp_path / "folder"), str(tmp_path / "folder-moved"))
    assert (tmp_path / "file-moved").read_bytes() == b"new"
    assert (tmp_path / "folder-moved" / "inside").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["dangling", "file-moved", "folder-moved", "taken", "taken-folder"]


def test_canonical_resolves_as_the_kernel_does(tmp_path: Path) -> None:
    from tieaudit.core.fsops import canonical

    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "jump").symlink_to("sub/deep")
    with pytest.raises(FileNotFoundError):
        canonical(str(tmp_path / "nosuchdir" / ".." / "x"))
    with pytest.raises(NotADirectoryError):
        canonical(str(tmp_path / "file" / ".." / "x"))
    assert canonical(str(tmp_path / "jump" / ".." / "x")).path == str(tmp_path.resolve() / "sub" / "x")
    assert canonical(str(tmp_path / "jump")).path == str(tmp_path.resolve() / "jump")  # the link itself
    assert canonical(str(tmp_path / "sub" / "deep" / "..")).path == str(tmp_path.resolve() / "sub")


@pytest.mark.parametrize("kind", ["file-without-hard-links", "folder-without-exchange"])
def test_in_place_without_hard_links_or_exchange(
    kind: str, corpus: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallbacks keep the promise too: IN is the output, its backup the original."""
    import errno

    import tieaudit.core.fsops as fsops

    if kind == "file-without-hard-links":
        source = tmp_path / "model.safetensors"
        _clone(source)

        def no_link(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))

        monkeypatch.setattr(os, "link", no_link)
    else:
        source = tmp_path / "model"
        shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
        real = fsops.renameat2

        def no_exchange(src: str, dst: str, flags: int) -> None:
            if flags == fsops.RENAME_EXCHANGE:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), src, None, dst)
            real(src, dst, flags)

        monkeypatch.setattr(fsops, "renameat2", no_exchange)
    expected, before = _values(source), _digest(source)
    # --all-equal: the file's copy has no {dropped: kept} record (the folder's is a class tie)
    assert main(["retie", str(source), str(source), "--in-place", "--all-equal"]) == 0
    assert _digest(Path(f"{source}{BACKUP_SUFFIX}")) == before and _digest(source) != before
    _assert_same_values(source, expected)
    assert sorted(os.listdir(tmp_path)) == sorted([source.name, f"{source.name}{BACKUP_SUFFIX}"])


@pytest.mark.parametrize(
    "link",
    [("outside", "/nonexistent/file"), ("inside", "missing_inside"), ("loop", "loop")],
    ids=lambda link: link[0],
)
def test_a_link_leading_nowhere_in_a_model_folder_is_refused_in_one_line(
    link: tuple[str, str], corpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measuring the input followed every link; one that leads nowhere was a traceback."""
    source = tmp_path / "model"
    shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
    name, target = link
    os.symlink(target, source / name)
    before = sorted(os.listdir(source))
    assert main(["retie", str(source), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tieaudit: error: ") and len(err.strip().splitlines()) == 1, err
    assert name in err
    assert not (tmp_path / "out").exists() and sorted(os.listdir(source)) == before
