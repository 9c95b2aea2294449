"""Ctrl-C (SIGINT to the whole process group, as a terminal sends it) and SIGTERM at the moments of a
run: start-up, while check's worker processes audit, while they are forked, while inspect, retie
and convert read their input. Every moment: exit 130 (143), the one line, nothing on stdout, no
process of the run left, no file left. The signals are aimed at synchronisation points (the guard
in /proc's SigCgt, a worker or the process mapping a checkpoint, a fork callback), never timed.

What this found: a signal during the pool's fork ran the process guard in fork's callbacks (and in
the forked worker, before it set its own), where the Interrupted was lost; raising it again from
the unraisable hook lost it again ("Exception ignored in sys.unraisablehook"), so the run went on
to print its whole report; a worker that had caught the signal then swallowed the SIGTERM the
pool's shutdown sends, and the process hung joining it. SIGTERM to the group printed each
worker's traceback, and a worker killed half-way through sending a result hung the pool's reader.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_trust2_interrupts import _guarded

ROOT = Path(__file__).resolve().parent.parent
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
ROWS, COLS = 4096, 2048
"""Two equal float32 matrices of 32 MiB per checkpoint: an audit maps it for a fraction of a second."""
ATTEMPTS = 5
BOUND_S = 120
"""A run that has not ended by then hangs: the test fails instead of waiting for ever."""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four checkpoints, each with an untied copy, for two workers to audit."""
    folder = tmp_path_factory.mktemp("models")
    matrix = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    for index in range(4):
        save_file({"emb.weight": matrix, "head.weight": matrix.copy()}, str(folder / f"m{index}.safetensors"))
    return folder


@pytest.fixture(scope="module")
def uneven(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A large checkpoint and a small one: two tasks, and the worker given the small one waits for
    the next task (in the pool's queue, not in an audit) while the other audits."""
    folder = tmp_path_factory.mktemp("uneven")
    os.link(models / "m0.safetensors", folder / "large.safetensors")
    matrix = np.ones((64, 64), np.float32)
    save_file({"emb.weight": matrix, "head.weight": matrix.copy()}, str(folder / "small.safetensors"))
    return folder


def _as_typed_at_a_terminal() -> None:
    """The child starts with SIGINT at its default, as a command typed at a terminal does: a test run
    launched in the background of a non-interactive shell (`make test &`, nohup) has SIGINT ignored,
    children inherit that, and Python then rightly leaves it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(args: list[str], cwd: Path | None = None) -> subprocess.Popen[str]:
    """This Python with args, in a session of its own (its group takes the signals), SIGINT default."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_typed_at_a_terminal,
    )


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _maps_a_checkpoint(pid: int, folder: Path) -> bool:
    """pid has one of folder's checkpoints mapped: it is reading it."""
    try:
        return f"{folder}{os.sep}" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _in_group(pgid: int) -> list[int]:
    """Live processes of the process group (zombies are ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _run(
    argv: list[str],
    cwd: Path,
    ready: Callable[[int], bool],
    signals: list[signal.Signals],
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """`tieaudit ARGV` in a session of its own; once ready(pid) holds, each signal is sent to its
    process group (as a terminal's Ctrl-C is). Whether ready held before the run ended, and the run."""
    child = _spawn(["-m", "tieaudit", *argv], cwd=cwd)
    try:
        while child.poll() is None and not ready(child.pid):
            time.sleep(0.0005)
        aimed = child.poll() is None
        for number in signals:
            if child.poll() is None:
                os.killpg(child.pid, number)
        out, err = child.communicate(timeout=BOUND_S)
        deadline = time.monotonic() + BOUND_S
        while _in_group(child.pid) and time.monotonic() < deadline:  # a bound, not a measurement
            time.sleep(0.001)
    finally:
        left = _in_group(child.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
    assert not left, f"processes of the run left behind: {left}"
    return subprocess.CompletedProcess(child.args, child.returncode, out, err), aimed


def _run_at(
    argv: list[str], cwd: Path, ready: Callable[[int], bool], signals: list[signal.Signals]
) -> subprocess.CompletedProcess[str]:
    """_run until a run is still going when its moment comes (a run may finish first: the moment
    is a state to catch, not a time), at most ATTEMPTS runs; then that run. What a run that
    finished wrote in cwd is removed before the next one."""
    before = {p.name for p in cwd.iterdir()}
    for _ in range(ATTEMPTS):
        for made in [p for p in cwd.iterdir() if p.name not in before]:
            shutil.rmtree(made) if made.is_dir() else made.unlink()
        done, aimed = _run(argv, cwd, ready, signals)
        if aimed:
            return done
    raise AssertionError(f"in {ATTEMPTS} runs of {argv}, none was still going when its moment came")


def _assert_interrupted(done: subprocess.CompletedProcess[str], signals: list[signal.Signals]) -> None:
    ended = next((s for s in signals if done.returncode == EXIT[s]), None)
    assert ended is not None, (done.returncode, done.stderr[-3000:])
    assert done.stderr.splitlines() == [
        f"tieaudit: interrupted by {ended.name}; nothing half-written was left"
    ], done.stderr[-3000:]


def _workers_audit(folder: Path) -> Callable[[int], bool]:
    """Ready when a worker process of the run maps one of folder's checkpoints."""
    return lambda pid: any(_maps_a_checkpoint(worker, folder) for worker in _children(pid))


def _waits_for_a_task(pid: int) -> bool:
    """pid sleeps reading a pipe (the pool's task queue), mapping no checkpoint."""
    try:
        return "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def _one_worker_waits(folder: Path) -> Callable[[int], bool]:
    """Ready when one worker audits (maps a checkpoint) and the other waits for a task that will
    not come (both tasks were queued before the workers started: it has done its own)."""

    def ready(pid: int) -> bool:
        workers = _children(pid)
        auditing = [w for w in workers if _maps_a_checkpoint(w, folder)]
        return len(workers) == 2 and len(auditing) == 1 and any(_waits_for_a_task(w) for w in workers)

    return ready


CHECK_MOMENTS = [
    ("SIGINT-at-start-up", [signal.SIGINT], "start"),
    ("SIGTERM-at-start-up", [signal.SIGTERM], "start"),
    ("SIGINT-while-workers-audit", [signal.SIGINT], "workers"),
    ("SIGINT-twice-while-workers-audit", [signal.SIGINT, signal.SIGINT], "workers"),
    ("SIGTERM-while-workers-audit", [signal.SIGTERM], "workers"),
    ("SIGTERM-then-SIGINT-while-workers-audit", [signal.SIGTERM, signal.SIGINT], "workers"),
]


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT]], ids=["SIGTERM", "SIGINT"])
def test_a_worker_between_tasks_ends_quietly(uneven: Path, signals: list[signal.Signals]) -> None:
    """Sent to the group, the signal reaches a worker waiting for its next task too: it ends
    without a traceback (the parent's guard, inherited, raised there)."""
    done = _run_at(["check", ".", "--jobs", "2"], uneven, _one_worker_waits(uneven), signals)
    _assert_interrupted(done, signals)
    assert done.stdout == ""


