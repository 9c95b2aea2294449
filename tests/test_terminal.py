"""Terminal manners (issue 14): width, folded names, colour, errors once, plurals, the bare command,
global options after the command, ``python -m tieaudit`` and shell completion."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_text_width import too_wide

from tieaudit.cli.common import report_width, use_color
from tieaudit.cli.main import main
from tieaudit.core.escape import unforgeable_lines
from tieaudit.core.units import agree, plural
from tieaudit.report.plain import DEFAULT_WIDTH, MIN_WIDTH

LONG = ("encoder." + ".".join(f"layer_{i:03d}_block" for i in range(12)) + ".attention.output.dense.weight")[
    :150
]
NAMES = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight", LONG)
ESC = "\x1b["


@pytest.fixture
def long_names(tmp_path: Path) -> Path:
    """Three copies of one matrix under long names: a TIE001 finding naming all three, three tensors."""
    matrix = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    path = tmp_path / "long.safetensors"
    save_file({name: matrix.copy() for name in NAMES}, str(path))
    return path


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\xff" * 64)
    return path


def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def _run(args: list[str], **env: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        check=False,
    )


def _in_terminal(args: list[str], columns: int, **env: str | None) -> tuple[int, str]:
    """Run tieaudit with stdout and stderr on one pseudo-terminal `columns` wide; its exit code and
    everything it showed there (line ends as the terminal got them, \\r\\n made \\n)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "tieaudit", *args], stdout=follower, stderr=follower, env=_env(**env)
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=60), b"".join(chunks).decode().replace("\r\n", "\n")


def _whole(text: str, name: str) -> bool:
    """Whether name is in text whole, on one line (a report never breaks a name)."""
    return any(name in line for line in text.splitlines())


def _without_colour(text: str) -> str:

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.parametrize("width", [60, 200])
def test_inspect_fits_the_width_and_keeps_every_name_whole(
    long_names: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    report = tmp_path / "report.txt"
    monkeypatch.setenv("COLUMNS", str(width))  # COLUMNS applies to a file too
    assert main(["inspect", str(long_names), "-o", str(report)]) == 0
    text = report.read_text()
    assert "…" not in text and "..." not in text
    assert too_wide(text, width) == []
    for section in ("Findings", "Tensors (largest first)"):
        part = text.split(section, 1)[1]
        missing = [name for name in NAMES if not _whole(part, name)]
        assert missing == [], f"{section} at {width} columns:\n{part}"
    if width == 200:  # room enough: the tensors' table, each name on one line
        assert "┃ name" in text and all(f"│ {name} " in text for name in NAMES)
    else:  # the table cannot fit: one record per tensor, the name first
        assert "  bert.embeddings.word_embeddings.weight\n    dtype float32  shape 64x16" in text


def test_a_name_never_starts_a_line_with_a_workflow_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    names = ["::error::forged" + "a" * n for n in range(30, 60)]  # each may start a wrapped line
    path = tmp_path / "forge.safetensors"
    save_file({name: matrix.copy() for name in names}, str(path))
    report = tmp_path / "report.txt"
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["inspect", str(path), "-o", str(report)]) == 0
    text = report.read_text()
    assert [line for line in text.splitlines() if line.lstrip().startswith("::")] == []
    assert "·::" in text  # a name did start a line: the guard took the blank's place
    findings = text.split("Findings", 1)[1].split("Tensors", 1)[0]
    assert all(_whole(findings, name) for name in names)
    assert unforgeable_lines("  ::error::x\n::warning::y\nok ::z") == " ·::error::x\n·::warning::y\nok ::z"


def test_inspect_follows_the_real_terminal_width_and_colours_it(long_names: Path) -> None:
    code, shown = _in_terminal(["inspect", str(long_names)], 60)
    assert code == 0 and ESC in shown
    plain = _without_colour(shown)
    assert too_wide(plain, 60) == []
    assert "…" not in plain and all(_whole(plain.split("Tensors", 1)[1], name) for name in NAMES)
    code, shown = _in_terminal(["inspect", str(long_names)], 60, NO_COLOR="1")
    assert code == 0 and ESC not in shown and _without_colour(shown) == shown
    assert [line.rstrip() for line in shown.splitlines()] == [line.rstrip() for line in plain.splitlines()]


