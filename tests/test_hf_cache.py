"""Models in the Hugging Face cache: a repository id given as PATH is read offline from its snapshot
(``$HF_HUB_CACHE``, ``$HF_HOME/hub``), links into the repository's blobs are read and links leaving
it refused, and no fix hint points into a cache. The cache is built here with huggingface_hub's
layout: ``models--ORG--NAME/{refs/main, snapshots/<commit>/<file> -> ../../blobs/<sha>, blobs/}``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Corpus

from tieaudit.cli.main import main
from tieaudit.core.errors import InputError
from tieaudit.formats.hf_cache import hub_cache_dir, looks_like_repo_id, resolve, snapshot_of
from tieaudit.rules.copies import retied_path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
GUARD = Path(__file__).resolve().parent / "guarded_cli.py"


def add_snapshot(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ()) -> Path:
    """Snapshot <commit> of repo_id holding source's files as links into the repository's blobs;
    each ref in refs (``main``, ``refs/pr/1``) is a file under refs/ holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for file in files:  # a subfolder's files link up as many levels more, as the hub writes them
        rel = Path("model.safetensors") if source.is_file() else file.relative_to(source)
        blob = f"{commit[:8]}-{'-'.join(rel.parts)}"
        shutil.copy(file, repo / "blobs" / blob)
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).symlink_to(Path(*[".."] * (len(rel.parts) + 1)) / "blobs" / blob)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes no newline
    return snapshot


