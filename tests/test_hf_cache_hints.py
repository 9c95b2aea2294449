"""The commands tieaudit prints for a repository id read from the Hugging Face cache run as printed:
the download hint is huggingface_hub's own ``hf download`` (run here, offline, against the cache the
test builds), and a fix names the id as typed (``org/name[@revision]``), not the snapshot folder it
resolved to, writing to the current folder (pasted into bash here, with the real tieaudit)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Corpus
from test_hf_cache import COMMIT, OTHER, add_snapshot, cli, listing

from tieaudit.cli.main import main

HF = Path(sys.executable).parent / "hf"
"""huggingface_hub's command line, installed beside this Python (huggingface_hub is a dependency of
the transformers the test environment pins)."""


@pytest.fixture
def hub(corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_CACHE holding org/llama (main: a cloned head; v1: tied) and tiny (one bare file); the
    working folder is an empty one outside it."""
    cache = tmp_path / "hub"
    add_snapshot(cache, "org/llama", corpus.path("hf_llama_cloned_head"), COMMIT, ("main",))
    add_snapshot(cache, "org/llama", corpus.path("hf_llama_tied"), OTHER, ("v1",))
    add_snapshot(cache, "tiny", corpus.path("st_cloned_head"), COMMIT, ("main",))
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return cache


def _bin(tmp_path: Path) -> Path:
    """A folder holding `tieaudit` (this checkout's, run by this Python) and huggingface_hub's `hf`."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "tieaudit"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom tieaudit.cli.launch import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    if not (folder / "hf").exists():
        (folder / "hf").symlink_to(HF)
    return folder


def paste(command: str, *, tmp_path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """command pasted into bash in the current folder, offline: only the commands in _bin on PATH."""
    env = {
        "PATH": f"{_bin(tmp_path)}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    return subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _quoted(line: str) -> str:
    """The command a hint shows between backticks."""
    found = re.search(r"`([^`]*)`", line)
    assert found is not None, line
    return found.group(1)


def test_the_download_hint_is_hf_download_and_runs_as_printed(
    hub: Path, corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hint fetches what is missing: once the hub has it (here: added to the cache), the printed
    command finds it, offline, where tieaudit looks."""
    assert HF.exists(), "huggingface_hub's hf command is not installed beside this Python"
    code, _, err = cli(["check", "org/later", "org/llama@v9", "--jobs", "1"], capsys)
    assert code == 2
    commands = [_quoted(line) for line in err[:2]]
    assert commands == ["hf download org/later", "hf download org/llama --revision v9"]
    for command in commands:  # nothing to fetch yet, and no network: the hub cannot be reached
        done = paste(command, tmp_path=tmp_path, cache=hub)
        assert done.returncode == 1 and "offline mode is enabled" in done.stderr, done.stderr
    later = add_snapshot(hub, "org/later", corpus.path("hf_llama_tied"), OTHER, ("main",))
    (hub / "models--org--llama" / "refs" / "v9").write_text(OTHER)
    for command, snapshot in zip(
        commands, (later, hub / "models--org--llama" / "snapshots" / OTHER), strict=True
    ):
        done = paste(command, tmp_path=tmp_path, cache=hub)
        assert done.returncode == 0, done.stderr
        assert str(snapshot) in done.stdout  # the snapshot tieaudit then reads
    assert cli(["check", "org/later", "org/llama@v9", "--jobs", "1"], capsys)[0] == 0


@pytest.mark.parametrize("argument", ["org/llama", "org/llama@main", f"org/llama@{COMMIT}"])
def test_a_fix_names_the_repository_id_as_typed_and_runs_as_printed(
    hub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argument: str
) -> None:
    before = listing(hub)
    code, out, err = cli(["check", argument, "--jobs", "2", "--format", "json"], capsys)
    assert code == 1, err
    (fix,) = [f["fix"] for f in json.loads(out)["findings"]]
    assert fix == f"tieaudit retie {argument} ./llama-retied"
    code, out, _ = cli(["check", argument, "--jobs", "1"], capsys)
    assert f"    fix: {fix}\n" in out  # the text report says the same, on a line of its own
    code, out, _ = cli(["inspect", argument], capsys)
    assert f"    fix: {fix}\n" in out  # inspect's findings are laid out as check's
    done = paste(fix, tmp_path=tmp_path, cache=hub)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith("wrote ./llama-retied: ")
    assert cli(["check", "llama-retied", "--jobs", "1"], capsys)[0] == 0  # re-tied, in this folder
    assert listing(hub) == before


def test_a_hint_to_check_a_cached_folder_names_the_id(
    hub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """inspect of a repository that is not one model points at `check` of the same id; a bare file
    inside a snapshot has no id of its own, so its fix names the file (still outside the cache's
    writes: the output is in the current folder)."""
    code, _, err = cli(["inspect", "tiny"], capsys)
    assert code == 2
    command = _quoted(err[1])
    assert command == "tieaudit check tiny"
    done = paste(command, tmp_path=tmp_path, cache=hub)
    assert done.returncode == 1, done.stderr  # the copy it holds
    (line,) = [line for line in done.stdout.splitlines() if line.strip().startswith("fix:")]
    fix = line.split("fix: ", 1)[1]
    file = hub / "models--tiny" / "snapshots" / COMMIT / "model.safetensors"
    assert shlex.split(fix) == ["tieaudit", "retie", str(file), "./model-retied.safetensors", "--all-equal"]
    assert paste(fix, tmp_path=tmp_path, cache=hub).returncode == 0
    assert os.path.isfile("model-retied.safetensors")
    assert main(["check", "model-retied.safetensors", "--jobs", "1"]) == 0
