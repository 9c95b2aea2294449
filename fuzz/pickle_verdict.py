"""The pickle verdict differential: tieaudit's verdict on a pickle against torch.load(weights_only=True).

For every pickle-bearing corpus file and for seeded opcode-level mutations of their pickles
(fuzz/pickle_mutations.py), tieaudit's outcome A (clean: read, no global outside torch's allowlist;
TIE010: read, with one; refused: InputError) is compared with T, whether torch.load(path,
weights_only=True) loads the file (in worker processes, fuzz/torch_load_worker.py):

- A == TIE010 and T: a false alarm;
- A == clean and not T: the worst bug, a file that needs weights_only=False reported clean;
- A == refused and T: allowed where tieaudit deliberately does not read what torch reads
  (UnsupportedFormatError) or refuses as ambiguous; each kind is counted and listed;
- tieaudit raising anything but InputError, or torch crashing or hanging on a file tieaudit calls
  clean, is a mismatch too.

A mismatch is minimized (values replaced by None while it persists), written with its reproducer
(seed, case index, operators, both outcomes, pickletools.dis) under OUT/failures. Used by
tests/test_trust2_pickle_differential.py (a seeded subset in ``make test``) and by ``make fuzz``:
``python fuzz/pickle_verdict.py --cases 50000 [--seed N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickletools
import queue
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from fuzz import pickle_mutations as mutations  # noqa: E402
from fuzz import pickle_seeds as seeds  # noqa: E402

DEFAULT_OUT = HERE / "out" / "pickle_verdict"
WORKER = HERE / "torch_load_worker.py"
TORCH_SECONDS = float(os.environ.get("PICKLE_TORCH_SECONDS", "5"))
"""A torch.load still running after this long is a hang (the worker is killed). Every corpus file
loads in well under a second on a loaded two-core machine; the mutants that run past it are
allocation loops (a size of billions), and each one held a worker for the whole limit."""
STARTUP_SECONDS = 120.0
"""Time a worker may take to import torch (two at once on a busy machine)."""
AUDIT_SECONDS = 20.0
"""The same for tieaudit's reader, in this process."""
LOADS = ("loads", "loads-device-mapped")
A_KINDS = ("clean", "TIE010", "refused", "crashed")
T_KINDS = ("loads", "loads-device-mapped", "refuses", "crash", "hang")


# --- torch's side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchAnswer:
    status: str
    """One of T_KINDS."""
    error: str = ""
    dirty: bool = False
    """The load changed torch's state (imported a module): the worker is replaced after it."""


@dataclass
class _Job:
    path: str
    timeout: float
    future: Future[TorchAnswer] = field(default_factory=Future)


class TorchPool:
    """Worker processes that each import torch once and torch.load one path at a time.

    A worker that dies answers ``crash`` (its signal in the error), one past the timeout is killed
    and answers ``hang``; either is replaced by a fresh worker.
    """

    def __init__(self, workers: int = 2) -> None:
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.safe_globals: frozenset[str] = frozenset()
        """The names torch holds as safe globals right after ``import torch``."""
        self.starts = 0
        """Workers started: one per thread, plus one after each crash, hang or load that changed torch."""
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.threads = [threading.Thread(target=self._drive, daemon=True) for _ in range(workers)]
        for thread in self.threads:
            thread.start()

    def submit(self, path: Path, timeout: float = TORCH_SECONDS) -> Future[TorchAnswer]:
        job = _Job(str(path), timeout)
        self.jobs.put(job)
        return job.future

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()

    def _start(self) -> subprocess.Popen[bytes]:
        """A worker, once it has imported torch (it says so with one line)."""
        process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], STARTUP_SECONDS)
        line = process.stdout.readline() if ready else b""
        if not line:
            _stop(process)
            raise RuntimeError(f"a torch.load worker did not start within {STARTUP_SECONDS:.0f} s")
        self.safe_globals = frozenset(json.loads(line)["safe_globals"])
        self.starts += 1
        return process

    def _drive(self) -> None:
        process = self._start()
        while True:
            job = self.jobs.get()
            if job is None:
                break
            if process.poll() is not None:
                process = self._start()
            answer = self._ask(process, job)
            if answer.status in ("crash", "hang") or answer.dirty:
                _stop(process)
                process = self._start()
            job.future.set_result(answer)
        _stop(process)

    @staticmethod
    def _ask(process: subprocess.Popen[bytes], job: _Job) -> TorchAnswer:
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps({"path": job.path, "timeout": job.timeout}).encode() + b"\n")
            process.stdin.flush()
        except BrokenPipeError:
            return TorchAnswer("crash", "the worker died before the file was sent")
        ready, _, _ = select.select([process.stdout], [], [], job.timeout)
        if not ready:
            return TorchAnswer("hang", f"torch.load ran past {job.timeout:.0f} s (the worker was killed)")
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            return TorchAnswer("crash", f"torch.load killed its worker ({_signal_name(code)})")
        found = json.loads(line)
        return TorchAnswer(found["status"], found["error"], dirty=found["dirty"])


