"""check's output for people where they already look: markdown (a PR comment, the job summary),
github (workflow-command annotations), the closing line on stderr, --quiet, and SARIF written
when nothing could be audited.

The golden files (tests/data/golden/) were reviewed by eye; TIEAUDIT_REGENERATE_GOLDEN=1 rewrites
them from the current output (review the diff before committing it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import Corpus
from markdown_it import MarkdownIt
from safetensors.numpy import save_file
from test_sarif import validate

from tieaudit.cli.main import check, main
from tieaudit.core.escape import printable
from tieaudit.report import CHECK_FORMATS
from tieaudit.report.github import escape_data, escape_property

GOLDEN = Path(__file__).parent / "data" / "golden"
FORMATS = ["text", "json", "sarif", "markdown", "github"]
HOSTILE = ["emb|a`b`<img src=x onerror=alert(1)>\n%25,:@octocat #1", "head::error::x,title=y:%0A|`"]
"""Tensor names that try to break a table, start HTML, mention someone, and forge a command."""
POINTER = f"version https://git-lfs.github.com/spec/v1\noid sha256:{'0' * 64}\nsize 1048576\n"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TIEAUDIT_REGENERATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


@pytest.fixture
def models(corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository's models/: a baselined copy, a new transposed copy, a broken declared tie, a
    clean file, a broken file and a README; run from the repository's root."""
    root = tmp_path / "models"
    root.mkdir()
    shutil.copy(corpus.path("st_cloned_head"), root / "cloned.safetensors")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "models", "--write-baseline", "baseline.json", "--jobs", "1"]) == 0
    shutil.copy(corpus.path("st_transposed_copy"), root / "transposed.safetensors")
    shutil.copy(corpus.path("st_save_model_tied"), root / "tied.safetensors")
    shutil.copytree(corpus.path("hf_llama_diverged_head"), root / "diverged")
    (root / "broken.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{broken}")
    (root / "README.md").write_text("# models\n")
    return root


def checked(args: list[str], capsys: pytest.CaptureFixture[str], code: int) -> tuple[str, str]:
    assert main(["check", *args, "--jobs", "1"]) == code
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_the_format_choices_are_the_library_s() -> None:
    (option,) = [p for p in check.params if p.name == "fmt"]
    assert tuple(option.type.choices) == CHECK_FORMATS == tuple(FORMATS)  # type: ignore[attr-defined]


