"""Text reports that read well at 80-120 columns (the user trial's report: a 24-character message
column, names and the fix command split mid-word, check lines wrapped by the terminal).

A finding is a head line, its names (each whole), its message wrapped at spaces and its fix on a
line of its own, whole; tables only where their columns fit the content, else records. No line is
wider than COLUMNS but one that holds one unbreakable thing: a name or path alone, or a fix line.
The JSON report of the same run is the truth for the names and the fix commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Corpus
from rich.cells import cell_len
from rich.text import Text
from safetensors.numpy import save_file

from tieaudit.cli.main import main
from tieaudit.core.units import human_bytes
from tieaudit.report.finding_text import names_words
from tieaudit.report.layout import MIN_PROSE, Grid, column_widths, records
from tieaudit.report.wrap import cells, plain, word, words, wrap

WIDTHS = (80, 100, 120)
LONG = "encoder." + ".".join(f"layer_{i:03d}_block" for i in range(8)) + ".attention.output.dense.weight"
"""A name of 166 characters: wider than any of WIDTHS, so it must stand whole on a line of its own."""
LLAMA = ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight")
MANY = tuple(f"transformer.h.{i}.attn.c_attn_projection_copy.weight" for i in range(12))
"""Twelve copies of one matrix: a names line that wraps between names."""


def _matrix() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)


def too_wide(text: str, width: int) -> list[str]:
    """Lines wider than width, but for one whole unbreakable thing: a lone name or path (no blank
    in it), a fix line (``fix: <command>``) or a command of an advice alone on its line (a command
    is printed whole, never broken: people paste it)."""
    return [
        line
        for line in text.splitlines()
        if cell_len(line) > width
        and " " in line.strip()
        and not line.strip().startswith(("fix: tieaudit ", "tieaudit "))
    ]


def findings_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    reports = document["reports"] if "reports" in document else [document]
    return [finding for report in reports for finding in report["findings"]]


def assert_fixes_whole(text: str, findings: list[dict[str, Any]]) -> None:
    """Every fix of the JSON report in the text: a command on one `fix:` line, equal to the JSON's
    text; prose advice (commands in it) complete across its wrapped lines, each command on one line."""
    lines = [line.strip() for line in text.splitlines()]
    commands = [line.removeprefix("fix: ") for line in lines if line.startswith("fix: ")]
    advices = []
    for index, line in enumerate(lines):
        if line.startswith("advice:"):
            end = index + 1
            while end < len(lines) and text.splitlines()[end].startswith(" " * 6):
                end += 1
            advices.append(" ".join(lines[index:end]).removeprefix("advice:").strip())
    fixes = [f["fix"] for f in findings if f["fix"]]
    assert sorted(commands + advices) == sorted(fixes)
    assert all(command.startswith("tieaudit ") for command in commands)


def assert_names_whole(text: str, names: list[str]) -> None:
    lines = text.splitlines()
    missing = [name for name in names if not any(name in line for line in lines)]
    assert missing == []


def _run(args: list[str], tmp_path: Path, code: int) -> tuple[str, dict[str, Any]]:
    """The text report and the JSON report of one command, both written with -o."""
    text_out, json_out = tmp_path / "report.txt", tmp_path / "report.json"
    assert main([*args, "-o", str(text_out)]) == code
    assert main([*args, "-f", "json", "-o", str(json_out)]) == code
    document: dict[str, Any] = json.loads(json_out.read_text())
    return text_out.read_text(), document


@pytest.fixture
def long_file(tmp_path: Path) -> Path:
    """One matrix under three names, one longer than any width: a TIE001 with a fix."""
    path = tmp_path / "long.safetensors"
    save_file(
        {name: _matrix() for name in ("bert.embeddings.word_embeddings.weight", "cls.head.weight", LONG)},
        str(path),
    )
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Several files: an untied head, a transposed copy that another file repeats (a cross-file
    note), twelve copies under long names, and a file with nothing to report."""
    root = tmp_path / "models" / "a-folder-with-a-rather-long-name-to-push-the-status-lines"
    for sub in ("llama", "gpt", "many", "clean"):
        (root / sub).mkdir(parents=True)
    matrix = _matrix()
    save_file(
        {LLAMA[0]: matrix, LLAMA[1]: matrix.copy(), LLAMA[2]: np.ones(16, np.float32)},
        str(root / "llama" / "model.safetensors"),
    )
    save_file(
        {"transformer.wte.weight": matrix, "lm_head.weight": matrix.T.copy()},
        str(root / "gpt" / "model.safetensors"),
    )
    save_file({name: matrix.copy() for name in MANY}, str(root / "many" / "model.safetensors"))
    save_file({"w": np.zeros((4, 4), np.float32)}, str(root / "clean" / "model.safetensors"))
    return root