def _signal_name(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"exit {code}"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


# --- tieaudit's side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Audit:
    outcome: str
    """One of A_KINDS."""
    detail: str = ""
    """The refusal (its message) or the globals outside the allowlist."""
    unsupported: bool = False
    """A refusal as UnsupportedFormatError: something torch reads that tieaudit deliberately does not."""


Answer = tuple[Audit, TorchAnswer]
"""tieaudit's outcome on a file and torch's."""


class _AuditTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise _AuditTimeout(f"tieaudit ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def audit(path: Path) -> Audit:
    """tieaudit's torch reader on path, in this process (the library, as ``check`` uses it)."""
    from tieaudit.core.errors import InputError, UnsupportedFormatError
    from tieaudit.formats.torch_file import TorchReader

    reader = TorchReader()
    with path.open("rb") as handle:
        head = handle.read(64)
    if not reader.sniff(str(path), head):
        return Audit("refused", "not recognised as a torch.save file")
    try:
        with _time_limit(AUDIT_SECONDS), reader.read(str(path)) as opened:
            named = [g.name for g in opened.checkpoint.pickle_globals if g.verdict == "runs-code"]
    except UnsupportedFormatError as exc:
        return Audit("refused", exc.message, unsupported=True)
    except InputError as exc:
        return Audit("refused", exc.message)
    except Exception as exc:  # a tieaudit bug (or its own time limit): a mismatch in itself
        return Audit("crashed", f"{type(exc).__name__}: {exc}"[:300])
    return Audit("TIE010", ", ".join(named)[:300]) if named else Audit("clean")


def audit_cli(path: Path, scratch: Path) -> str:
    """The outcome ``tieaudit check FILE`` gives (exit 2: refused; a TIE010 finding; else clean)."""
    report = scratch / "cli-report.json"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "tieaudit", "check", str(path), "--format", "json", "-o", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=scratch,
    )
    if done.returncode == 2:
        return "refused"
    if done.returncode not in (0, 1) or not report.exists():
        return f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    document = json.loads(report.read_text())
    findings = [f for r in document.get("reports", [document]) for f in r["findings"]]
    return "TIE010" if any(f["rule"] == "TIE010" for f in findings) else "clean"


# --- comparing -----------------------------------------------------------------------------------


def mismatch(ours: Audit, theirs: TorchAnswer) -> str:
    """Why the two outcomes break the contract ('' when they do not)."""
    loads = theirs.status in LOADS
    if ours.outcome == "crashed":
        return "tieaudit crashed"
    if ours.outcome == "TIE010" and loads:
        return "TIE010 on a file torch loads (a false alarm)"
    if ours.outcome == "clean" and not loads:
        return f"clean on a file torch refuses ({theirs.status})"
    return ""


def refusal_kind(message: str) -> str:
    """A refusal's message with its particulars (numbers, quoted names, offsets) folded away."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    text = re.sub(r"0x[0-9a-f]+|\d+", "N", text)
    return text[:240]


@dataclass
class Tally:
    """Outcomes of a run: the A x T matrix, what was refused though torch loads it, the findings."""

    matrix: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused_loads: Counter[tuple[bool, str]] = field(default_factory=Counter)
    """(unsupported, refusal kind) of files tieaudit refuses and torch loads."""
    torch_died: list[str] = field(default_factory=list)
    """Cases where torch crashed or hung."""
    mismatches: list[str] = field(default_factory=list)
    operators: Counter[str] = field(default_factory=Counter)

    def add(self, label: str, ours: Audit, theirs: TorchAnswer) -> str:
        self.matrix[ours.outcome, theirs.status] += 1
        if ours.outcome == "refused" and theirs.status in LOADS:
            self.refused_loads[ours.unsupported, refusal_kind(ours.detail)] += 1
        if theirs.status in ("crash", "hang"):
            self.torch_died.append(
                f"{label}: torch {theirs.status} ({theirs.error}); tieaudit {ours.outcome}"
            )
        return mismatch(ours, theirs)

    @property
    def total(self) -> int:
        return sum(self.matrix.values())

    def table(self) -> str:
        width = max(len(t) for t in T_KINDS) + 1
        corner = "tieaudit \\ torch"
        lines = [f"{corner:>18} " + "".join(f"{t:>{width}}" for t in T_KINDS)]
        lines += [f"{a:>18} " + "".join(f"{self.matrix[a, t]:>{width}}" for t in T_KINDS) for a in A_KINDS]
        return "\n".join(lines)

    def report(self, title: str) -> str:
        lines = [f"{title}: {self.total} files", self.table()]
        if self.refused_loads:
            lines.append("refused by tieaudit, loaded by torch (deliberate: U = UnsupportedFormatError):")
            for (unsupported, kind), count in sorted(self.refused_loads.items(), key=lambda x: -x[1]):
                lines.append(f"  {count:6d} {'U' if unsupported else ' '} {kind}")
        if self.torch_died:
            lines.append(f"torch crashed or hung on {len(self.torch_died)}:")
            lines += [f"  {line}" for line in self.torch_died[:20]]
        if self.operators:
            lines.append(
                "operators applied: " + ", ".join(f"{k} {v}" for k, v in sorted(self.operators.items()))
            )
        return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One mutant: which seed and pickle it came from, what was done, and the file's bytes."""

    index: int
    seed: seeds.Seed
    target: int
    pickle: bytes
    done: tuple[str, ...]
    data: bytes


def make_case(run_seed: int, index: int, corpus: list[seeds.Seed]) -> Case:
    """Case ``index`` of the run seeded ``run_seed`` (the same on every machine and run)."""
    rng = random.Random(f"{run_seed}:{index}")
    seed = rng.choice(corpus)
    targets = seed.targets
    target = targets[0] if rng.random() < 0.75 else rng.choice(targets)
    pickle, done = mutations.mutate(seed.pickles[target], rng, rounds=rng.choice((1, 1, 1, 2, 2, 3)))
    pickles = seed.pickles[:target] + (pickle,) + seed.pickles[target + 1 :]
    return Case(index, seed, target, pickle, tuple(done), seed.assemble(pickles))


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def disassembly(pickle: bytes, limit: int = 120) -> str:
    """pickletools.dis of a pickle, cut at ``limit`` lines (and where it stops parsing)."""
    out = io.StringIO()
    try:
        pickletools.dis(pickle, out=out)
    except Exception as exc:  # the mutant may not parse: show what did, then why it stopped
        out.write(f"-- stops parsing: {type(exc).__name__}: {exc}\n")
    lines = out.getvalue().splitlines()
    return "\n".join(lines[:limit] + ([f"... {len(lines) - limit} more lines"] if len(lines) > limit else []))


class Differential:
    """Runs files through both sides, keeps the tally, writes and minimizes mismatches."""

    def __init__(self, pool: TorchPool, out: Path, run_seed: int) -> None:
        self.pool, self.out, self.run_seed = pool, out, run_seed
        self.work = out / "work"
        self.failures = out / "failures"
        for folder in (self.work, self.failures):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        self.samples: dict[str, Path] = {}
        """One kept file per tieaudit outcome, for the CLI check."""

    def both(self, path: Path, timeout: float = TORCH_SECONDS) -> tuple[Audit, TorchAnswer]:
        future = self.pool.submit(path, timeout)
        return audit(path), future.result()

    def files(
        self, files: list[tuple[str, Path]], tally: Tally
    ) -> tuple[dict[str, tuple[Audit, TorchAnswer]], list[str]]:
        """Each (label, path) through both sides: the answers by label, and the mismatches."""
        answers: dict[str, tuple[Audit, TorchAnswer]] = {}
        found = []
        futures = [(label, path, self.pool.submit(path, TORCH_SECONDS)) for label, path in files]
        for label, path, future in futures:
            ours, theirs = audit(path), future.result()
            answers[label] = (ours, theirs)
            why = tally.add(label, ours, theirs)
            if why:
                found.append(self.report_file(label, path, why, (ours, theirs)))
        return answers, found

    def report_file(self, label: str, path: Path, why: str, answer: Answer) -> str:
        """A mismatch on a whole file (corpus, sweep, regression): the file copied under failures,
        with its pickles' opcodes."""
        ours, theirs = answer
        kept = self.failures / re.sub(r"[^A-Za-z0-9._-]+", "_", label)[:120]
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, kept / path.name)
        seed = seeds.seed_of(path, label)
        shown = [disassembly(pickle) for pickle in seed.pickles] if seed else ["(its pickles do not parse)"]
        text = "\n".join(
            [
                f"MISMATCH: {why}",
                f"  {label}",
                f"  tieaudit: {ours.outcome} {ours.detail}",
                f"  torch:    {theirs.status} {theirs.error}",
                f"  files:    {kept}",
                *shown,
            ]
        )
        (kept / "reproducer.txt").write_text(text + "\n")
        return text

    def rebuilt(
        self, corpus: list[seeds.Seed], tally: Tally
    ) -> tuple[dict[str, tuple[Audit, TorchAnswer]], list[str]]:
        """Every seed written back unchanged (the way its mutants are written): the same outcome as
        the file it came from shows that only the mutations make the mutants differ."""
        files = [
            (seed.label, _write(self.work, f"rebuilt-{n}{seed.suffix}", seed.assemble(seed.pickles)))
            for n, seed in enumerate(corpus)
        ]
        return self.files(files, tally)

    def sweep(self, tally: Tally, *, every: int = 1) -> tuple[dict[str, Answer], list[str]]:
        """Every ``every``-th value of the sweep (pickle_mutations.sweep: each allowed name bare,
        called, instantiated, given state; each pool name outside the allowlist) beside a tensor,
        starting at the run's seed modulo ``every``."""
        folder = self.work / "sweep"
        folder.mkdir(exist_ok=True)
        files = []
        for index, (label, value) in enumerate(mutations.sweep()[self.run_seed % every :: every]):
            files.append((f"sweep: {label}", _write(folder, f"{index}.pt", mutations.sweep_file(value))))
        return self.files(files, tally)

    def mutants(self, corpus: list[seeds.Seed], cases: range, tally: Tally, *, window: int = 6) -> list[str]:
        """Cases ``cases`` of this run's seed; returns the mismatch reports."""
        found: list[str] = []
        pending: list[tuple[Case, Path, Future[TorchAnswer], Audit]] = []

        def settle(case: Case, path: Path, future: Future[TorchAnswer], ours: Audit) -> None:
            theirs = future.result()
            why = tally.add(f"case {case.index}", ours, theirs)
            if why:
                found.append(self.report_mismatch(case, why, ours, theirs))
            if theirs.status in ("crash", "hang"):
                shutil.copyfile(path, self.failures / f"torch-{theirs.status}-{case.index}{case.seed.suffix}")
            if ours.outcome not in self.samples:
                self.samples[ours.outcome] = path
            else:
                path.unlink()

        for index in cases:
            case = make_case(self.run_seed, index, corpus)
            for done in case.done:
                tally.operators[done.split(":", 1)[0]] += 1
            path = _write(self.work, f"case-{index}{case.seed.suffix}", case.data)
            future = self.pool.submit(path)
            pending.append((case, path, future, audit(path)))
            if len(pending) >= window:
                settle(*pending.pop(0))
        for item in pending:
            settle(*item)
        return found

    def _still(self, case: Case, pickle: bytes, why: str) -> bool:
        pickles = case.seed.pickles[: case.target] + (pickle,) + case.seed.pickles[case.target + 1 :]
        path = _write(self.work, f"minimizing{case.seed.suffix}", case.seed.assemble(pickles))
        ours, theirs = self.both(path)
        return mismatch(ours, theirs) == why

    def minimize(self, case: Case, why: str, budget: int = 200) -> bytes:
        """The mutated pickle with as many values as possible replaced by None (largest first) while
        the same mismatch remains; at most ``budget`` tries."""
        current, tried, shrunk = case.pickle, 0, True
        while shrunk and tried < budget:
            shrunk = False
            spans = sorted(
                {s for s in mutations.parse(current).values if s[1] - s[0] > 1}, key=lambda s: s[0] - s[1]
            )
            for start, end in spans[: budget - tried]:
                tried += 1
                trial = current[:start] + b"N" + current[end:]
                if self._still(case, trial, why):
                    current, shrunk = trial, True
                    break
        return current

    def report_mismatch(self, case: Case, why: str, ours: Audit, theirs: TorchAnswer) -> str:
        folder = self.failures / f"case-{case.index}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mutant{case.seed.suffix}").write_bytes(case.data)
        small = self.minimize(case, why)
        pickles = case.seed.pickles[: case.target] + (small,) + case.seed.pickles[case.target + 1 :]
        (folder / f"minimized{case.seed.suffix}").write_bytes(case.seed.assemble(pickles))
        what = "data.pkl" if case.seed.layout == "zip" else f"the {seeds.LEGACY_PICKLES[case.target]} pickle"
        text = "\n".join(
            [
                f"MISMATCH: {why}",
                f"  PICKLE_FUZZ_SEED={self.run_seed} case {case.index}: {case.seed.label}, {what}",
                *(f"  operator: {done}" for done in case.done),
                f"  tieaudit: {ours.outcome} {ours.detail}",
                f"  torch:    {theirs.status} {theirs.error}",
                f"  files:    {folder}",
                "  minimized pickle:",
                disassembly(small),
            ]
        )
        (folder / "reproducer.txt").write_text(text + "\n")
        return text


