"""Issue 23, point 7: interrupts and odd arguments.

- SIGINT or SIGTERM at any moment of a .pt write (convert safetensors -> .pt and retie .pt -> .pt,
  both through torch.save), start-up included, several in a row: one line, exit 130 or 143, IN
  intact, nothing left beside it (no OUT, no stage); never exit 3, never a traceback. The signals
  are aimed, not timed: at moments after the process guard is installed (its SigCgt in /proc),
  and at fractions of the staged output torch.save has written.
- ``--executor dask://`` with a malformed address and ``--connect-timeout`` that is no finite
  number of seconds: one line, exit 2, before any name lookup or connection, and no "Exception
  ignored" afterwards.
- retie and convert of a file whose pickle runs code (TIE010) say so on their first line.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
TIEAUDIT = Path(sys.executable).parent / "tieaudit"
"""The console script: the process a user starts, with its start-up."""
ROWS, COLS = 16384, 1024
"""Two float32 matrices of 64 MiB: torch.save writes 128 MiB, a second or two."""
INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}
OUTPUT_BYTES = {"convert": 2 * ROWS * COLS * 4, "retie": ROWS * COLS * 4}
"""What torch.save writes: convert both matrices, retie the kept one."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same untied pair as safetensors (for convert to .pt) and as .pt (for retie to .pt)."""
    import torch

    folder = tmp_path_factory.mktemp("inputs")
    matrix = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    save_file({"emb.weight": matrix, "head.weight": matrix.copy()}, str(folder / "in.safetensors"))
    torch.save(
        {"emb.weight": torch.from_numpy(matrix), "head.weight": torch.from_numpy(matrix.copy())},
        folder / "in.pt",
    )
    return {"convert": folder / "in.safetensors", "retie": folder / "in.pt"}


