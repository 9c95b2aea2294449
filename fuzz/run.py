"""Long-running fuzzer for tieaudit's readers: ``python fuzz/run.py --seconds 600`` (``make fuzz``).

A supervisor starts one worker process per core and restarts any that dies before the time is up.
Each worker feeds mutated inputs (fuzz/harness.py: byte edits and structured edits of safetensors
headers, pickles, zip members, ONNX protos, config and index JSON) to a reader, then to the alias
graph, the rules and the reports, as the CLI would. Engines:

- ``atheris`` (coverage-guided libFuzzer over instrumented tieaudit code), when it imports;
- ``hypothesis`` otherwise: the same mutators, drawn by hypothesis, without coverage feedback.

A crash is any exception other than a TieauditError, a run past HANG_SECONDS, a worker killed by
libFuzzer (timeout, out of memory, signal), or the payload marker file appearing (pickle code ran).
Crashing inputs are kept under OUT/crashes (first byte: the kind) with their tracebacks. The
summary counts inputs tried, outcomes per reader, crashes, and code-execution attempts blocked
(pickles whose refused global could run code). Exit 0 when there were no crashes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from fuzz import harness  # noqa: E402

HANG_SECONDS = 20.0
"""An input still being read after this long is a hang (SIGALRM in the worker)."""
WORKER_MEMORY = 4 << 30
"""Address space per worker; libFuzzer's RSS limit (RSS_LIMIT_MB) stops runaway inputs first."""
RSS_LIMIT_MB = 2560
SLOW_SEEDS = ("pt_zip_shared_fanout.pt", "pt_zip_deep_nesting.pt")
"""Hostile seeds that take seconds each by design; they would only slow the search."""
DUMP_EVERY = 2.0


# --- worker ------------------------------------------------------------------------------------


class Stats:
    """Counts of one worker, written to a JSON file every DUMP_EVERY seconds and at the end."""

    def __init__(self, path: Path, crashes: Path, engine: str) -> None:
        self.path, self.crashes, self.engine = path, crashes, engine
        self.inputs = 0
        self.outcomes: Counter[str] = Counter()
        self.unique: dict[str, dict[str, Any]] = {}
        self.crash_count = 0
        self.last_dump = time.monotonic()

    def record(self, kind: str, label: str) -> None:
        self.inputs += 1
        self.outcomes[f"{kind}/{label}"] += 1
        if time.monotonic() - self.last_dump > DUMP_EVERY:
            self.dump()

    def crash(self, kind: str, data: bytes, exc: BaseException) -> None:
        self.crash_count += 1
        frames = traceback.extract_tb(exc.__traceback__)
        where = next(
            (f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames) if "tieaudit" in f.filename), ""
        )
        signature = f"{type(exc).__name__} {re.sub(r'[0-9]+', 'N', str(exc))[:100]} @ {where}"
        digest = hashlib.sha1(data).hexdigest()[:16]
        stem = self.crashes / f"{kind}-{digest}"
        stem.with_suffix(".bin").write_bytes(bytes([harness.KINDS.index(kind)]) + data)
        stem.with_suffix(".txt").write_text(f"{kind}\n{''.join(traceback.format_exception(exc))}")
        entry = self.unique.setdefault(signature, {"count": 0, "example": str(stem.with_suffix(".bin"))})
        entry["count"] += 1

    def dump(self) -> None:
        document = {
            "engine": self.engine,
            "inputs": self.inputs,
            "outcomes": dict(self.outcomes),
            "crashes": self.crash_count,
            "unique_crashes": self.unique,
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document))
        os.replace(temporary, self.path)
        self.last_dump = time.monotonic()


def _one(stats: Stats, kind: str, data: bytes, scratch: Path, audit: bool, seconds: float | None) -> None:
    try:
        outcome = harness.run_one(kind, data, scratch, seconds=seconds, audit=audit)
    except Exception as exc:  # the harness's Crash or Hang, or anything a reader let escape
        stats.record(kind, "crash")
        stats.crash(kind, data, exc)
        return
    stats.record(kind, outcome.label)


def _seed_inputs() -> dict[str, list[bytes]]:
    found = harness.all_seeds()
    slow = {(harness.HOSTILE / name).read_bytes() for name in SLOW_SEEDS if (harness.HOSTILE / name).exists()}
    return {kind: [data for data in files if data not in slow] for kind, files in found.items()}