@pytest.mark.parametrize("width", WIDTHS)
def test_check_of_a_folder_fits_the_width(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    text, document = _run(["check", str(folder)], tmp_path, 1)
    findings = findings_of(document)
    assert {f["rule"] for f in findings} >= {"TIE001", "TIE012"}
    assert too_wide(text, width) == []
    assert_fixes_whole(text, findings)
    assert_names_whole(text, [name for f in findings for name in f["names"]])
    assert "…" not in text and "│" not in text
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"    names: {MANY[0]},")))
    below = [line for line in lines[start + 1 : start + 12] if line.startswith("      transformer.h.")]
    assert len(below) >= 5  # twelve names wrapped between names, under the label


@pytest.mark.parametrize("width", WIDTHS)
def test_check_of_a_name_wider_than_the_window(
    long_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    text, document = _run(["check", str(long_file)], tmp_path, 1)
    (finding,) = findings_of(document)
    assert finding["rule"] == "TIE001" and finding["fix"]
    assert too_wide(text, width) == []
    assert_fixes_whole(text, [finding])
    assert_names_whole(text, finding["names"])
    assert [line for line in text.splitlines() if LONG in line] == [f"      {LONG}", f"    {LONG}"]


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_fits_the_width(
    folder: Path, long_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    for path in (long_file, folder / "many" / "model.safetensors", folder / "llama" / "model.safetensors"):
        text, document = _run(["inspect", str(path)], tmp_path, 0)
        assert too_wide(text, width) == [], text
        assert_fixes_whole(text, document["findings"])
        assert_names_whole(text, [n for f in document["findings"] for n in f["names"]])
        assert_names_whole(
            text.split("Tensors (largest first)", 1)[1], [t["name"] for t in document["tensors"]]
        )
    assert "┃ name " not in text.split("Tensors", 1)[0]  # findings are lines, never a table


def test_tables_where_their_columns_fit_else_records(
    long_file: Path, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    short, _ = _run(["inspect", str(folder / "llama" / "model.safetensors")], tmp_path, 0)
    assert "┃ name                      ┃ dtype   ┃ shape ┃    size ┃" in short  # names of 25: a table
    long, _ = _run(["inspect", str(long_file)], tmp_path, 0)
    tensors = long.split("Tensors (largest first)\n", 1)[1]
    assert "┃" not in tensors  # a name of 166 characters: one record per tensor
    assert tensors.startswith(
        "  bert.embeddings.word_embeddings.weight\n    dtype float32  shape 64x16  size 4.0 KiB\n"
    )
    monkeypatch.setenv("COLUMNS", "200")
    wide, _ = _run(["inspect", str(long_file)], tmp_path, 0)
    assert f"│ {LONG} │ float32 │ 64x16 │ 4.0 KiB │" in wide


def test_column_widths_are_measured_on_the_content() -> None:
    grid = Grid(
        title="t",
        columns=("name", "status"),
        rows=[("a" * 30, "both stored separately")],
        prose=frozenset({"status"}),
    )
    assert column_widths(grid, 200) == [30, 22]  # room: every column its natural width
    assert column_widths(grid, 30 + 20 + 7) == [30, 20]  # prose wraps down to MIN_PROSE, no further
    assert column_widths(grid, 30 + 19 + 7) is None  # a prose column under MIN_PROSE: records
    named = Grid(title="t", columns=("name", "dtype"), rows=[("b" * 60, "float32")])
    assert column_widths(named, 60 + 7 + 7) == [60, 7] and column_widths(named, 60 + 7 + 6) is None
    worded = Grid(
        title="t", columns=("x", "note"), rows=[("x", "word " + "w" * 35)], prose=frozenset({"note"})
    )
    assert column_widths(worded, 1 + 35 + 7) == [1, 35]  # never under its longest word
    assert MIN_PROSE == 20
    lines = [plain(line) for line in records(named, 40)]
    assert lines == ["  " + "b" * 60, "    dtype float32"]


def test_wrap_breaks_between_words_never_inside_one() -> None:
    items = [*words("one two three"), word("x" * 30), *words("four five")]
    lines = [plain(line) for line in wrap(items, 20, indent=2, hang=4)]
    assert lines == ["  one two three", "    " + "x" * 30, "    four five"]
    assert [cells(s) for s in ("abc", "中文", "e\u0301")] == [3, 4, 1]
    styled = wrap([word("FAIL", "bold red"), *words("a b", "dim")], 40)
    assert styled == [[("FAIL", "bold red"), (" ", ""), ("a b", "dim")]]
    assert Text.assemble(*styled[0]).plain == "FAIL a b"


def test_the_optimizer_split_shows_its_bytes(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIE007's bytes (the state retie discards) in the text, as TIE001's: on the finding's head."""
    monkeypatch.setenv("COLUMNS", "80")
    for command, code in (("check", 1), ("inspect", 0)):
        text, document = _run([command, str(corpus.path("torch_train_copy"))], tmp_path, code)
        findings = findings_of(document)
        for finding in findings:
            assert finding["wasted_bytes"]
            head = f"  {finding['rule']} {finding['severity']}  {finding['kind']}"
            assert f"{head}" in text and f"{human_bytes(finding['wasted_bytes'])} wasted" in text
        (split,) = [f for f in findings if f["rule"] == "TIE007"]
        assert (
            f"  TIE007 warning  optimizer-state-split, {human_bytes(split['wasted_bytes'])} wasted\n" in text
        )
        assert too_wide(text, 80) == []
        assert_fixes_whole(text, findings)
        assert_names_whole(text, [n for f in findings for n in f["names"]])


def test_a_finding_reads_as_head_names_message_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    matrix = _matrix()
    save_file({LLAMA[0]: matrix, LLAMA[1]: matrix.copy()}, "model.safetensors")
    monkeypatch.setenv("COLUMNS", "100")
    text, document = _run(["check", "model.safetensors"], tmp_path, 1)
    (finding,) = findings_of(document)
    lines = text.splitlines()
    assert lines[:3] == [
        "FAIL model.safetensors  (safetensors, 2 tensors, 8.0 KiB, 4.0 KiB wasted)",
        "  TIE001 warning  untied-copy (equal), 4.0 KiB wasted",
        "    names: model.embed_tokens.weight, lm_head.weight",
    ]
    assert lines[-1] == "    fix: tieaudit retie model.safetensors model-retied.safetensors --all-equal"
    message = lines[3:-1]
    assert all(line.startswith("    ") and len(line) <= 100 for line in message)
    assert " ".join(line.strip() for line in message) == finding["message"]
    assert all(len(line) + len(lines[i + 1].split()[0]) + 1 > 100 for i, line in enumerate(message[:-1], 3))


def test_show_files_and_errors_fit_the_width(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = folder / "clean" / "broken-file-with-a-long-name-that-will-not-parse.safetensors"
    broken.write_bytes(b"\xff" * 64)
    (folder / "README.md").write_text("not a checkpoint\n")
    monkeypatch.setenv("COLUMNS", "80")
    report = tmp_path / "report.txt"
    assert main(["check", str(folder), "--show-files", "-o", str(report)]) == 2
    text = report.read_text()
    assert too_wide(text, 80) == []
    error = text.split("\nERROR", 1)[1].splitlines()
    assert error[1] == f"     {broken}:"  # wider than 80: on a line of its own, whole
    assert "files: " in text and all(str(folder / sub) in text for sub in ("llama", "gpt", "many"))


def test_a_long_list_of_names_is_counted_past_its_limit() -> None:
    names = [f"layer.{i}.weight" for i in range(70)]
    shown = " ".join(w.text for w in names_words(names, limit=64))
    assert shown.startswith("layer.0.weight, layer.1.weight,")
    assert shown.endswith("layer.63.weight, and 6 more (--format json lists every name)")
    assert " ".join(w.text for w in names_words(names[:2])) == "layer.0.weight, layer.1.weight"