def test_check_lines_are_never_cut(long_names: Path) -> None:
    result = _run(["check", str(long_names)], COLUMNS="60")
    assert result.returncode == 1 and "…" not in result.stdout
    assert too_wide(result.stdout, 60) == []
    names = next(line for line in result.stdout.splitlines() if line.startswith("    names: "))
    assert names == f"    names: {NAMES[0]},"  # each name whole, the list wrapped between names
    assert all(_whole(result.stdout, name) for name in NAMES)
    (fix,) = [line for line in result.stdout.splitlines() if line.startswith("    fix: tieaudit retie ")]
    assert str(long_names) in fix  # the command whole on its line, however wide


def test_report_width_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert report_width("out.txt") == DEFAULT_WIDTH
    monkeypatch.setenv("COLUMNS", "77")
    assert report_width("out.txt") == 77 and report_width(None) == 77
    monkeypatch.setenv("COLUMNS", "12")
    assert report_width(None) == MIN_WIDTH
    monkeypatch.setenv("COLUMNS", "wide")
    assert report_width("out.txt") == DEFAULT_WIDTH


def test_no_color_and_force_color(long_names: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _run(["check", str(long_names)])
    assert plain.returncode == 1 and ESC not in plain.stdout  # a pipe: no colour
    forced = _run(["check", str(long_names)], FORCE_COLOR="1")
    assert forced.returncode == 1 and ESC in forced.stdout
    assert _without_colour(forced.stdout) == plain.stdout
    both = _run(["check", str(long_names)], FORCE_COLOR="1", NO_COLOR="1")
    assert ESC not in both.stdout  # NO_COLOR wins
    code, shown = _in_terminal(["check", str(long_names)], 100, NO_COLOR="1")
    assert code == 1 and ESC not in shown and "TIE001" in shown
    code, shown = _in_terminal(["check", str(long_names)], 100, NO_COLOR="")  # empty: not set
    assert code == 1 and ESC in shown
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert use_color(None) and not use_color("report.txt")  # an --output file never gets colour


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_error_during_check_is_shown_once(
    long_names: Path, broken: Path, tmp_path: Path, jobs: str
) -> None:
    args = ["check", str(long_names), str(broken), "--jobs", jobs]
    code, shown = _in_terminal(args, 200)
    assert code == 2
    assert shown.count("broken.safetensors") == 1, shown
    assert f"tieaudit: error: {broken}: " in shown and "1 error," in shown
    together = subprocess.run(  # 2>&1: one stream, one line per error
        [sys.executable, "-m", "tieaudit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        check=False,
    )
    assert together.returncode == 2 and together.stdout.count("broken.safetensors") == 1
    apart = _run(args)  # the report and stderr go to different places: each lists the error
    assert f"ERROR {broken}: " in apart.stdout
    assert apart.stderr.count("broken.safetensors") == 1
    report = tmp_path / "report.txt"
    assert _run([*args, "-o", str(report)]).returncode == 2
    assert f"ERROR {broken}: " in report.read_text()


def test_a_runtime_configuration_error_is_shown_once(tmp_path: Path) -> None:
    from test_runtime import FAST, tied_lm

    from tieaudit.runtime.probe import CRASH_ENV

    model = tied_lm(tmp_path / "m.onnx")
    together = subprocess.run(  # 2>&1: stderr's line is the one
        [sys.executable, "-m", "tieaudit", "runtime", str(model), *FAST],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(**{CRASH_ENV: "default"}),
        check=False,
    )
    assert together.returncode == 2 and together.stdout.count("onnxruntime crashed") == 1, together.stdout
    assert "Errors:" not in together.stdout
    apart = _run(["runtime", str(model), *FAST], **{CRASH_ENV: "default"})
    assert "Errors:" in apart.stdout and apart.stderr.count("onnxruntime crashed") == 1


def test_plural_forms() -> None:
    assert [plural(n, "error") for n in (0, 1, 2)] == ["0 errors", "1 error", "2 errors"]
    assert [plural(n, "copy") for n in (0, 1, 2)] == ["0 copies", "1 copy", "2 copies"]
    assert plural(1, "baseline entry") == "1 baseline entry"
    assert plural(3, "baseline entry") == "3 baseline entries"
    assert plural(2, "checkpoint") == "2 checkpoints" and plural(1, "checkpoint") == "1 checkpoint"
    assert plural(2, "key") == "2 keys" and plural(2, "class") == "2 classes"
    assert plural(2, "person", "people") == "2 people"
    assert [agree(n, "is") for n in (0, 1, 2)] == ["are", "is", "are"]


def test_counts_in_messages_agree(long_names: Path, broken: Path, tmp_path: Path) -> None:
    one = _run(["check", str(long_names), str(broken)])
    assert "tieaudit: 1 checkpoint, 1 failing, 1 error," in one.stderr
    two = _run(["check", str(long_names), str(broken), str(tmp_path / "gone.pt")])
    assert "tieaudit: 1 checkpoint, 1 failing, 2 errors," in two.stderr
    scalar = tmp_path / "one.safetensors"
    save_file({"w": np.zeros((4,), np.float32)}, str(scalar))
    inspected = _run(["inspect", str(scalar)], COLUMNS="300")  # the header line unbroken
    assert "1 tensor in 1 storage," in inspected.stdout
    checked = _run(["check", str(scalar)])
    assert "(safetensors, 1 tensor, 16 B)" in " ".join(checked.stdout.split())  # a long path wraps


def test_bare_tieaudit_is_one_usage_line_and_exit_2() -> None:
    result = _run([])
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: missing command: one of check,")
    assert all(command in lines[0] for command in ("check", "export", "inspect", "retie", "runtime"))
    assert "tieaudit --help" in lines[0]


def test_debug_after_the_command(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pt")
    for args in (["inspect", missing, "--debug"], ["--debug", "inspect", missing]):
        result = _run(args)
        assert result.returncode == 2 and "Traceback" in result.stderr, args
        assert result.stderr.strip().splitlines()[-1] == f"tieaudit: error: {missing}: no such file or folder"
    quiet = _run(["inspect", missing])
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    accepted = _run(["check", missing, "--debug"])  # an option of every command, not a usage error
    assert accepted.returncode == 2 and "no such option" not in accepted.stderr
    assert "--version" not in _run(["check", "--help"]).stdout  # --version stays on the group


def test_python_dash_m_tieaudit() -> None:
    result = _run(["--help"])
    assert result.returncode == 0 and result.stdout.startswith("Usage: tieaudit [OPTIONS] COMMAND")
    assert "__main__" not in result.stdout
    assert _run(["check", "--help"]).stdout.startswith("Usage: tieaudit check [OPTIONS] [PATHS]...")
    version = _run(["--version"])
    assert version.returncode == 0 and version.stdout.startswith("tieaudit, version ")


def test_shell_completion() -> None:
    source = _run([], _TIEAUDIT_COMPLETE="bash_source")
    assert source.returncode == 0 and "_tieaudit_completion()" in source.stdout
    assert "complete -o nosort -F _tieaudit_completion tieaudit" in source.stdout
    for shell in ("zsh", "fish"):
        assert _run([], _TIEAUDIT_COMPLETE=f"{shell}_source").stdout.strip()
    command = _run([], _TIEAUDIT_COMPLETE="bash_complete", COMP_WORDS="tieaudit ch", COMP_CWORD="1")
    assert command.stdout.split() == ["plain,check"]
    option = _run([], _TIEAUDIT_COMPLETE="bash_complete", COMP_WORDS="tieaudit check x --de", COMP_CWORD="3")
    assert option.stdout.split() == ["plain,--debug"]
