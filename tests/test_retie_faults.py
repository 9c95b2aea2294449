"""retie under faults: the disk fills up, or the process is killed at a random moment.

Whatever happens, IN keeps its bytes (hash), and OUT is either absent or complete and verifying:
never a partial file. A full disk is an error line and exit 2, with no staging folder left.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tieaudit.cli.main import main
from tieaudit.formats import open_checkpoint

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
BIG_ROWS, COLS = 4096, 1024
"""The kill test's input: two 16 MiB float32 matrices, one a copy of the other (32 MiB)."""


def _clone_checkpoint(path: Path, rows: int, cols: int = 256) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    tensors = {
        EMBED: rng.standard_normal((rows, cols)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(cols).astype(np.float32),
    }
    tensors[HEAD] = tensors[EMBED].copy()
    save_file(tensors, str(path), metadata={HEAD: EMBED})  # the record: retie's default re-ties it
    return tensors


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _assert_complete(out: Path, expected: dict[str, np.ndarray]) -> None:
    """OUT reads back whole, and every original name (the dropped copy through its record) is exact."""
    from tieaudit.repair.restore import restored_array, sources

    with open_checkpoint(str(out)) as written:
        provided = sources(written.checkpoint)
        assert set(provided) == set(expected)
        for name, values in expected.items():
            assert np.array_equal(restored_array(written, provided[name]), values), name


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tieaudit: error: ") and "Traceback" not in stderr, stderr
    return lines[0]


# --- disk full ---------------------------------------------------------------------------------


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_after(budget: int) -> tuple[Callable[..., int], Callable[..., int]]:
    """pwrite and copy_file_range that write real bytes until budget bytes are out, then ENOSPC."""
    real_pwrite, real_copy = os.pwrite, os.copy_file_range
    left = [budget]

    def take(count: int) -> int:
        if left[0] <= 0:
            raise _enospc()
        granted = min(count, left[0])
        left[0] -= granted
        return granted

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        return real_pwrite(fd, memoryview(data)[: take(len(data))], offset)

    def copy_file_range(
        src: int, dst: int, count: int, offset_src: int | None = None, offset_dst: int | None = None
    ) -> int:
        return real_copy(src, dst, take(count), offset_src, offset_dst)

    return pwrite, copy_file_range


@pytest.mark.parametrize("budget", [0, 4096, 300_000], ids=["at-once", "after-header", "mid-tensor"])
def test_disk_full_leaves_no_output_and_one_line(
    budget: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    _clone_checkpoint(source, rows=1024)
    before = _sha256(source)
    pwrite, copy_file_range = _full_after(budget)
    # st_stream writes with os.pwrite; bytestore copies with os.copy_file_range (both this os module).
    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    assert main(["retie", str(source), str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "out.safetensors" in line and "No space left on device" in line
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]  # no OUT, no staging folder
    assert _sha256(source) == before


def test_report_output_on_a_full_disk_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.safetensors"
    _clone_checkpoint(source, rows=64)

    def fsync(fd: int) -> None:
        raise _enospc()

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["inspect", str(source), "--output", str(tmp_path / "report.json")]) == 2
    assert "No space left on device" in _one_error_line(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB file system (tmpfs), where the kernel itself answers ENOSPC."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_on_a_real_small_tmpfs(small_tmpfs: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.safetensors"
    _clone_checkpoint(source, rows=2048)  # 2 MiB of kept matrix: twice what the tmpfs holds
    before = _sha256(source)
    out = small_tmpfs / "out.safetensors"
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", "retie", str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "No space left on device" in _one_error_line(done.stderr)
    assert os.listdir(small_tmpfs) == []  # no OUT, no staging folder
    assert _sha256(source) == before


# --- kill -9 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], str]:
    folder = tmp_path_factory.mktemp("kill")
    source = folder / "in.safetensors"
    expected = _clone_checkpoint(source, rows=BIG_ROWS, cols=COLS)
    return source, expected, _sha256(source)


def _retie(source: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tieaudit", "retie", str(source), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@dataclass(frozen=True)
class Phases:
    """When, in an uninterrupted run, the staging folder appears, OUT appears, and the run ends."""

    staging: float
    published: float
    ended: float


@pytest.fixture(scope="module")
def phases(
    big_clone: tuple[Path, dict[str, np.ndarray], str], tmp_path_factory: pytest.TempPathFactory
) -> Phases:
    """One uninterrupted retie of the big input, its folder polled every millisecond."""
    source, expected, _ = big_clone
    folder = tmp_path_factory.mktemp("calibrate")
    out = folder / "out.safetensors"
    start = time.monotonic()
    process = _retie(source, out)
    staging = published = None
    while process.poll() is None:
        now = time.monotonic() - start
        entries = os.listdir(folder)
        if staging is None and any(e.startswith(".out.safetensors.tieaudit-stage-") for e in entries):
            staging = now
        if published is None and "out.safetensors" in entries:
            published = now
        time.sleep(0.001)
    ended = time.monotonic() - start
    assert process.returncode == 0, process.stderr.read().decode() if process.stderr else ""
    _assert_complete(out, expected)
    staging = ended * 0.5 if staging is None else staging
    return Phases(staging, ended if published is None else published, ended)


SEEDS = list(range(10))


def _kill_time(seed: int, phases: Phases) -> float:
    """Most kills while the output is being written, verified, fsynced and renamed; some anywhere."""
    rng = random.Random(seed)
    if seed % 5 == 0:
        return rng.uniform(0.0, phases.ended * 1.1)
    if seed % 5 == 1:
        return rng.uniform(phases.published - 0.02, phases.published + 0.02)  # around the rename
    return rng.uniform(phases.staging, phases.published)


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_9_never_leaves_a_partial_output(
    seed: int, big_clone: tuple[Path, dict[str, np.ndarray], str], phases: Phases, tmp_path: Path
) -> None:
    source, expected, source_hash = big_clone
    out = tmp_path / "out.safetensors"
    process = _retie(source, out)
    time.sleep(max(0.0, _kill_time(seed, phases)))
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)

    assert _sha256(source) == source_hash
    if out.exists():  # killed after the rename: it must be the whole, verified output
        _assert_complete(out, expected)
    leftovers = sorted(set(os.listdir(tmp_path)) - {"out.safetensors"})
    assert all(entry.startswith(".out.safetensors.tieaudit-stage-") for entry in leftovers), leftovers
    if not out.exists():
        # The next run removes the dead run's staging folder and writes a complete OUT.
        rerun = _retie(source, out)
        _, stderr = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, stderr.decode()
        _assert_complete(out, expected)
        assert os.listdir(tmp_path) == ["out.safetensors"]
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_short_writes_are_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disk close to full accepts part of a write; the rest must be written, not skipped."""
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    expected = _clone_checkpoint(source, rows=512)
    real_pwrite = os.pwrite

    def short_pwrite(fd: int, data: bytes, offset: int) -> int:
        return real_pwrite(fd, memoryview(data)[:1000], offset)

    def no_copy_file_range(*args: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))  # not supported here: chunked writes

    monkeypatch.setattr(os, "pwrite", short_pwrite)
    monkeypatch.setattr(os, "copy_file_range", no_copy_file_range)
    assert main(["retie", str(source), str(out)]) == 0, capsys.readouterr().err
    _assert_complete(out, expected)


# --- SIGTERM and SIGINT ------------------------------------------------------------------------

SLOWED = textwrap.dedent(
    """
    import shutil, signal, sys, time
    import tieaudit.repair.st_stream as st
    import tieaudit.repair.verify as verify

    moment, told = sys.argv[1], []
    real_write, real_problem = st.write_tensor, verify._problem

    def tell(now):
        if now == moment and not told:
            told.append(now)
            print(now, flush=True)
        if now == moment:
            time.sleep(0.3)  # each tensor takes a while: the signal lands in the middle

    def slow_write(fd, offset, opened, *, tensor):
        tell("writing")
        return real_write(fd, offset, opened, tensor=tensor)

    def slow_problem(*args, **kwargs):
        tell("verifying")
        return real_problem(*args, **kwargs)

    real_rmtree = shutil.rmtree

    def slow_rmtree(*args, **kwargs):
        time.sleep(0.3)  # a big stage on a slow disk: removing it takes a while
        return real_rmtree(*args, **kwargs)

    st.write_tensor, verify._problem, shutil.rmtree = slow_write, slow_problem, slow_rmtree
    # As in a terminal: a shell's background job (a CI step run with &) starts its children with
    # SIGINT ignored, and tieaudit keeps an ignored signal ignored (core.interrupts).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tieaudit.cli.launch import main as launched  # the tieaudit process: its signal guard first

    sys.exit(launched(["retie", sys.argv[2], sys.argv[3]]))
    """
)


def _signal(child: subprocess.Popen[str], how: str) -> None:
    """SIGTERM once; or SIGINT, sent again every few milliseconds until the process ends (Ctrl-C
    pressed again while the first one is handled: cleanup must not be cut short by it)."""
    number = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
    child.send_signal(number)
    while how == "SIGINT-repeated" and child.poll() is None:
        time.sleep(0.002)
        child.send_signal(number)
    child.wait(timeout=60)


def _assert_interrupted(child: subprocess.Popen[str], how: str, folder: Path, source_hash: str) -> None:
    stderr = child.stderr.read() if child.stderr else ""
    number = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT
    assert child.returncode == 128 + number, stderr  # 143 or 130, as a shell reports a run a signal ended
    assert stderr.splitlines() == [f"tieaudit: interrupted by {number.name}; nothing half-written was left"]
    assert os.listdir(folder) == ["in.safetensors"]  # no stage, no OUT
    assert _sha256(folder / "in.safetensors") == source_hash


@pytest.mark.parametrize("moment", ["writing", "verifying"])
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT-repeated"])
def test_signals_remove_the_stage(how: str, moment: str, tmp_path: Path) -> None:
    """A real retie in a child process, slowed down so that the signal lands while it writes (or
    verifies) the staged output, and so that removing the stage takes a while: a repeated SIGINT
    must not cut the removal short."""
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    _clone_checkpoint(source, rows=2048)
    before = _sha256(source)
    child = subprocess.Popen(
        [sys.executable, "-c", SLOWED, moment, str(source), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == moment
        assert [e for e in os.listdir(tmp_path) if ".tieaudit-stage-" in e]  # the stage exists now
        _signal(child, how)
    finally:
        child.kill()
        child.wait()
    _assert_interrupted(child, how, tmp_path, before)


def test_sigterm_during_real_verification_removes_the_stage(tmp_path: Path) -> None:
    """No seam: SIGTERM lands as soon as the child has mapped its staged output, i.e. while two
    threads compare it with the input. Handling it must not unmap what they still read (a
    segfault), nor leave the stage."""
    how = "SIGTERM"
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/PID/maps to see when verification starts")
    source, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    _clone_checkpoint(source, rows=16384, cols=1024)  # 2 x 64 MiB: verification takes a while
    before = _sha256(source)
    child = subprocess.Popen(
        [sys.executable, "-m", "tieaudit", "retie", str(source), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while child.poll() is None:
            try:
                maps = Path(f"/proc/{child.pid}/maps").read_text()
            except OSError:
                maps = ""
            if ".tieaudit-stage-" in maps:
                break
            time.sleep(0.0005)
        assert child.poll() is None, "the run ended before its verification was seen"
        _signal(child, how)
    finally:
        child.kill()
        child.wait()
    _assert_interrupted(child, how, tmp_path, before)