def run(*, cases: int, run_seed: int, out: Path, workers: int = 2) -> tuple[list[Tally], list[str]]:
    """The corpus, its seeds rebuilt, and ``cases`` mutants: a tally of each, and the mismatches."""
    files = seeds.corpus_files()
    corpus = seeds.corpus_seeds(files)
    pool = TorchPool(workers)
    tallies = [Tally(), Tally(), Tally(), Tally()]
    try:
        differential = Differential(pool, out, run_seed)
        found = differential.files(files, tallies[0])[1]
        found += differential.rebuilt(corpus, tallies[1])[1]
        found += differential.sweep(tallies[2])[1]
        found += differential.mutants(corpus, range(cases), tallies[3])
    finally:
        pool.close()
    return tallies, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20000, help="Mutants to try. [default: 20000]")
    parser.add_argument("--seed", type=int, default=None, help="The run's seed. [default: from the clock]")
    parser.add_argument("--workers", type=int, default=2, help="torch.load workers. [default: 2]")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Where failures are written.")
    args = parser.parse_args(argv)
    run_seed = args.seed if args.seed is not None else int(time.time())
    began = time.monotonic()
    print(
        f"pickle verdict differential: seed {run_seed}, {args.cases} mutants, out {args.out}", file=sys.stderr
    )
    (whole, rebuilt, swept, mutant), found = run(
        cases=args.cases, run_seed=run_seed, out=args.out, workers=args.workers
    )
    print(whole.report("corpus"))
    print(rebuilt.report("corpus seeds rebuilt unchanged"))
    print(swept.report("sweep of every name"))
    print(mutant.report(f"mutants (seed {run_seed})"))
    for text in found:
        print(text)
    print(f"{len(found)} mismatches in {time.monotonic() - began:.0f} s")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
