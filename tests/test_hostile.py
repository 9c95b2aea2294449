"""The adversarial corpus (fixtures/hostile/, MANIFEST.json): every input gives exit 2 and one line
naming the file and the problem, runs no code, writes nothing, and ends (a run still going after
TIMEOUT is a hang) in bounded memory.

Every case runs `inspect` and `check` on its own copy, each in its own process with its address
space capped (RLIMIT_AS), a timeout, and its peak memory measured (wait4). The runs come from a
small fork server, so 200 of them cost forks rather than interpreter starts; a few cases also go
through `python -m tieaudit.cli.main` itself, limits set by preexec_fn. Tests run as root here, where
chmod 000 does not stop reads: each child gives up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
(capset, and the bounding set for exec), so permissions hold for it as for any user.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tieaudit.rules.registry import RULES

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "fixtures" / "hostile"
sys.path.insert(0, str(HOSTILE))
import make_hostile  # type: ignore[import-not-found]  # noqa: E402  (the generator: builders, setups and the manifest)

MEMORY_LIMIT = 2 << 30
"""Address space of each CLI run: numpy and onnx imports need about 1 GiB of it."""
TIMEOUT = 60.0
"""A run still going after this long is a hang: it is killed and its test fails. A hang guard, not a
speed target (the slowest run takes about 2 s alone; bench/ holds the speed targets): how much work
an input may cause is bounded by the readers' counted budgets, whose refusals the cases assert."""
COMMANDS = ("inspect", "check")
FORMATS = ("safetensors", "torch_file", "onnx_model", "hf_dir", "gguf")
_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(field, ctypes.c_uint32) for field in ("effective", "permitted", "inheritable")]


def _drop_permission_bypass() -> None:
    """Give up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: now, and (bounding set) across exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    dropped = ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0].effective &= dropped
    data[0].permitted &= dropped
    data[0].inheritable &= dropped
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _limit_child() -> None:
    """In the child: cap the address space; as root, stop bypassing file permissions (where the
    host lets us: without CAP_SETPCAP the unreadable cases are skipped, see _permissions_hold)."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            _drop_permission_bypass()


@dataclass(frozen=True)
class Job:
    """One CLI run to make: argv for ``tieaudit`` in folder cwd, output captured under stem."""

    argv: list[str]
    cwd: str
    stem: str


@dataclass(frozen=True)
class Outcome:
    """How a run ended."""

    returncode: int | None
    """Exit code; None when it was killed for running past TIMEOUT."""
    max_rss_kib: int
    """Peak resident memory of the run (from wait4)."""
    stdout: str
    stderr: str