def _guarded(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (Python sets none of its own: tieaudit's guard)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _staged_bytes(folder: Path) -> int:
    """Bytes torch.save has written to the staged output so far (0 before the stage exists)."""
    sizes = [0]
    with contextlib.suppress(OSError):  # the stage may vanish between listing and stat
        sizes += [
            entry.stat().st_size for stage in folder.glob(".*.tieaudit-stage-*") for entry in stage.iterdir()
        ]
    return max(sizes)


def _interrupt(
    command: str,
    source: Path,
    folder: Path,
    signals: list[signal.Signals],
    *,
    after: float = 0.0,
    staged: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `tieaudit COMMAND IN OUT.pt` in folder; once its signal guard is installed, wait after
    seconds, or until staged (a fraction) of the output is written; then send signals, 2 ms apart."""
    total = OUTPUT_BYTES[command]
    local = folder / source.name
    local.write_bytes(source.read_bytes())
    child = subprocess.Popen(
        [str(TIEAUDIT), command, local.name, "out.pt"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while child.poll() is None and not _guarded(child.pid):
            time.sleep(0.0005)
        if staged is not None:
            while child.poll() is None and _staged_bytes(folder) < staged * total:
                time.sleep(0.0005)
        else:
            time.sleep(after)
        for number in signals:
            if child.poll() is None:
                child.send_signal(number)
                time.sleep(0.002)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def _assert_ended_whole(
    done: subprocess.CompletedProcess[str], sent: list[signal.Signals], folder: Path, before: str
) -> None:
    """One line and 128 + a signal sent (several pending at once are handled in signal-number
    order, not in arrival order: Python's), or (the signal came after the run) exit 0 and a whole
    OUT; either way IN unchanged and nothing else beside it."""
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    name = next(p.name for p in folder.iterdir() if p.name.startswith("in."))
    left = sorted(p.name for p in folder.iterdir())
    if done.returncode == 0:  # finished before the signal: OUT whole (its write was verified)
        assert left == sorted([name, "out.pt"]), left
    else:
        ended = next((s for s in sent if done.returncode == INTERRUPTED[s]), None)
        assert ended is not None, (done.returncode, done.stderr)
        assert done.stderr.splitlines() == [
            f"tieaudit: interrupted by {ended.name}; nothing half-written was left"
        ], done.stderr
        assert left == [name], left
    assert _sha256(folder / name) == before


MOMENTS = [
    # start-up: the guard is in, click, rich, tieaudit, torch being imported, the input being read
    ("SIGINT-at-start", [signal.SIGINT], {"after": 0.0}),
    ("SIGTERM-at-start", [signal.SIGTERM], {"after": 0.0}),
    ("SIGTERM-while-importing-torch", [signal.SIGTERM], {"after": 0.6}),
    # inside torch.save: a fraction of the staged output written
    ("SIGINT-in-torch-save-early", [signal.SIGINT], {"staged": 0.05}),
    ("SIGTERM-in-torch-save-middle", [signal.SIGTERM], {"staged": 0.5}),
    ("SIGINT-in-torch-save-late", [signal.SIGINT], {"staged": 0.95}),
    # several in a row: Ctrl-C pressed again and again, and SIGTERM then Ctrl-C
    ("SIGINT-five-times-in-torch-save", [signal.SIGINT] * 5, {"staged": 0.3}),
    ("SIGTERM-then-SIGINT-in-torch-save", [signal.SIGTERM, signal.SIGINT, signal.SIGTERM], {"staged": 0.7}),
]


RETIE_MOMENTS = [MOMENTS[4], MOMENTS[6]]
"""retie .pt -> .pt goes through the same guard and torch.save; fewer moments keep the run short."""


@pytest.mark.parametrize("command", ["convert", "retie"])
def test_a_signal_at_any_moment_of_a_pt_write_ends_with_one_line(
    command: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    source = inputs[command]
    before = _sha256(source)
    for index, (moment, signals, when) in enumerate(MOMENTS if command == "convert" else RETIE_MOMENTS):
        folder = tmp_path / f"{index}-{moment}"
        folder.mkdir()
        done = _interrupt(command, source, folder, signals, **when)
        try:
            _assert_ended_whole(done, signals, folder, before)
        except AssertionError as exc:
            raise AssertionError(f"{command}, {moment}: {exc}") from None


def test_a_signal_turned_into_a_library_error_still_ends_as_interrupted() -> None:
    """The mechanism: torch turns an exception raised in its writer into RuntimeError. A guarded
    block a signal interrupted ends as interrupted, whatever came out of it."""
    from tieaudit.core.interrupts import Interrupted, signals_guarded

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a handler that returns
    try:
        with pytest.raises(Interrupted), signals_guarded():
            try:
                signal.raise_signal(signal.SIGTERM)
                time.sleep(1)
            except Interrupted as exc:
                raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from exc
    finally:
        signal.signal(signal.SIGTERM, previous)


SWALLOWED = """
import signal, sys
from tieaudit.core.interrupts import Interrupted, guard_process, signals_guarded
guard_process()
try:  # a library's bare except around an import swallows the Interrupted the guard raised
    signal.raise_signal(signal.SIGTERM)
    sum(range(10**6))
except BaseException:
    pass
try:
    with signals_guarded():
        print("the write started")
except Interrupted as exc:
    print("interrupted", exc.signum)
"""


def test_a_signal_a_library_swallowed_stops_the_write_before_it_starts() -> None:
    done = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == [f"interrupted {int(signal.SIGTERM)}"], (done.stdout, done.stderr)


# --- odd arguments -------------------------------------------------------------------------------

ADDRESSES = {
    "empty": "dask://",
    "colons": "dask://:::",
    "port-not-a-number": "dask://host:notaport",
    "protocol-without-address": "dask://tcp://",
    "unclosed-ipv6": "dask://[::1",
    "space": "dask://a b",
    "ten-kilobytes": "dask://" + "a" * 10_000 + ":8786",
    "port-over-65535": "dask://localhost:70000",
    "port-zero": "dask://localhost:0",
    "negative-port": "dask://localhost:-1",
    "no-host": "dask://:8786",
    "unknown-protocol": "dask://udp://host:8786",
    "newline": "dask://host:8786\n",
    "nested-protocols": "dask://tcp://tcp://host:8786",
}
TIMEOUTS = {"nan": "nan", "inf": "inf", "minus-one": "-1", "zero": "0", "1e400": "1e400", "minus-inf": "-inf"}

DRIVER = """
import gc, io, json, socket, sys
from tieaudit.cli.main import main
tried = []
def refuse(what):
    def attempt(*args, **kwargs):
        tried.append(what + repr(args[1:2] if what.startswith("connect") else args[:2]))
        raise OSError("the test refuses every lookup and connection")
    return attempt
socket.getaddrinfo = refuse("getaddrinfo")
socket.create_connection = refuse("create_connection")
socket.socket.connect = refuse("connect")
socket.socket.connect_ex = refuse("connect_ex")
results = []
for argv in json.loads(sys.argv[1]):
    err, real = io.StringIO(), sys.stderr
    sys.stderr = err
    del tried[:]
    try:
        code = main(argv)
        gc.collect()
    finally:
        sys.stderr = real
    results.append({"code": code, "err": err.getvalue(), "network": list(tried)})
with open(sys.argv[2], "w") as out:
    json.dump(results, out)
"""


def _run_in_one_process(runs: list[list[str]], results: Path) -> tuple[list[dict[str, object]], str]:
    """main(argv) for each run in one child (its imports paid once): each run's code, stderr and
    the lookups and connections it tried (every one refused), and what the child printed on stderr
    outside them (at exit: "Exception ignored ...")."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(runs), str(results)],
        cwd=ROOT / "fixtures",
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: list[dict[str, object]] = json.loads(results.read_text())
    return found, done.stderr


def test_malformed_executor_and_connect_timeout_are_one_line_exit_2_before_any_connection(
    tmp_path: Path,
) -> None:
    """Refused while the arguments are parsed: no name lookup, no connection tried (a count, where
    a time limit would be flaky on a loaded machine), so no address or timeout can make it wait."""
    runs = [
        ["check", "generated/safetensors", "--executor", url, "--connect-timeout", "30"]
        for url in ADDRESSES.values()
    ]
    runs += [
        ["check", "generated/safetensors", "--executor", "dask://127.0.0.1:9", "--connect-timeout", t]
        for t in TIMEOUTS.values()
    ]
    runs += [
        ["check", "generated/safetensors", "--connect-timeout", t] for t in ("nan", "1e400")
    ]  # local too
    results, after = _run_in_one_process(runs, tmp_path / "results.json")
    names = [*ADDRESSES, *TIMEOUTS, "local-nan", "local-1e400"]
    for name, result in zip(names, results, strict=True):
        lines = str(result["err"]).splitlines()
        assert result["code"] == 2 and len(lines) == 1 and lines[0].startswith("tieaudit: error: "), (
            name,
            result,
        )
        assert len(lines[0]) < 400, (name, lines[0])  # a 10 kB address is not echoed whole
        assert result["network"] == [], (name, result)
    assert "Exception ignored" not in after and "Traceback" not in after, after


def test_malformed_executor_from_the_console_script_is_one_line_and_nothing_after() -> None:
    for url in (ADDRESSES["unclosed-ipv6"], ADDRESSES["port-not-a-number"]):
        done = subprocess.run(
            [str(TIEAUDIT), "check", "generated/safetensors", "--executor", url],
            cwd=ROOT / "fixtures",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr


def test_well_formed_executor_addresses_are_accepted_as_dask_reads_them() -> None:
    from tieaudit.gate.executors import scheduler_address

    assert scheduler_address("dask://scheduler:8786") == "tcp://scheduler:8786"
    assert scheduler_address("dask://tls://10.0.0.1:8786") == "tls://10.0.0.1:8786"
    assert scheduler_address("dask://[::1]:8786") == "tcp://[::1]:8786"


# --- TIE010 first --------------------------------------------------------------------------------

RUNS_CODE = ["pt_zip_reduce_os_system.pt", "pt_legacy_reduce_os_system.pt"]


@pytest.mark.parametrize("fixture", RUNS_CODE)
@pytest.mark.parametrize(
    "argv",
    [
        ["retie", "IN", "OUT.pt"],
        ["retie", "IN", "--dry-run"],
        ["retie", "IN"],
        ["retie", "IN", "EXISTING.pt"],
        ["convert", "IN", "OUT.safetensors"],
        ["convert", "IN", "--dry-run"],
        ["convert", "IN", "OUT.pt"],
    ],
    ids=[
        "retie",
        "retie-dry-run",
        "retie-no-out",
        "retie-out-exists",
        "convert",
        "convert-dry-run",
        "convert-to-pt",
    ],
)
def test_retie_and_convert_of_a_pickle_that_runs_code_say_so_first(
    fixture: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tieaudit.cli.main import main

    source = tmp_path / fixture
    source.write_bytes((ROOT / "fixtures" / "hostile" / fixture).read_bytes())
    (tmp_path / "EXISTING.pt").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    both = io.StringIO()  # stdout and stderr in the order written
    monkeypatch.setattr(sys, "stdout", both)
    monkeypatch.setattr(sys, "stderr", both)
    code = main([str(source) if a == "IN" else a for a in argv])
    lines = both.getvalue().splitlines()
    assert "TIE010" in lines[0] and "system" in lines[0], lines
    if code == 2:  # a run that stops: its one error line leads with it (bad input stays one line)
        assert len(lines) == 1 and lines[0].startswith("tieaudit: error: "), lines
    else:  # a run that goes on: the first line, before the plan
        assert code == 0 and lines[0].startswith("tieaudit: warning: "), lines
    assert sorted(os.listdir(tmp_path)) == sorted([fixture, "EXISTING.pt"])  # nothing written
