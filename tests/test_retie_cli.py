"""retie's command line (issue 14): where the output goes (OUT, --in-place alone, --dry-run), OUT's
name fits the format (or --force-format), nothing to re-tie writes nothing, and the --in-place
backup is a name check skips."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from tieaudit.cli.main import main
from tieaudit.formats import open_checkpoint
from tieaudit.gate.files import RETIE_BACKUP
from tieaudit.gate.hidden import searched_folder
from tieaudit.repair import BACKUP_SUFFIX

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _recorded_copy(path: Path) -> None:
    """A safetensors file storing a copy that a {dropped: kept} record names: the default re-ties it."""
    embed = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    save_file({EMBED: embed, HEAD: embed.copy()}, str(path), metadata={HEAD: EMBED})


def _input(kind: str, corpus: Any, folder: Path) -> Path:
    """IN with one copy the default plan applies: a file, or a model folder."""
    if kind == "file":
        source = folder / "model.safetensors"
        _recorded_copy(source)
    else:
        source = folder / "llama"
        shutil.copytree(corpus.path("hf_llama_cloned_head"), source)
    return source


def _listing(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")}


def _error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: "), stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_in_place_alone_and_check_skips_the_backup(
    kind: str,
    corpus: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = _input(kind, corpus, tmp_path)
    before = _listing(tmp_path)
    assert main(["retie", str(source), "--in-place"]) == 0, capsys.readouterr().err
    backup = Path(f"{source}{BACKUP_SUFFIX}")
    assert f"original kept as {backup}" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == sorted([source.name, backup.name])
    renamed = {key.replace(source.name, backup.name, 1): value for key, value in before.items()}
    assert {k: v for k, v in _listing(tmp_path).items() if k.startswith(backup.name)} == renamed

    monkeypatch.chdir(tmp_path)
    assert main(["check", ".", "--show-files"]) == 0  # the backup (a whole model, for a folder) is skipped
    out = capsys.readouterr().out
    shown = backup.name + ("/" if kind == "folder" else "")
    reason = RETIE_BACKUP if kind == "file" else searched_folder(RETIE_BACKUP)  # searched for code
    joined = out.replace("\n         ", " ")  # a --show-files line wraps under its path
    assert f"skipped  {shown}  ({reason})" in joined.splitlines()
    assert f"ok   {source.name}" in out


def test_in_place_with_another_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "model.safetensors"
    _recorded_copy(source)
    before = _listing(tmp_path)
    assert main(["retie", str(source), str(tmp_path / "other.safetensors"), "--in-place"]) == 2
    assert "--in-place needs OUT to be the input itself" in _error(capsys.readouterr().err)
    assert _listing(tmp_path) == before


def test_no_out_needs_in_place_or_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "model.safetensors"
    _recorded_copy(source)
    before = _listing(tmp_path)
    assert main(["retie", str(source)]) == 2
    line = _error(capsys.readouterr().err)
    assert "OUT" in line and "--in-place" in line and "--dry-run" in line, line
    assert _listing(tmp_path) == before
    assert main(["retie", str(source), "--dry-run"]) == 0
    assert _listing(tmp_path) == before


@pytest.mark.parametrize(
    ("fixture", "out", "expected"),
    [
        ("st_cloned_head", "b.pt", "safetensors file and OUT is written in the same format: end OUT's "
         "name in .safetensors"),
        ("torch_cloned_head", "b.safetensors", "PyTorch file and OUT is written in the same format: end "
         "OUT's name in one of .pt, .pth, .bin, .ckpt, .tar"),
        ("onnx_helper_duplicate", "b.pt", "ONNX file and OUT is written in the same format: end OUT's "
         "name in .onnx"),
        ("hf_llama_cloned_head", "b.safetensors", "model folder and OUT is written as a folder; name it "
         "without the .safetensors suffix"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dry_run", [False, True])
def test_out_named_for_another_format_is_refused(
    fixture: str, out: str, expected: str, dry_run: bool, corpus: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    argv = ["retie", str(corpus.path(fixture)), str(tmp_path / out), "--all-equal"]
    assert main(argv + (["--dry-run"] if dry_run else [])) == 2
    line = _error(capsys.readouterr().err)
    assert expected in line and "--force-format" in line, line
    assert os.listdir(tmp_path) == []


def test_force_format_keeps_the_name_and_the_format(corpus: Any, tmp_path: Path) -> None:
    out = tmp_path / "b.pt"
    assert main(["retie", str(corpus.path("st_cloned_head")), str(out), "--all-equal", "--force-format"]) == 0
    with open_checkpoint(str(out)) as opened:  # read by its bytes: still safetensors
        assert opened.checkpoint.format == "safetensors"


@pytest.mark.parametrize("out", ["b.pth.tar", "b.ckpt", "b.bin", "b.pth"])
def test_every_torch_suffix_is_accepted(out: str, corpus: Any, tmp_path: Path) -> None:
    assert main(["retie", str(corpus.path("torch_cloned_head")), str(tmp_path / out)]) == 0
    assert os.listdir(tmp_path) == [out]


@pytest.mark.parametrize(
    ("fixture", "out", "left"),
    [
        ("st_save_model_tied", "out.safetensors", ""),  # already tied: no copy
        ("st_cloned_head", "out.safetensors", " (1 copy left, each with its reason above)"),
        ("hf_gpt2", "out", ""),
        ("torch_tied_lm", "out.pt", ""),
    ],
)
@pytest.mark.parametrize("in_place", [False, True])
def test_nothing_to_retie_writes_nothing(
    fixture: str, out: str, left: str, in_place: bool, corpus: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    origin = corpus.path(fixture)
    source = tmp_path / origin.name
    (shutil.copytree if origin.is_dir() else shutil.copyfile)(origin, source)
    before = _listing(tmp_path)
    argv = ["retie", str(source), "--in-place"] if in_place else ["retie", str(source), str(tmp_path / out)]
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == f"nothing to re-tie{left}; nothing written", lines
    if left:
        assert any(line.strip().startswith("why: ") for line in lines)
    assert _listing(tmp_path) == before  # no OUT, no backup, no stage, IN as it was


@pytest.mark.parametrize(
    ("fixture", "name", "out"),
    [
        ("st_cloned_head", "weights", "weights-retied.safetensors"),  # no suffix: the format's is added
        ("torch_cloned_head", "model.pth.tar", "model-retied.pth.tar"),  # the double suffix kept whole
        ("hf_llama_cloned_head", "llama-3.2", "llama-3.2-retied"),  # a folder's name is not split at '.'
    ],
)
def test_the_fix_check_suggests_is_a_retie_that_runs(
    corpus: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture: str, name: str, out: str
) -> None:
    """check's fix for a copy is a command retie accepts as written, whatever IN is called."""
    import json
    import shlex

    source = tmp_path / name
    if corpus.path(fixture).is_dir():
        shutil.copytree(corpus.path(fixture), source)
    else:
        shutil.copy(corpus.path(fixture), source)
    os.chdir(tmp_path)
    assert main(["check", name, "--jobs", "1", "--format", "json"]) == 1
    (fix,) = {f["fix"] for f in json.loads(capsys.readouterr().out)["findings"] if f["rule"] == "TIE001"}
    argv = shlex.split(fix)
    assert argv[:4] == ["tieaudit", "retie", name, out], fix
    assert main(argv[1:]) == 0, capsys.readouterr().err
    assert (tmp_path / out).exists()
    assert main(["check", out, "--jobs", "1"]) == 0