def _instrumented_imports() -> None:
    import atheris

    with atheris.instrument_imports(include=["tieaudit"]):
        import tieaudit.audit
        import tieaudit.formats.hf_dir
        import tieaudit.formats.onnx_model
        import tieaudit.formats.safetensors
        import tieaudit.formats.torch_file
        import tieaudit.graph.alias
        import tieaudit.report
        import tieaudit.rules.registry  # noqa: F401


def run_atheris(args: argparse.Namespace, stats: Stats, scratch: Path) -> None:
    import atheris

    _instrumented_imports()
    seeds_dir, corpus_dir = args.out / "seeds", args.out / "corpus"
    corpus_dir.mkdir(exist_ok=True)

    def test_one(data: bytes) -> None:
        if time.time() > args.deadline:
            stats.dump()
            os._exit(0)
        if data:
            # No SIGALRM of ours: libFuzzer's -timeout owns that signal and reports hangs itself.
            _one(stats, harness.KINDS[data[0] % len(harness.KINDS)], data[1:], scratch, args.audit, None)

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        kind = data[:1] or bytes([rng.randrange(len(harness.KINDS))])
        if rng.random() < 0.4:
            body = atheris.Mutate(data[1:], max_size - 1)
        else:
            body = harness.mutate(harness.KINDS[kind[0] % len(harness.KINDS)], data[1:], rng)
        return (kind + body)[:max_size]

    flags = [
        f"-timeout={int(HANG_SECONDS) + 10}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        "-max_len=262144",
        f"-artifact_prefix={args.out / 'crashes'}/",
        f"-seed={args.worker + 1}",
    ]
    atheris.Setup([sys.argv[0], *flags, str(corpus_dir), str(seeds_dir)], test_one, custom_mutator=mutator)
    atheris.Fuzz()


class _TimeUp(Exception):
    pass


