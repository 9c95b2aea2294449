"""Nothing from a file reaches a terminal or a CI log raw; reports go where -o says, as -o says.

The checkpoints of fixtures/hostile/cases_output.py carry tensor names with newlines, ESC
sequences, GitHub workflow commands, rich markup and bidi overrides. Every command's stdout and
stderr must show them escaped: no control or format character except the newline that ends a line,
and no line the checkpoint wrote (``::error``) at the start of a line.
"""

from __future__ import annotations

import os
import select
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tieaudit.core.escape import printable

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "fixtures" / "hostile"
EVIL_FILES = ("out_evil_names.safetensors", "out_evil_names.pt", "out_evil_names.onnx")


def _run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tieaudit", *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=120,
        check=False,
    )


def _raw_characters(text: str) -> list[str]:
    """Characters a terminal or log would act on: anything unprintable but the line feed."""
    return sorted({repr(c) for c in text if c != "\n" and not c.isprintable()})


def _assert_clean(text: str) -> None:
    assert _raw_characters(text) == [], text
    forged = [line for line in text.splitlines() if line.lstrip("│ ").startswith("::")]
    assert forged == [], forged


def test_printable_escapes_what_terminals_act_on() -> None:
    assert printable("plain name.weight") == "plain name.weight"
    assert printable("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert printable("\x1b[31m\x00\x7f") == "\\x1b[31m\\x00\\x7f"
    assert printable("rtl\u202eabc\u2028") == "rtl\\u202eabc\\u2028"
    assert printable("back\\slash") == "back\\slash"  # kept: a repr in a message is not escaped twice
    assert printable(os.fsdecode(b"caf\xe9")) == "caf\\xe9"  # a byte that was not UTF-8
    assert printable("é 中 \U0001f600") == "é 中 \U0001f600"


@pytest.mark.parametrize("name", EVIL_FILES)
@pytest.mark.parametrize(
    "args",
    [
        ("inspect",),
        ("check",),
        ("check", "--format", "sarif"),
        ("retie", "--dry-run"),
        ("inspect", "--format", "dot"),
    ],
    ids=lambda args: "-".join(args),
)
def test_names_from_the_file_are_escaped(name: str, args: tuple[str, ...]) -> None:
    done = _run(*args, str(HOSTILE / name))
    assert done.returncode in (0, 1), done.stderr
    _assert_clean(done.stdout)
    _assert_clean(done.stderr)
    assert "Traceback" not in done.stderr


def test_text_report_shows_the_escaped_name_whole() -> None:
    done = _run("check", str(HOSTILE / "out_evil_names.pt"))
    assert "emb\\n::error file=model.pt::forged by the checkpoint" in done.stdout
    assert "[bold red]markup[/bold red] [/]" in done.stdout  # shown as text, not read as markup


def test_an_error_naming_a_hostile_file_name_is_one_escaped_line(tmp_path: Path) -> None:
    evil = tmp_path / "bad\n::error file=x::forged\x1b[0m.pt"
    evil.write_bytes(b"")
    for command in ("inspect", "check"):
        done = _run(command, str(evil))
        assert done.returncode == 2
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert "bad\\n::error file=x::forged\\x1b[0m.pt" in done.stderr
        _assert_clean(done.stderr)


def test_a_file_name_that_is_not_utf8_is_reported_not_a_crash(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    save_file({"w": np.ones((4, 4), np.float32)}, os.fsdecode(bytes(folder) + b"/caf\xe9.safetensors"))
    done = _run("check", str(folder))
    assert done.returncode == 0, done.stderr
    assert "caf\\xe9.safetensors" in done.stdout
    _assert_clean(done.stdout + done.stderr)


def test_no_python_warnings_on_stderr(tmp_path: Path) -> None:
    # A float32 tensor beyond float16's range, beside a float16 tensor of its shape: the cast
    # comparison overflows, which numpy would report as a RuntimeWarning line.
    big = np.full((64, 64), 1e10, np.float32)
    half = np.ones((64, 64), np.float16)
    nan = np.full((64, 64), np.nan, np.float64)
    save_file({"a": big, "b": half, "c": nan}, str(tmp_path / "cast.safetensors"))
    done = _run("check", str(tmp_path / "cast.safetensors"), env={"PYTHONWARNINGS": "default"})
    assert done.returncode == 0
    assert done.stderr == "tieaudit: 1 checkpoint, 0 failing, 0 errors, 0 B wasted\n"  # no warning line


# --- -o: files, devices, pipes, stdout ---------------------------------------------------------


def test_output_to_a_character_device_writes_into_it() -> None:
    # A terminal's device (a pty made here, so a regression cannot replace /dev/null itself).
    master, slave = os.openpty()
    device = os.ttyname(slave)
    before = os.stat(device)
    try:
        done = _run("inspect", str(HOSTILE / "out_evil_names.safetensors"), "-f", "json", "-o", device)
        assert done.returncode == 0, done.stderr
        after = os.stat(device)
        assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
        received = b""
        while b"tieaudit.report/1" not in received and select.select([master], [], [], 10)[0]:
            received += os.read(master, 65536)
        assert b"tieaudit.report/1" in received
    finally:
        os.close(master)
        os.close(slave)


def test_output_dash_is_stdout() -> None:
    done = _run("check", str(HOSTILE / "out_evil_names.safetensors"), "--format", "json", "-o", "-")
    assert done.returncode == 1
    assert done.stdout.startswith("{") and '"schema": "tieaudit.report/1"' in done.stdout
    assert not Path("-").exists()


def test_output_to_a_fifo_is_written_into_the_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = _run("check", str(HOSTILE / "out_evil_names.safetensors"), "--format", "json", "-o", str(fifo))
    reader.join(timeout=10)
    if reader.is_alive():  # nothing was written into the pipe: release the reader before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert done.returncode == 1, done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received and received[0].startswith(b"{")


def test_output_through_a_link_to_dev_stdout(tmp_path: Path) -> None:
    link = tmp_path / "out"
    link.symlink_to("/dev/stdout")
    done = _run("inspect", str(HOSTILE / "out_evil_names.safetensors"), "--format", "json", "-o", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and '"schema": "tieaudit.report/1"' in done.stdout


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_a_new_report_file_gets_the_umask_mode(tmp_path: Path, umask: int) -> None:
    target = tmp_path / f"report-{umask:o}.json"
    program = (
        f"import os, sys; os.umask({umask}); from tieaudit.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    args = ["inspect", str(HOSTILE / "out_evil_names.safetensors"), "-f", "json", "-o", str(target)]
    done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_a_replaced_report_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    target.chmod(0o640)
    done = _run("inspect", str(HOSTILE / "out_evil_names.safetensors"), "-f", "json", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_text().startswith("{")


def test_runtime_report_escapes_initializer_names(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, save

    evil = "emb\n::error file=m.onnx::forged\x1b[31m"
    table = helper.make_tensor(
        evil, TensorProto.FLOAT, [64, 16], np.arange(1024, dtype=np.float32).tobytes(), raw=True
    )
    nodes = [
        helper.make_node("Gather", [evil, "ids"], ["h"]),
        helper.make_node("Transpose", [evil], ["t"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "t"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2, 64])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    save(model, str(tmp_path / "tied.onnx"))
    done = _run("runtime", str(tmp_path / "tied.onnx"))
    assert done.returncode in (0, 1), done.stderr
    assert "emb\\n::error file=m.onnx::forged\\x1b[31m" in done.stdout  # the shared initializer, named
    _assert_clean(done.stdout)
    _assert_clean(done.stderr)


def test_another_kind_of_file_named_safetensors_is_said_to_be_no_safetensors_file(tmp_path: Path) -> None:
    """A PNG (or any file whose first 8 bytes make an impossible header length and whose 9th cannot
    start JSON) is named as not a safetensors file, its first bytes shown escaped, not as a header
    length of 7e17 bytes; a real header too long for the file is still told as that."""
    image = tmp_path / "photo.safetensors"
    image.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64))
    done = _run("check", str(image))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "not a safetensors file" in done.stderr and "b'\\x89PNG\\r\\n\\x1a\\n'" in done.stderr
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes((1000).to_bytes(8, "little") + b'{"a": 1}')
    done = _run("check", str(cut))
    assert done.returncode == 2 and "runs past the end of the 16-byte file" in done.stderr, done.stderr
