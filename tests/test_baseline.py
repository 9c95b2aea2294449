"""Baselines: accepted findings stay visible but pass; a new copy fails; fingerprints are stable."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Corpus

from tieaudit.cli.main import main
from tieaudit.core.errors import UsageError
from tieaudit.gate.baseline import SCHEMA, fingerprint, load_baseline


@pytest.fixture
def repo(corpus: Corpus, tmp_path: Path) -> Path:
    """A model repository with two known copies and a clean model."""
    root = tmp_path / "repo"
    (root / "models").mkdir(parents=True)
    shutil.copy(corpus.path("st_cloned_head"), root / "models" / "cloned.safetensors")
    shutil.copy(corpus.path("torch_transposed_copy"), root / "models" / "transposed.pt")
    shutil.copy(corpus.path("st_untied_lm"), root / "models" / "clean.safetensors")
    return root


def check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tieaudit", "check", "models", "--jobs", "1", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=repo)


def test_known_findings_pass_and_a_new_copy_fails(repo: Path, corpus: Corpus) -> None:
    assert check(repo).returncode == 1
    written = check(repo, "--write-baseline", "baseline.json")
    assert written.returncode == 0, written.stderr
    assert "wrote 2 findings to baseline.json" in written.stderr
    rerun = check(repo, "--baseline", "baseline.json")
    assert rerun.returncode == 0, rerun.stdout
    assert "(baselined)" in rerun.stdout and "FAIL" not in rerun.stdout
    shutil.copy(corpus.path("st_cloned_head"), repo / "models" / "new-copy.safetensors")
    added = check(repo, "--baseline", "baseline.json")
    assert added.returncode == 1
    failing = [line for line in added.stdout.splitlines() if line.startswith("FAIL")]
    assert failing == [f"FAIL models/new-copy.safetensors  {failing[0].split('  ', 1)[1]}"]


def test_the_baseline_file_is_reviewable_and_fingerprints_are_defined(repo: Path) -> None:
    assert main(["check", str(repo / "models"), "--write-baseline", str(repo / "baseline.json")]) == 0
    document = json.loads((repo / "baseline.json").read_text())
    assert document["schema"] == SCHEMA
    entries = document["findings"]
    assert [(e["path"], e["rule"], e["names"]) for e in entries] == [
        ("models/cloned.safetensors", "TIE001", ["emb.weight", "head.weight"]),
        ("models/transposed.pt", "TIE001", ["emb", "proj"]),
    ]
    names = ["emb.weight", "head.weight"]
    key = json.dumps(["models/cloned.safetensors", "TIE001", names], separators=(",", ":"))
    assert entries[0]["fingerprint"] == hashlib.sha256(key.encode()).hexdigest()
    cloned = str(repo / "models" / "cloned.safetensors")
    assert fingerprint(cloned, "TIE001", names[::-1], root=str(repo)) == entries[0]["fingerprint"]


def test_fingerprints_ignore_how_paths_are_spelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    (root / "models").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    absolute = fingerprint(str(root / "models" / "m.pt"), "TIE001", ["b", "a"], root=str(root))
    assert fingerprint("repo/models/../models/m.pt", "TIE001", ["a", "b"], root="repo") == absolute
    monkeypatch.chdir(root / "models")
    assert fingerprint("m.pt", "TIE001", ["a", "b"], root="..") == absolute
    assert fingerprint("m.pt", "TIE002", ["a", "b"], root="..") != absolute


def test_json_marks_baselined_findings_and_counts_stale_entries(repo: Path, tmp_path: Path) -> None:
    baseline = repo / "baseline.json"
    main(["check", str(repo / "models"), "--write-baseline", str(baseline)])
    (repo / "models" / "transposed.pt").unlink()  # fixed since
    out = tmp_path / "r.json"
    code = main(["check", str(repo / "models"), "--baseline", str(baseline), "-f", "json", "-o", str(out)])
    assert code == 0
    document = json.loads(out.read_text())
    (cloned,) = [r for r in document["reports"] if r["path"].endswith("cloned.safetensors")]
    assert cloned["findings"][0]["baselined"] is True and cloned["status"] == "ok"
    assert document["summary"]["baselined"] == 1 and document["summary"]["stale_baseline_entries"] == 1
    assert document["baseline"] == str(baseline)


def test_baselined_findings_still_fail_when_the_baseline_is_elsewhere(repo: Path, tmp_path: Path) -> None:
    # fingerprints are relative to the baseline's folder: a baseline beside other paths matches nothing
    main(["check", str(repo / "models"), "--write-baseline", str(repo / "baseline.json")])
    moved = tmp_path / "elsewhere" / "baseline.json"
    moved.parent.mkdir()
    shutil.copy(repo / "baseline.json", moved)
    assert main(["check", str(repo / "models"), "--baseline", str(moved)]) == 1


def test_write_baseline_refuses_an_incomplete_run(repo: Path) -> None:
    (repo / "models" / "broken.pt").write_bytes(b"PK\x03\x04 truncated")
    result = check(repo, "--write-baseline", "baseline.json")
    assert result.returncode == 2
    assert not (repo / "baseline.json").exists()


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"schema": "other/1", "findings": []}',
        '{"schema": "tieaudit.baseline/1"}',
        '{"schema": "tieaudit.baseline/1", "findings": [{"path": "x"}]}',
    ],
)
def test_malformed_baselines_are_usage_errors(content: str, repo: Path) -> None:
    baseline = repo / "baseline.json"
    baseline.write_text(content)
    with pytest.raises(UsageError):
        load_baseline(str(baseline))
    assert main(["check", str(repo / "models"), "--baseline", str(baseline)]) == 2
    assert main(["check", str(repo / "models"), "--baseline", str(repo / "missing.json")]) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"schema": "tieaudit.baseline/1", "findings": [' + b"9" * 5000 + b"]}", "more than 4300 digits"),
        (b'{"schema": "tieaudit.baseline/1", "findings": [[[[[[[[[]]]]]]]]]}', "deeper than 8 levels"),
        (b'{"schema": "tieaudit.baseline/1\xff"}', "not UTF-8 text"),
    ],
)
def test_hostile_baselines_are_one_usage_line(content: bytes, message: str, tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(content)
    with pytest.raises(UsageError) as raised:
        load_baseline(str(baseline))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_baseline_over_the_size_limit_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tieaudit.gate.baseline

    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"schema": SCHEMA, "findings": []}))
    monkeypatch.setattr(tieaudit.gate.baseline, "MAX_BASELINE_BYTES", baseline.stat().st_size - 1)
    with pytest.raises(UsageError, match=r"over the \d+ B limit \(MAX_BASELINE_BYTES\)"):
        load_baseline(str(baseline))


def test_paths_and_names_that_are_not_utf8_have_fingerprints_and_round_trip(tmp_path: Path) -> None:
    from tieaudit.gate.baseline import baseline_text, entry

    path = str(tmp_path / "models" / "\udcff\n.safetensors")  # a file name byte that is not UTF-8
    accepted = entry(path, "TIE001", ["\ud800 lone surrogate from a JSON header", "b"], root=str(tmp_path))
    text = baseline_text([accepted])
    text.encode("utf-8")  # valid UTF-8: the surrogates are JSON escapes
    (written,) = json.loads(text)["findings"]
    assert written["path"] == "models/\udcff\n.safetensors"
    assert written["names"] == sorted(accepted.names)
    assert (
        written["fingerprint"]
        == accepted.fingerprint
        == fingerprint(path, "TIE001", list(accepted.names), root=str(tmp_path))
    )
    plain = hashlib.sha256(json.dumps(["m.pt", "TIE001", ["a"]], separators=(",", ":")).encode()).hexdigest()
    # UTF-8 unchanged
    assert fingerprint(str(tmp_path / "m.pt"), "TIE001", ["a"], root=str(tmp_path)) == plain


def _entries(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("missing/baseline.json", "cannot write here: no folder {repo}/missing"),
        (
            "models/clean.safetensors/baseline.json",
            "cannot write here: {repo}/models/clean.safetensors is not a folder",
        ),
    ],
)
def test_a_baseline_that_cannot_be_written_stops_the_run_before_any_audit(
    repo: Path, where: str, why: str
) -> None:
    """One line and exit 2 at once, not after auditing every checkpoint; nothing is created."""
    before = _entries(repo)
    result = check(repo, "--write-baseline", str(repo / where))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"tieaudit: error: {repo / where}: {why.format(repo=repo)}"]
    assert _entries(repo) == before
    # -o too; a SARIF report that can be written says why the run stopped, and holds no result
    result = check(repo, "-o", str(repo / where))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"tieaudit: error: {repo / where}: {why.format(repo=repo)}"]
    result = check(repo, "--write-baseline", str(repo / where), "-f", "sarif", "-o", "out.sarif")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    (run,) = json.loads((repo / "out.sarif").read_text())["runs"]
    assert run["results"] == []
    assert run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"].endswith(
        why.format(repo=repo)
    )


def test_a_baseline_naming_a_folder_is_refused_before_any_audit(repo: Path) -> None:
    for option in ("--write-baseline", "-o"):
        result = check(repo, option, "models")
        assert (result.returncode, result.stdout) == (2, "")
        (line,) = result.stderr.splitlines()
        assert "'models' is a directory" in line  # click's check of dir_okay=False


def test_a_baseline_in_a_folder_that_cannot_be_written_stops_the_run_before_any_audit(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 0555 folder as a user other than root sees it (os.access answers for the mode; root, which CI
    runs as, writes whatever the mode, so the answer is the one a user's os.access gives)."""
    import tieaudit.core.atomic
    from tieaudit.cli.main import main

    locked = repo / "locked"
    locked.mkdir(mode=0o555)
    real = os.access

    def as_a_user(path: str | os.PathLike[str], mode: int) -> bool:
        if Path(path) == locked and mode & os.W_OK:
            return False
        return real(path, mode)

    monkeypatch.setattr(tieaudit.core.atomic.os, "access", as_a_user)
    monkeypatch.chdir(repo)
    assert main(["check", "models", "--write-baseline", "locked/baseline.json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"tieaudit: error: locked/baseline.json: cannot write here: folder {locked} is not writable"
    ]
    assert not any(locked.iterdir())


def test_a_baseline_on_a_read_only_filesystem_is_refused_up_front(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What os.access cannot see for root: the filesystem mounted read-only (its statvfs flag)."""
    import tieaudit.core.atomic
    from tieaudit.core.atomic import require_writable
    from tieaudit.core.errors import OutputError

    real = os.statvfs

    class ReadOnly:
        def __init__(self, path: str) -> None:
            self.f_flag = real(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(tieaudit.core.atomic.os, "statvfs", ReadOnly)
    with pytest.raises(OutputError, match=f"folder {repo} is on a read-only filesystem"):
        require_writable(str(repo / "baseline.json"))
    assert not (repo / "baseline.json").exists()
