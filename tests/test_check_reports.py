"""check --report FORMAT=FILE: more reports of one audit (the GitHub Action writes annotations to stdout,
SARIF for code scanning and markdown for the job summary from a single run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import Corpus

from tieaudit.cli.main import main


@pytest.fixture
def models(corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copy(corpus.path("st_cloned_head"), root / "cloned.safetensors")
    shutil.copy(corpus.path("st_save_model_tied"), root / "tied.safetensors")
    monkeypatch.chdir(tmp_path)
    return root


def test_each_report_equals_the_report_of_its_own_run(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "models", "--jobs", "1", "-o", "alone.sarif", "--format", "sarif"]) == 1
    assert main(["check", "models", "--jobs", "1", "-o", "alone.md", "--format", "markdown"]) == 1
    assert main(["check", "models", "--jobs", "1", "-o", "alone.json", "--format", "json"]) == 1
    capsys.readouterr()
    code = main(
        ["check", "models", "--jobs", "1", "--format", "github", "--report", "sarif=one.sarif",
         "--report", "markdown=one.md", "--report", "json=one.json"]
    )  # fmt: skip
    assert code == 1
    out = capsys.readouterr().out
    assert out.startswith("::warning file=models/cloned.safetensors,title=TIE001")
    for suffix in ("sarif", "md", "json"):
        assert Path(f"one.{suffix}").read_text() == Path(f"alone.{suffix}").read_text(), suffix


def test_a_run_that_audits_nothing_still_writes_the_reports_saying_why(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["check", "empty-folder-x", "--report", "sarif=why.sarif", "--report", "markdown=why.md"])
    assert code == 2
    assert "empty-folder-x" in Path("why.sarif").read_text()
    assert "empty-folder-x" in Path("why.md").read_text()
    assert "tieaudit: error: empty-folder-x" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["sarif", "pdf=x.pdf", "sarif=", "sarif=-", "=x.sarif"])
def test_a_report_that_is_not_format_equals_file_is_a_usage_error(
    value: str, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "models", "--report", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not FORMAT=FILE" in err
    assert sorted(p.name for p in Path().iterdir()) == ["models"]  # nothing written


def test_a_report_that_cannot_be_written_is_said_before_any_audit(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "models", "--report", "sarif=no-such-folder/t.sarif"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-folder" in err
    assert "checkpoint" not in err  # no closing line: nothing was audited
    assert sorted(p.name for p in Path().iterdir()) == ["models"]