@pytest.mark.parametrize(("moment", "signals", "when"), CHECK_MOMENTS, ids=[m[0] for m in CHECK_MOMENTS])
def test_check_with_worker_processes_ends_interrupted_at_every_moment(
    models: Path, moment: str, signals: list[signal.Signals], when: str
) -> None:
    ready = _guarded if when == "start" else _workers_audit(models)
    done = _run_at(["check", ".", "--jobs", "2"], models, ready, signals)
    _assert_interrupted(done, signals)
    assert done.stdout == ""  # interrupted before the report


FORK_DRIVER = """
import os, signal, sys
# Ctrl-C while the pool forks its workers: the signal arrives in fork's callbacks, in the parent
# and in each worker, before the worker has set its own handlers.
os.register_at_fork(
    after_in_parent=lambda: signal.raise_signal(signal.SIGINT),
    after_in_child=lambda: signal.raise_signal(signal.SIGINT),
)
from tieaudit.cli.launch import main
sys.exit(main(["check", sys.argv[1], "--jobs", "2"]))
"""


def test_a_signal_while_the_workers_are_forked_ends_the_run(models: Path) -> None:
    child = _spawn(["-c", FORK_DRIVER, str(models)])
    try:
        out, err = child.communicate(timeout=BOUND_S)
    finally:
        for pid in _in_group(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
    _assert_interrupted(subprocess.CompletedProcess(child.args, child.returncode, out, err), [signal.SIGINT])
    assert out == ""


@pytest.mark.parametrize(
    ("argv", "signals"),
    [
        (["inspect", "m0.safetensors"], [signal.SIGINT]),
        (["retie", "m0.safetensors", "out.safetensors", "--all-equal"], [signal.SIGINT]),
        (["retie", "m0.safetensors", "out.safetensors", "--all-equal"], [signal.SIGTERM, signal.SIGINT]),
        (["convert", "m0.safetensors", "out.pt"], [signal.SIGTERM]),
    ],
    ids=["inspect-SIGINT", "retie-SIGINT", "retie-SIGTERM-then-SIGINT", "convert-SIGTERM"],
)
@pytest.mark.parametrize("when", ["start-up", "reading"])
def test_inspect_retie_and_convert_end_interrupted_at_start_up_and_while_reading(
    models: Path, tmp_path: Path, argv: list[str], signals: list[signal.Signals], when: str
) -> None:
    os.link(models / "m0.safetensors", tmp_path / "m0.safetensors")  # the same bytes, in a folder of its own
    ready = _guarded if when == "start-up" else (lambda pid: _maps_a_checkpoint(pid, tmp_path))
    done = _run_at(argv, tmp_path, ready, signals)
    _assert_interrupted(done, signals)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m0.safetensors"]  # no OUT, no stage


UNRAISABLE_DRIVER = """
import signal, threading
from tieaudit.core.interrupts import Interrupted, guard_process
guard_process()
class Finalized:
    def __del__(self):  # the signal arrives here, where an exception cannot propagate
        signal.raise_signal(signal.SIGINT)
try:
    Finalized()
    threading.Event().wait(60)  # the run goes on: the Interrupted must land here
    print("not interrupted")
except Interrupted as exc:
    print("interrupted", exc.signum)
"""


def test_an_interrupted_lost_in_a_finalizer_lands_in_the_run_and_prints_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNRAISABLE_DRIVER],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        preexec_fn=_as_typed_at_a_terminal,
    )
    assert (done.stdout, done.stderr) == (f"interrupted {int(signal.SIGINT)}\n", "")
