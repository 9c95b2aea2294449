"""convert carries untied copies through (equal, transposed, cast tensors stored apart stay apart):
it says so, one line per group, with the retie command that re-ties the output, and that command,
pasted into bash, runs as printed and leaves a checkpoint `check` passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Corpus

from tieaudit.cli.main import main

LEAD = "  untied copy kept apart: "


def _paste(command: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """command run by bash in folder, with this checkout's tieaudit the only one on PATH."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "tieaudit"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom tieaudit.cli.launch import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(folder), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _copy_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(LEAD)]


@pytest.mark.parametrize(
    ("fixture", "out", "group"),
    [
        ("torch_cloned_head", "m.safetensors", "emb.weight = head.weight (equal)  (32.0 KiB)"),
        ("torch_transposed_copy", "m.safetensors", "emb = proj (transposed)  (32.0 KiB)"),
        ("torch_fp16_copy", "m.safetensors", "emb = emb_fp16 (cast)  (16.0 KiB)"),
        ("st_cloned_head", "m.pt", "emb.weight = head.weight (equal)  (32.0 KiB)"),  # the reverse
    ],
)
def test_convert_names_each_copy_it_carries_through_with_a_fix_that_runs(
    corpus: Corpus,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fixture: str,
    out: str,
    group: str,
) -> None:
    source = corpus.path(fixture)
    monkeypatch.chdir(tmp_path)
    assert main(["convert", str(source), out]) == 0
    err = capsys.readouterr().err
    (line,) = _copy_lines(err)
    assert line == LEAD + group, line
    fix = err.splitlines()[-1]  # the fix on a line of its own, after the lines saying it was written
    assert err.splitlines().index(line) == len(err.splitlines()) - 2 and fix.startswith(
        "    fix: tieaudit retie "
    )
    assert main(["check", out, "--jobs", "1"]) == 1  # the copy is there, as the line says
    capsys.readouterr()
    done = _paste(fix.removeprefix("    fix: "), tmp_path)
    assert done.returncode == 0, done.stderr
    written = done.stderr.splitlines()[-1]
    assert written.startswith("wrote "), done.stderr
    retied = written.removeprefix("wrote ").split(":", 1)[0]
    assert main(["check", retied, "--jobs", "1"]) == 0


def test_a_dry_run_says_so_without_a_command_for_an_output_not_written(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.safetensors"
    assert main(["convert", str(corpus.path("torch_transposed_copy")), str(out), "--dry-run"]) == 0
    lines = _copy_lines(capsys.readouterr().out)
    assert lines == [LEAD + "emb = proj (transposed)  (32.0 KiB); re-tie the output once written"]
    assert not out.exists()


@pytest.mark.parametrize("fixture", ["torch_tied_lm", "torch_untied_lm"])
def test_no_copy_no_line(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture: str
) -> None:
    source = tmp_path / "in.pt"
    shutil.copy(corpus.path(fixture), source)
    assert main(["convert", str(source), str(tmp_path / "m.safetensors")]) == 0
    assert _copy_lines(capsys.readouterr().err) == []