def test_markdown_golden(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, err = checked(["models", "--baseline", "baseline.json", "-f", "markdown"], capsys, 2)
    golden("check.md", out)
    assert "(baselined)" in out and "**error**" in out
    assert err.splitlines()[-1].startswith("tieaudit: 4 checkpoints, 2 failing, 1 error, 1 baselined")


def test_github_golden(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = checked(["models", "--baseline", "baseline.json", "-f", "github"], capsys, 2)
    golden("check.github.txt", out)
    commands = [parse_command(line) for line in out.splitlines()]
    # one per finding no baseline accepts, one per unreadable path; the baselined copy is not there
    assert [(c[0], c[1]["title"]) for c in commands] == [
        ("error", "TIE002 declared-tie-broken"),
        ("warning", "TIE001 untied-copy"),
        ("error", "tieaudit: could not audit"),
    ]
    assert [c[1]["file"] for c in commands] == [
        "models/diverged/model.safetensors",  # the file holding the finding's first stored tensor
        "models/transposed.safetensors",
        "models/broken.safetensors",
    ]
    assert "cloned" not in out


def parse_command(line: str) -> tuple[str, dict[str, str], str]:
    """A workflow command as GitHub's runner reads it (ActionCommand.TryParseV2 and its unescaping)."""
    assert line.startswith("::")
    end = line.index("::", 2)
    info, data = line[2:end], line[end + 2 :]
    name, _, props = info.partition(" ")
    properties = {}
    for pair in filter(None, props.split(",")):
        key, _, value = pair.partition("=")
        for token, replacement in (("\r", "%0D"), ("\n", "%0A"), (":", "%3A"), (",", "%2C"), ("%", "%25")):
            value = value.replace(replacement, token)
        properties[key] = value
    for token, replacement in (("\r", "%0D"), ("\n", "%0A"), ("%", "%25")):
        data = data.replace(replacement, token)
    return name, properties, data


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy whose tensor names, and the file's own name, are written to break out of any format."""
    matrix = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "m,title=x:y%0A::error::.safetensors"
    save_file({HOSTILE[0]: matrix, HOSTILE[1]: matrix.copy()}, str(path))
    return path


def test_github_escapes_names_so_no_command_is_forged(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = checked([hostile.name, "-f", "github"], capsys, 1)
    (line,) = out.splitlines()  # a newline in a name does not start a line of its own
    name, properties, data = parse_command(line)
    assert name == "warning" and set(properties) == {"file", "title"}
    assert properties == {"file": hostile.name, "title": "TIE001 untied-copy"}
    assert printable(HOSTILE[0]) in data and printable(HOSTILE[1]) in data
    assert "%25" in line and "\n" not in data  # % escaped once; the newline is \n, two characters
    assert escape_property("a%b:c,d\r\n") == "a%25b%3Ac%2Cd%0D%0A"
    assert escape_data("a%b:c,d\r\n") == "a%25b:c,d%0D%0A"


def test_markdown_escapes_names_so_the_table_holds(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = checked([hostile.name, "-f", "markdown"], capsys, 1)
    html = MarkdownIt("commonmark").enable("table").render(out)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    (table,) = re.findall(r"<tbody>(.*?)</tbody>", html, flags=re.DOTALL)
    (row,) = re.findall(r"<tr>(.*?)</tr>", table, flags=re.DOTALL)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.DOTALL)
    assert len(cells) == 7  # rule, severity, names, relation, wasted, message, fix: no cell split off
    codes = re.findall(r"<code>(.*?)</code>", cells[2])
    unescaped = [c.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") for c in codes]
    assert sorted(unescaped) == sorted(printable(n) for n in HOSTILE)  # each name exactly, as code
    assert "@\u200boctocat" in cells[5] and "#\u200b1" in cells[5]  # no mention, no issue reference


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_closing_line_goes_to_stderr_with_o(
    fmt: str, corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / f"report.{fmt}"
    out, err = checked([str(corpus.path("st_cloned_head")), "-f", fmt, "-o", str(out_file)], capsys, 1)
    assert out == "" and out_file.read_text()
    assert err == "tieaudit: 1 checkpoint, 1 failing, 0 errors, 32.0 KiB wasted\n"


def test_quiet_prints_only_failures(corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    failing, clean = str(corpus.path("st_cloned_head")), str(corpus.path("st_save_model_tied"))
    out, err = checked([failing, clean, "--quiet"], capsys, 1)
    assert out.startswith(f"FAIL {failing}") and clean not in out and "fix: tieaudit retie" in out
    assert err == "tieaudit: 2 checkpoints, 1 failing, 0 errors, 32.0 KiB wasted\n"
    out, err = checked([failing, clean], capsys, 1)
    assert f"ok   {clean}" in out  # without --quiet the passing one is listed
    markdown, _ = checked([failing, clean, "--quiet", "-f", "markdown"], capsys, 1)
    assert "No findings" not in markdown and clean not in markdown and "### FAIL" in markdown
    # A warning under --fail-on error passes: annotated as a warning, but not with --quiet.
    out, err = checked([failing, "--fail-on", "error", "-f", "github"], capsys, 0)
    assert out.startswith("::warning ") and err.startswith("tieaudit: 1 checkpoint, 0 failing")
    assert checked([failing, "--fail-on", "error", "-f", "github", "-q"], capsys, 0) == ("", "")
    for fmt in ("text", "markdown", "github"):  # everything passes: nothing at all
        assert checked([clean, "-q", "-f", fmt], capsys, 0) == ("", "")


def test_sarif_is_written_when_every_path_is_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lfs").mkdir()
    pointer = tmp_path / "lfs" / "model.safetensors"
    pointer.write_text(POINTER)
    sarif = tmp_path / "tieaudit.sarif"
    out, err = checked([str(pointer), "-f", "sarif", "-o", str(sarif)], capsys, 2)
    assert (
        out == ""
        and err == f"tieaudit: error: {pointer}: Git LFS pointer, not the weights: run `git lfs pull`\n"
    )
    document = json.loads(sarif.read_text())
    validate(document)
    (run,) = document["runs"]
    assert run["results"] == [] and run["invocations"][0]["executionSuccessful"] is False
    (notice,) = run["invocations"][0]["toolExecutionNotifications"]
    assert notice["message"]["text"] == f"{pointer}: Git LFS pointer, not the weights: run `git lfs pull`"
    # A folder holding only pointers stops before auditing (nothing scanned): the log says why.
    sarif.unlink()
    out, err = checked([str(tmp_path / "lfs"), "-f", "sarif", "-o", str(sarif)], capsys, 2)
    assert err.startswith("tieaudit: error: nothing scanned:") and len(err.splitlines()) == 1
    document = json.loads(sarif.read_text())
    validate(document)
    (notice,) = document["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert notice["message"]["text"].startswith("nothing scanned: no checkpoints under ")
    # json keeps 'bad input: nothing written'; github and markdown say why on stdout.
    assert checked([str(pointer), "-f", "json", "-o", str(tmp_path / "r.json")], capsys, 2)[0] == ""
    assert not (tmp_path / "r.json").exists()
    out, _ = checked([str(tmp_path / "lfs"), "-f", "github"], capsys, 2)
    assert parse_command(out.strip())[0] == "error" and "nothing scanned" in out
    out, _ = checked([str(pointer), "-f", "markdown"], capsys, 2)
    assert out.startswith("## tieaudit check: ERROR") and "git lfs pull" in out


def test_the_docs_annotation_and_comment_step_runs(corpus: Corpus, tmp_path: Path) -> None:
    """docs/ci.md's extra step: annotations on stdout, the markdown for a PR comment from the same run."""
    text = (Path(__file__).parent.parent / "docs" / "ci.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL) if "comment.md" in b]
    (command,) = re.findall(r"run: (tieaudit check .*)", block)
    (tmp_path / "models").mkdir()
    shutil.copy(corpus.path("st_cloned_head"), tmp_path / "models" / "cloned.safetensors")
    run = subprocess.run(
        ["bash", "-c", command.replace("tieaudit", f"{shlex.quote(sys.executable)} -m tieaudit", 1)],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 1  # the step fails the job on the copy
    assert run.stdout.startswith("::warning file=models/cloned.safetensors,title=TIE001 untied-copy::")
    assert (tmp_path / "comment.md").read_text().startswith("## tieaudit check: FAIL\n")


def test_a_failure_after_the_report_keeps_the_report(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tieaudit.gate.baseline
    from tieaudit.core.errors import OutputError

    def disk_full(path: str, audits: object) -> int:  # what no check before the audit can foresee
        raise OutputError("cannot write: No space left on device", path)

    sarif = tmp_path / "out.sarif"
    bad_baseline = tmp_path / "baseline.json"
    args = [str(corpus.path("st_cloned_head")), "-f", "sarif", "-o", str(sarif)]
    with monkeypatch.context() as patch:
        patch.setattr(tieaudit.gate.baseline, "write_baseline", disk_full)
        out, err = checked([*args, "--write-baseline", str(bad_baseline)], capsys, 2)
    assert err.splitlines()[-1] == f"tieaudit: error: {bad_baseline}: cannot write: No space left on device"
    assert not bad_baseline.exists()
    (run,) = json.loads(sarif.read_text())["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["TIE001"]  # not replaced by a report of the failure
    # A bad policy file stops the run first: the SARIF says why.
    (tmp_path / "bad.toml").write_text("[tool.tieaudit\n")
    out, err = checked([*args, "--policy", str(tmp_path / "bad.toml")], capsys, 2)
    (run,) = json.loads(sarif.read_text())["runs"]
    (notice,) = run["invocations"][0]["toolExecutionNotifications"]
    assert run["results"] == [] and err == f"tieaudit: error: {notice['message']['text']}\n"