def run_hypothesis(args: argparse.Namespace, stats: Stats, scratch: Path) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    seeds = _seed_inputs()

    @settings(
        max_examples=10**9,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(rng=st.randoms(use_true_random=True), data=st.data())
    def fuzz(rng: random.Random, data: Any) -> None:
        if time.time() > args.deadline:
            raise _TimeUp
        kind = data.draw(st.sampled_from(harness.KINDS))
        seed = data.draw(st.sampled_from(seeds[kind]))
        _one(
            stats,
            kind,
            harness.mutate(kind, seed, rng, rounds=data.draw(st.integers(1, 6))),
            scratch,
            args.audit,
            HANG_SECONDS,
        )

    try:
        fuzz()
    except _TimeUp:
        pass
    stats.dump()


def worker(args: argparse.Namespace) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    scratch = args.out / "scratch" / f"worker-{args.worker}-{os.getpid()}"
    scratch.mkdir(parents=True)
    os.chdir(scratch)  # the payloads' marker would land here (harness.check_one looks for it)
    stats = Stats(
        args.out / "stats" / f"worker-{args.worker}-{os.getpid()}.json", args.out / "crashes", args.engine
    )
    stats.dump()
    if args.engine == "atheris":
        run_atheris(args, stats, scratch)
    else:
        run_hypothesis(args, stats, scratch)
    return 0


# --- supervisor --------------------------------------------------------------------------------


def pick_engine(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import atheris  # noqa: F401
    except ImportError:
        return "hypothesis"
    return "atheris"


def write_seeds(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for kind, files in _seed_inputs().items():
        for data in files:
            name = hashlib.sha1(kind.encode() + data).hexdigest()[:16]
            (folder / f"{kind}-{name}").write_bytes(bytes([harness.KINDS.index(kind)]) + data)
            count += 1
    return count


DEATH = re.compile(r"ERROR: libFuzzer: ([a-z -]+)|==\d+== ERROR: libFuzzer: ([a-z -]+)")


def _death_reason(log: Path) -> str:
    text = log.read_text(errors="replace")[-20000:] if log.exists() else ""
    found = DEATH.findall(text)
    return (found[-1][0] or found[-1][1]).strip() if found else "exited early"


def summarize(out: Path, engine: str, workers: int, seconds: float, deaths: list[str]) -> dict[str, Any]:
    inputs, crashes = 0, 0
    outcomes: Counter[str] = Counter()
    unique: dict[str, dict[str, Any]] = {}
    for stats_file in sorted((out / "stats").glob("*.json")):
        stats = json.loads(stats_file.read_text())
        inputs += stats["inputs"]
        crashes += stats["crashes"]
        outcomes.update(stats["outcomes"])
        for signature, entry in stats["unique_crashes"].items():
            merged = unique.setdefault(signature, {"count": 0, "example": entry["example"]})
            merged["count"] += entry["count"]
    per_kind = {
        kind: sum(n for key, n in outcomes.items() if key.startswith(kind + "/")) for kind in harness.KINDS
    }
    per_label: Counter[str] = Counter()
    for key, count in outcomes.items():
        per_label[key.split("/", 1)[1]] += count
    executed = markers(out / "scratch")
    return {
        "engine": engine,
        "workers": workers,
        "seconds": round(seconds, 1),
        "inputs_tried": inputs,
        "inputs_per_reader": per_kind,
        "accepted": per_label["accepted"],
        "rejected": per_label["rejected"],
        "code_execution_attempts_blocked": per_label["blocked-exec"],
        "crashes": crashes + len(deaths) + len(executed),
        "crashing_inputs": crashes,
        "unique_crashes": unique,
        "worker_deaths": deaths,
        "code_executed": len(executed),
    }


def markers(scratch: Path) -> list[str]:
    """Payload marker files under scratch; workers create and delete temp folders meanwhile,
    so a folder vanishing during the walk is skipped, not an error."""
    return [
        os.path.join(folder, harness.MARKER)
        for folder, _, files in os.walk(scratch, onerror=lambda _error: None)
        if harness.MARKER in files
    ]


def supervise(args: argparse.Namespace) -> int:
    engine = pick_engine(args.engine)
    out: Path = args.out
    for sub in ("stats", "crashes", "logs", "scratch"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in (out / sub).glob("*"):
            if old.is_file():
                old.unlink()
    seeds = write_seeds(out / "seeds")
    start = time.time()
    deadline = start + args.seconds
    print(
        f"tieaudit fuzz: {engine}, {args.workers} workers, {args.seconds} s, {seeds} seeds, out {out}",
        file=sys.stderr,
    )

    def launch(index: int) -> tuple[subprocess.Popen[bytes], Path]:
        log = out / "logs" / f"worker-{index}-{time.time_ns()}.log"
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(index), "--engine", engine]
        command += ["--deadline", str(deadline), "--out", str(out), *([] if args.audit else ["--no-audit"])]
        handle = log.open("wb")
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT), log

    running = {index: launch(index) for index in range(args.workers)}
    deaths: list[str] = []
    last_report = time.time()
    while running:
        time.sleep(0.5)
        for index, (process, log) in list(running.items()):
            if process.poll() is None:
                if time.time() > deadline + HANG_SECONDS + 15:
                    process.kill()  # stuck inside one input past every limit: a hang
                    process.wait()
                    del running[index]
                    deaths.append(
                        f"worker {index}: hung, killed {time.time() - deadline:.0f} s after the deadline"
                    )
                continue
            del running[index]
            if process.returncode != 0 or time.time() < deadline - 1:
                deaths.append(f"worker {index}: {_death_reason(log)} (exit {process.returncode}, log {log})")
            if time.time() < deadline - 1:
                running[index] = launch(index)  # the rest of the time goes on with a fresh worker
        if time.time() - last_report > 60 and running:
            last_report = time.time()
            partial = summarize(out, engine, args.workers, time.time() - start, deaths)
            print(
                f"  {partial['seconds']:.0f} s: {partial['inputs_tried']} inputs, "
                f"{partial['crashes']} crashes, "
                f"{partial['code_execution_attempts_blocked']} code-execution attempts blocked",
                file=sys.stderr,
            )
    summary = summarize(out, engine, args.workers, time.time() - start, deaths)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(
        f"tieaudit fuzz: {summary['inputs_tried']} inputs tried in {summary['seconds']:.0f} s, "
        f"{summary['crashes']} crashes, {summary['code_execution_attempts_blocked']} code-execution attempts "
        f"blocked, {summary['code_executed']} code executed",
        file=sys.stderr,
    )
    return 1 if summary["crashes"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="How long to fuzz. [default: 60]")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Worker processes.")
    parser.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
    parser.add_argument("--out", type=Path, default=HERE / "out", help="Seeds, crashes, logs, summary.")
    parser.add_argument(
        "--no-audit", dest="audit", action="store_false", help="Readers only (no graph, rules)."
    )
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    return worker(args) if args.worker is not None else supervise(args)


if __name__ == "__main__":
    sys.exit(main())