@pytest.fixture
def cache(corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_CACHE with org/llama (main: a Llama with a cloned head; v1: the tied one) and a
    repository without namespace, tiny; the working folder is an empty folder outside it."""
    hub = tmp_path / "hub"
    add_snapshot(hub, "org/llama", corpus.path("hf_llama_cloned_head"), COMMIT, ("main",))
    add_snapshot(hub, "org/llama", corpus.path("hf_llama_tied"), OTHER, ("v1", "refs/pr/1"))
    add_snapshot(hub, "tiny", corpus.path("st_cloned_head"), COMMIT, ("main",))
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return hub


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def listing(folder: Path) -> dict[str, tuple[str, int]]:
    """Every entry with its link target (or '') and size: what a run must leave as it was."""
    return {
        str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else "", p.lstat().st_size)
        for p in sorted(folder.rglob("*"))
    }


def test_check_a_repo_id_audits_the_snapshot_refs_main_names(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = listing(cache)
    code, out, err = cli(["check", "org/llama", "--jobs", "1", "--format", "json"], capsys)
    repo = cache / "models--org--llama"
    assert code == 1, err  # the cloned head
    assert err[0] == f"tieaudit: note: org/llama: audited snapshot {COMMIT} from {repo}"
    assert err[1:] == [  # the closing line (generation_config.json is no checkpoint)
        "tieaudit: 1 checkpoint, 1 failing, 0 errors, 32.0 KiB wasted; "
        "1 file skipped (1 not a checkpoint format)"
    ], err
    document = json.loads(out)
    assert document["path"] == str(repo / "snapshots" / COMMIT)  # the real path, as read
    (finding,) = document["findings"]
    assert finding["rule"] == "TIE001"
    assert sorted(finding["names"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    # the fix reads the repository id as typed and writes to the current folder, named after the
    # repository, never into the cache (tests/test_hf_cache_hints.py runs it)
    assert finding["fix"] == "tieaudit retie org/llama ./llama-retied"
    assert listing(cache) == before


def test_the_cache_folder_follows_hf_home_and_the_legacy_variable(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    home = cache.parent / "hf-home"
    home.mkdir()
    cache.rename(home / "hub")
    monkeypatch.setenv("HF_HOME", str(home))
    code, _, err = cli(["check", "tiny", "--jobs", "1"], capsys)
    assert code == 1
    assert err[0] == f"tieaudit: note: tiny: audited snapshot {COMMIT} from {home / 'hub' / 'models--tiny'}"
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"}) == "/a"
    assert hub_cache_dir({"HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"}) == "/b"
    assert hub_cache_dir({"HF_HOME": "/c", "XDG_CACHE_HOME": "/x"}) == "/c/hub"
    assert hub_cache_dir({"XDG_CACHE_HOME": "/x"}) == "/x/huggingface/hub"
    assert hub_cache_dir({}) == os.path.expanduser("~/.cache/huggingface/hub")


@pytest.mark.parametrize(
    ("argument", "commit", "code"),
    [
        ("org/llama", COMMIT, 1),
        ("org/llama@main", COMMIT, 1),
        ("org/llama@v1", OTHER, 0),  # a tag under refs/: the tied Llama, clean
        ("org/llama@refs/pr/1", OTHER, 0),  # a pull request's ref, stored as refs/refs/pr/1
        (f"org/llama@{OTHER}", OTHER, 0),  # a commit hash names its snapshot folder directly
    ],
)
def test_a_revision_is_a_ref_or_a_commit(
    cache: Path, capsys: pytest.CaptureFixture[str], argument: str, commit: str, code: int
) -> None:
    done, out, err = cli(["inspect", argument, "--format", "json"], capsys)
    assert done == 0, err  # inspect reports, it does not gate
    assert err == [
        f"tieaudit: note: {argument}: audited snapshot {commit} from {cache / 'models--org--llama'}"
    ]
    assert json.loads(out)["path"] == str(cache / "models--org--llama" / "snapshots" / commit)
    assert cli(["check", argument, "--jobs", "1"], capsys)[0] == code


def test_a_repo_id_the_cache_lacks_is_one_error_and_never_a_download(
    cache: Path, corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    local = Path("local.safetensors")
    shutil.copy(corpus.path("st_cloned_head"), local)
    code, _, err = cli(["check", "org/none", "org/llama@v9", str(local), "--jobs", "1"], capsys)
    assert code == 2  # the others are still audited: the run is incomplete
    assert err[:2] == [
        f"tieaudit: error: org/none: no such file or folder, and not in the Hugging Face cache at {cache} "
        "(tieaudit never downloads: `hf download org/none` fetches it)",
        f"tieaudit: error: org/llama@v9: revision v9 of org/llama is not in the Hugging Face cache at "
        f"{cache} (tieaudit never downloads: `hf download org/llama --revision v9` fetches it)",
    ]
    assert err[2].startswith("tieaudit: 1 checkpoint, 1 failing, 2 errors")
    code, out, err = cli(["inspect", "org/none"], capsys)
    assert (code, out) == (2, "")
    assert err == [
        f"tieaudit: error: org/none: no such file or folder, and not in the Hugging Face cache at {cache} "
        "(tieaudit never downloads: `hf download org/none` fetches it)"
    ]


def test_a_ref_that_is_no_regular_file_or_too_long_names_no_snapshot(cache: Path) -> None:
    refs = cache / "models--org--llama" / "refs"
    (refs / "main").unlink()
    os.mkfifo(refs / "main")  # never waited on
    with pytest.raises(InputError, match="revision main of org/llama is not in"):
        resolve("org/llama", str(cache))
    (refs / "main").unlink()
    (refs / "main").write_text(COMMIT + " " * 1024)
    with pytest.raises(InputError, match="revision main of org/llama is not in"):
        resolve("org/llama", str(cache))
    (refs / "main").write_text("../../../elsewhere")
    with pytest.raises(InputError, match="revision main of org/llama is not in"):
        resolve("org/llama", str(cache))
    (refs / "main").write_text(COMMIT + "\n")  # a trailing newline (written by hand) is fine
    assert resolve("org/llama", str(cache)).revision == COMMIT


@pytest.mark.parametrize(
    "missing", ["models/", "./llama", "missing.safetensors", "a/b/c", "org/x--y", "../up"]
)
def test_a_missing_path_that_cannot_be_a_repo_id_is_no_such_file(
    cache: Path, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    assert not looks_like_repo_id(missing)
    code, _, err = cli(["inspect", missing], capsys)
    assert (code, err) == (2, [f"tieaudit: error: {missing}: no such file or folder"])


def test_an_existing_path_wins_over_the_cache(
    cache: Path, corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    os.makedirs("org")
    shutil.copytree(corpus.path("hf_llama_tied"), "org/llama")  # a local folder named like the id
    code, out, err = cli(["inspect", "org/llama", "--format", "json"], capsys)
    assert (code, err) == (0, [])
    assert json.loads(out)["path"] == "org/llama"


def test_a_snapshot_link_leaving_the_repository_folder_is_refused(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = cache / "models--org--llama" / "snapshots" / COMMIT
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(snapshot / "model.safetensors", outside)
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(outside)  # inside the cache folder is not enough either
    code, _, err = cli(["check", "org/llama", "--jobs", "1"], capsys)
    assert code == 2
    assert (
        err[-1]
        == f"tieaudit: error: {snapshot}: model.safetensors is a link leading outside the model folder"
    )
    # the snapshot folder itself a link out of the repository: refused before anything is read
    moved = tmp_path / "moved"
    (cache / "models--tiny" / "snapshots" / COMMIT).rename(moved)
    (cache / "models--tiny" / "snapshots" / COMMIT).symlink_to(moved, target_is_directory=True)
    with pytest.raises(InputError, match="is a link leading outside"):
        resolve("tiny", str(cache))
    assert cli(["inspect", "tiny"], capsys)[0] == 2


def test_fix_hints_never_point_into_a_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = cache / "models--tiny" / "snapshots" / COMMIT / "model.safetensors"
    code, out, _ = cli(["check", str(file), "--jobs", "1", "--format", "json"], capsys)  # a path, not an id
    assert code == 1
    fixes = [f["fix"] for f in json.loads(out)["findings"]]
    assert fixes == [f"tieaudit retie {file} ./model-retied.safetensors --all-equal"]
    # by layout wherever the cache is, through a link to the snapshot too
    os.symlink(file.parent, "linked")
    assert retied_path("linked/model.safetensors", "safetensors") == "./model-retied.safetensors"
    assert retied_path(str(file.parent) + "/", "hf-dir") == "./tiny-retied"
    assert retied_path("plain/model.safetensors", "safetensors") == "plain/model-retied.safetensors"
    blob = next((cache / "models--tiny" / "blobs").iterdir())
    assert (
        retied_path(str(blob), "safetensors")
        == f"./{blob.name.removesuffix('.safetensors')}-retied.safetensors"
    )  # a blob
    assert retied_path(str(cache / "models--tiny" / "snapshots"), "hf-dir") == "./snapshots-retied"
    os.chdir(file.parent)  # working inside a snapshot: no folder to suggest
    assert retied_path("model.safetensors", "safetensors") == "OUT"
    assert snapshot_of("model.safetensors") is not None
    assert snapshot_of(str(cache)) is None
    os.chdir(cache.parent)
    for finding in json.loads(out)["findings"]:
        assert "--in-place" not in finding["fix"]


def test_retie_reads_from_the_cache_and_writes_elsewhere(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = listing(cache)
    code, _, err = cli(["retie", "org/llama", "llama-retied"], capsys)
    assert code == 0, err
    assert err[0] == f"tieaudit: note: org/llama: read snapshot {COMMIT} from {cache / 'models--org--llama'}"
    assert cli(["check", "llama-retied", "--jobs", "1"], capsys)[0] == 0
    code, _, err = cli(["retie", "org/llama", "org/llama", "--in-place"], capsys)
    assert code == 2
    assert err[-1].startswith("tieaudit: error: --in-place would rewrite the Hugging Face cache's org/llama")
    snapshot = cache / "models--org--llama" / "snapshots" / COMMIT
    for args in (  # named by path, the cache is refused as OUT too, never offered --in-place
        [str(snapshot), str(snapshot)],
        [str(snapshot), str(snapshot), "--in-place"],
        [str(snapshot), str(snapshot.parent / "retied")],
        [str(snapshot / "model.safetensors"), str(snapshot / "model.safetensors"), "--in-place"],
    ):
        code, _, err = cli(["retie", *args], capsys)
        assert code == 2
        assert err == [
            f"tieaudit: error: {args[1]}: OUT lies in a Hugging Face cache; write it outside the cache"
        ]
    assert listing(cache) == before


def test_no_download_no_socket_no_huggingface_hub(cache: Path, tmp_path: Path) -> None:
    """The cache is read by tieaudit's own reader: huggingface_hub, torch and transformers are
    never imported and no socket is asked for, whether the id is there or not."""
    spec, result = tmp_path / "spec.json", tmp_path / "result.json"
    runs = [["check", "org/llama", "--jobs", "1"], ["inspect", "org/none"], ["inspect", "org/llama@v1"]]
    spec.write_text(json.dumps({"runs": runs, "result": str(result)}))
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import guarded_cli as g; "
        "g.BLOCKED = (*g.BLOCKED, 'huggingface_hub'); sys.exit(g.main(sys.argv[2]))"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "PYTHONPATH": str(GUARD.parent.parent)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(GUARD.parent), str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.read_text())
    assert [r["code"] for r in report["runs"]] == [1, 2, 0]
    assert report["import_attempts"] == report["sockets"] == report["loaded"] == []


def test_a_baseline_names_a_cached_model_by_its_address_not_its_revision(
    cache: Path, corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(["check", "org/llama", "--jobs", "1", "--write-baseline", "base.json"], capsys)
    assert code == 0, err
    document = json.loads(Path("base.json").read_text())
    assert [(e["path"], e["rule"]) for e in document["findings"]] == [("hf://org/llama", "TIE001")]
    # a new revision holding the same copy: the baseline still accepts it, by path or by id
    newer = add_snapshot(cache, "org/llama", corpus.path("hf_llama_cloned_head"), OTHER[::-1], ("v2",))
    for argument in ("org/llama@v2", str(newer)):
        code, out, err = cli(
            ["check", argument, "--jobs", "1", "--baseline", "base.json", "-f", "json"], capsys
        )
        assert code == 0, err
        assert [f["baselined"] for f in json.loads(out)["findings"]] == [True]


def test_a_snapshots_subfolders_link_into_its_blobs_as_its_top_files_do(
    corpus: Corpus, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pipeline's component folders and an onnx/ export lie in subfolders of the snapshot, whose
    links climb more levels to the same blobs: read as the model's, never "a link outside"."""
    source = tmp_path / "pipe"
    shutil.copytree(corpus.path("hf_llama_tied"), source)
    shutil.copytree(corpus.path("hf_llama_cloned_head"), source / "text_encoder")
    snapshot = add_snapshot(cache, "org/pipe", source, OTHER, ("main",))
    assert os.readlink(snapshot / "text_encoder" / "config.json").startswith("../../../blobs/")
    for argument in ("org/pipe", str(snapshot)):
        code, out, err = cli(["check", argument, "--jobs", "1"], capsys)
        assert code == 1 and ", 0 errors," in err[-1], err
        joined = " ".join(out.split())  # a path wider than the width stands on a line of its own
        assert "FAIL " in joined and "/text_encoder (" in joined and "TIE001" in out
        assert cli(["inspect", str(snapshot / "text_encoder")], capsys)[0] == 0