def _child(job: Job) -> None:
    """In a forked child: the limits, the folder, the output files, then the CLI's own entry point."""
    from tieaudit.cli.main import main

    code = 70
    try:
        _limit_child()
        os.chdir(job.cwd)
        for fd, suffix in ((1, ".out"), (2, ".err")):
            target = os.open(job.stem + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        code = main(job.argv)
    except BaseException:  # what a real process would print before dying
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(jobs: list[Job], parallel: int) -> list[Outcome]:
    """Run every job in its own forked process, parallel at a time.

    A fork server: the parent imports tieaudit, numpy and onnx once, so a run costs a fork rather
    than an interpreter start (numpy alone takes a quarter second to import). Each child still
    gets its own address-space limit, capabilities, folder, timeout and exit code.
    """
    import importlib

    preload = (
        "onnx",
        "concurrent.futures",
        "tieaudit.cli.main",
        "tieaudit.gate.check",
        "tieaudit.report",
        "tieaudit.rules.registry",
    )
    for module in (*preload, *(f"tieaudit.formats.{m}" for m in FORMATS)):
        importlib.import_module(module)  # loaded once here, shared by every child

    sys.stdout.flush()
    sys.stderr.flush()
    pending = list(enumerate(jobs))
    running: dict[int, tuple[int, float]] = {}
    ended: dict[int, tuple[int | None, int]] = {}
    while pending or running:
        while pending and len(running) < parallel:
            index, job = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(job)
            running[pid] = (index, time.monotonic())
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for late, (_, began) in running.items():
                if now - began > TIMEOUT:
                    os.kill(late, 9)  # a hang; reaped (and recorded as killed) below
            time.sleep(0.005)
            continue
        index, _ = running.pop(pid)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
        code = None if killed else os.waitstatus_to_exitcode(status)
        ended[index] = (code, usage.ru_maxrss)
    outcomes = []
    for index, job in enumerate(jobs):
        code, rss = ended[index]
        out, err = (Path(job.stem + suffix).read_text(errors="replace") for suffix in (".out", ".err"))
        outcomes.append(Outcome(code, rss, out, err))
    return outcomes


def _serve_main(spec: str) -> int:
    """``python test_hostile.py JOBS.json``: run the jobs, write their outcomes beside them."""
    request = json.loads(Path(spec).read_text())
    outcomes = serve([Job(**job) for job in request["jobs"]], request["parallel"])
    Path(spec + ".out").write_text(json.dumps([vars(o) for o in outcomes]))
    return 0


@dataclass(frozen=True)
class Run:
    """One CLI run on one prepared copy of a case."""

    case: make_hostile.Hostile
    command: str
    work: Path
    target: Path
    outcome: Outcome
    before: dict[str, tuple[int, int]]
    after: dict[str, tuple[int, int]]

    def setup_free_size(self) -> int:
        """Bytes of the input as prepared (0 where a setup made it unreadable or a link)."""
        try:
            return _input_bytes(self.target)
        except OSError:
            return 0


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under folder with its size and mtime (links not followed)."""
    found: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            status = os.lstat(path)
            found[os.path.relpath(path, folder)] = (status.st_size, status.st_mtime_ns)
    return found


CASES = make_hostile.CASES
IDS = [case.name for case in CASES]


def _report_path(work: Path) -> Path:
    return work.parent / f"{work.name}.report.json"


def _cli_args(command: str, target: Path, work: Path) -> list[str]:
    return [command, str(target), "--format", "json", "--output", str(_report_path(work))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Run]]:
    base = tmp_path_factory.mktemp("hostile")
    prepared = []
    for index, case in enumerate(CASES):
        for command in COMMANDS:
            # Numbered folders: an error line naming only the folder must not pass for naming the case.
            work = base / f"{index}-{command}"
            work.mkdir()
            target = make_hostile.prepare(case, HOSTILE, work)
            prepared.append((case, command, work, target, _listing(work)))
    spec = base / "jobs.json"
    jobs = [
        Job(_cli_args(command, target, work), str(work), str(base / work.name))
        for _, command, work, target, _ in prepared
    ]
    spec.write_text(json.dumps({"jobs": [vars(job) for job in jobs], "parallel": 3}))
    # this checkout first: an installed tieaudit (an editable install of another checkout) must not answer
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    server = subprocess.run(
        [sys.executable, __file__, str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert server.returncode == 0, server.stderr[-4000:]
    outcomes = [Outcome(**o) for o in json.loads(Path(str(spec) + ".out").read_text())]
    done = {
        (case.name, command): Run(case, command, work, target, outcome, before, _listing(work))
        for (case, command, work, target, before), outcome in zip(prepared, outcomes, strict=True)
    }
    yield done
    for run in done.values():  # give permissions back so the temporary folder can be removed
        for path in [run.work, *run.work.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755)


SMALL_INPUT_BYTES = 64 << 10
"""Inputs up to this size (a file, or a folder's files) must stay within the small budget below."""
SMALL_MAX_RSS_KIB = 256 << 10
"""Peak resident memory of a run on a small input (256 MiB, interpreter and imports included)."""


def _input_bytes(target: Path) -> int:
    if target.is_symlink() or not target.exists():
        return 0
    if target.is_file():
        return target.stat().st_size
    return sum(p.stat().st_size for p in target.rglob("*") if p.is_file() and not p.is_symlink())


NO_PERMISSIONS = "running as root without CAP_SETPCAP: chmod 000 cannot stop this root's reads"
MAX_RSS_KIB = 1 << 20
"""Peak resident memory a run may reach (1 GiB; a clean run of a small file needs about 150 MiB)."""
NOTHING_SCANNED = "nothing scanned"
"""check's line when a folder holds no checkpoint it recognises (it looks inside folders)."""


def _one_error_line(stderr: str, command: str) -> str:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"{command}: expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("tieaudit: error: "), lines[0]
    return lines[0]


def _assert_nothing_written(run: Run) -> None:
    assert run.after == run.before, f"{run.command} changed the input folder"
    markers = list(run.work.rglob(make_hostile.MARKER)) + list(HOSTILE.rglob(make_hostile.MARKER))
    assert not markers, f"pickle code ran: {markers}"
    report = _report_path(run.work)
    if run.case.exit_code == 0:
        return
    if run.command == "inspect":
        assert not report.exists(), "inspect wrote a report for bad input"
        return
    # check records unreadable paths in its report (schema tieaudit.check/1: "errors"); when it
    # writes one, it is whole, lists no audit, and names the path.
    if report.exists():
        document = json.loads(report.read_text())
        assert document["schema"] == "tieaudit.check/1" and document["reports"] == []
        assert document["errors"] and all(str(run.target) in error["path"] for error in document["errors"])


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hostile_input_is_refused_in_one_line(
    runs: dict[tuple[str, str], Run], case: make_hostile.Hostile, command: str
) -> None:
    if case.setup.startswith("chmod000") and not _permissions_hold():
        pytest.skip(NO_PERMISSIONS)
    run = runs[(case.name, command)]
    outcome = run.outcome
    assert outcome.returncode is not None, f"{command} did not finish in {TIMEOUT} s (a hang)"
    assert outcome.max_rss_kib < MAX_RSS_KIB, f"{command} peaked at {outcome.max_rss_kib >> 10} MiB"
    if run.setup_free_size() <= SMALL_INPUT_BYTES:
        assert outcome.max_rss_kib < SMALL_MAX_RSS_KIB, f"{command} peaked at {outcome.max_rss_kib >> 10} MiB"
    if case.finding:  # read with inert placeholders: reported, nothing run
        assert outcome.returncode == _finding_exit(case, command), (outcome.returncode, outcome.stderr)
        _assert_reported(case, command, json.loads(_report_path(run.work).read_text()))
    elif case.exit_code == 0:  # valid but expensive: it only has to finish, quietly
        allowed = {0} if command == "inspect" else {0, 1}
        assert outcome.returncode in allowed and "Traceback" not in outcome.stderr, outcome.stderr
    else:
        assert outcome.returncode == 2, (outcome.returncode, outcome.stdout[-2000:], outcome.stderr)
        line = _one_error_line(outcome.stderr, command)
        assert case.name in line, f"the line does not name the file: {line}"
        expected = [case.expect.lower()]
        if command == "check" and run.target.is_dir():
            expected.append(NOTHING_SCANNED)
        assert any(fragment in line.lower() for fragment in expected), f"expected {expected} in: {line}"
    _assert_nothing_written(run)


def _finding_exit(case: make_hostile.Hostile, command: str) -> int:
    """inspect reads and reports (0); check fails on an error-severity finding (default --fail-on)."""
    return 1 if command == "check" and RULES[case.finding].severity == "error" else 0


def _assert_reported(case: make_hostile.Hostile, command: str, document: dict[str, Any]) -> None:
    reports = document["reports"] if "reports" in document else [document]  # check of one path: one report
    found = [f for r in reports for f in r["findings"] if f["rule"] == case.finding]
    assert any(case.expect in name for f in found for name in f["names"]), found
    verdicts = {g["name"]: g["verdict"] for r in reports for g in r["pickle_globals"]}
    wanted = "runs-code"  # torch's verdict: every global outside its allowlist (TIE010, or TIE011 by policy)
    assert any(case.expect in name and verdict == wanted for name, verdict in verdicts.items()), verdicts


# A few cases through the real entry point (a fresh interpreter, limits set by preexec_fn),
# so the fork server above cannot hide a difference.
ENTRY_POINT_CASES = [
    "pt_zip_reduce_os_system.pt",
    "pt_legacy_memo_huge_index.pt",
    "fifo.safetensors",
    "unreadable.pt",
]


@pytest.mark.parametrize("name", ENTRY_POINT_CASES)
def test_real_entry_point_refuses_in_one_line(name: str, tmp_path: Path) -> None:
    case = make_hostile.BY_NAME[name]
    if case.setup.startswith("chmod000") and not _permissions_hold():
        pytest.skip(NO_PERMISSIONS)
    target = make_hostile.prepare(case, HOSTILE, tmp_path)
    before = _listing(tmp_path)
    for command in COMMANDS:
        done = subprocess.run(
            [sys.executable, "-m", "tieaudit", *_cli_args(command, target, tmp_path)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            preexec_fn=_limit_child,
            check=False,
        )
        if case.finding:
            assert done.returncode == _finding_exit(case, command), done.stderr
            _assert_reported(case, command, json.loads(_report_path(tmp_path).read_text()))
            _report_path(tmp_path).unlink()
            continue
        assert done.returncode == 2, done.stderr
        line = _one_error_line(done.stderr, command)
        assert name in line and case.expect.lower() in line.lower(), line
    assert _listing(tmp_path) == before
    assert not (tmp_path / make_hostile.MARKER).exists()
    target.chmod(0o644) if not target.is_symlink() else None


def test_code_execution_attempts_name_the_refused_global() -> None:
    attempts = [case for case in CASES if case.exec_attempt]
    assert len(attempts) >= 10
    primitives = ("system", "eval", "exec", "getattr", "check_call", "__globals__", "write_text", "tofile",
                  "open", "_forward_from_src", "fork_exec", "load_url", "load")  # fmt: skip
    assert all(any(p in case.expect for p in primitives) for case in attempts)


def test_manifest_is_current_and_committed_bytes_rebuild(tmp_path: Path) -> None:
    """MANIFEST.json and every committed binary are exactly what make_hostile.py writes."""
    assert json.loads((HOSTILE / "MANIFEST.json").read_text()) == make_hostile.manifest()
    assert make_hostile.main(["make_hostile.py", str(tmp_path)]) == 0
    rebuilt = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    committed = {
        p.relative_to(HOSTILE): p.read_bytes()
        for p in HOSTILE.rglob("*")
        if p.is_file() and not (p.parent == HOSTILE and p.suffix == ".py") and "__pycache__" not in p.parts
    }
    assert rebuilt.keys() == committed.keys()
    assert [name for name, data in rebuilt.items() if committed[name] != data] == []


def test_every_family_the_issue_names_is_covered() -> None:
    names = " ".join(IDS)
    for fragment in (
        "reduce_os_system", "reduce_eval", "reduce_exec", "reduce_getattr", "not_allowlisted",
        "deep_nesting", "self_reference", "member_dotdot", "overlapping_records", "duplicate_member",
        "storage_short", "pt_legacy_storage_size", "header_len_past_eof", "header_not_json",
        "overlapping_offsets", "reversed_offsets", "unknown_dtype", "shape_offset_mismatch",
        "header_100mb_claim", "external_dotdot", "external_symlink", "external_past_end",
        "onnx_truncated", "empty.", "no_weights", "unreadable",
    ):  # fmt: skip
        assert fragment in names, fragment
    assert {"zip", "legacy"} <= {tag for case in CASES if case.exec_attempt for tag in case.tags}


@functools.cache
def _permissions_hold() -> bool:
    """Whether a child run with _limit_child really cannot read a chmod 000 file."""
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"tieaudit-perm-probe-{os.getpid()}"
    probe.write_bytes(b"x")
    probe.chmod(0)
    try:
        code = "import sys\ntry:\n    open(sys.argv[1], 'rb')\nexcept PermissionError:\n    sys.exit(3)\n"
        return (
            subprocess.run([sys.executable, "-c", code, str(probe)], preexec_fn=_limit_child).returncode == 3
        )
    finally:
        probe.unlink()


def test_unreadable_cases_really_are_unreadable() -> None:
    """Guards the unreadable cases: a chmod 000 file must really be unreadable to the child runs."""
    if not _permissions_hold():
        pytest.skip(NO_PERMISSIONS)
    assert _permissions_hold()


if __name__ == "__main__":
    sys.exit(_serve_main(sys.argv[1]))
