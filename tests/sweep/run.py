"""Run the sweep: every (class, variant) in a worker process with a timeout and a memory cap.

    python -m tests.sweep.run [--classes A,B ...] [--variants on/hf-clone,...] [--jobs N]
                              [--out report.json] [--timeout S] [--memory GIB] [--keep DIR]

Workers import torch and transformers once and take the cases of one class after another (a
class's built models and truth are reused across its variants). A case that exceeds the timeout
or kills its worker (memory cap, crash) is recorded as such, and a fresh worker takes the
remaining cases. The table goes to stdout, the JSON report to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, TextIO

from tests.sweep import models
from tests.sweep.variants import FORMS

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def plan(names: Iterable[str], only: set[str] | None) -> list[tuple[str, list[str]]]:
    """(class, variants) in sweep order; only filters the variants (``on/hf-clone``)."""
    subjects = models.subjects()
    out = []
    for name in names:
        subject = subjects[name]
        # With the switch off nothing is tied, so there is no tied name to diverge.
        cases = [f"{s}/{f}" for s in subject.settings for f in FORMS if f"{s}/{f}" != "off/hf-diverged"]
        out.append((name, [c for c in cases if only is None or c in only]))
    return out


# --- worker ----------------------------------------------------------------------------------------


def worker(work: str) -> None:
    """One JSON request per stdin line, one JSON result per line on the original stdout."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library prints (tqdm, warnings) go to stderr, never into the protocol
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()
    from tests.sweep.case import Context, run_case

    ctx = Context(work)
    for line in sys.stdin:
        request = json.loads(line)
        result = run_case(ctx, request["class"], request["variant"], keep=request.get("keep", False))
        protocol.write(json.dumps(result) + "\n")


class Worker:
    """A worker process and the reading end of its protocol."""

    def __init__(self, work: str, memory: int, log: TextIO) -> None:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

        env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "tests.sweep.run", "--worker", "--work", work]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            env=env, cwd=str(models.ROOT), preexec_fn=limit, start_new_session=True,
        )  # fmt: skip

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # this worker only (its own session), by its pid
        self.proc.wait()


def sweep(
    work_plan: list[tuple[str, list[str]]], jobs: int, timeout: float, memory: int, work: str,
    keep: bool, log: TextIO, progress: TextIO | None = sys.stderr,
) -> list[dict[str, Any]]:  # fmt: skip
    """Run every case; results in plan order."""
    todo: queue.Queue[tuple[int, str, list[str]]] = queue.Queue()
    for index, (name, cases) in enumerate(work_plan):
        todo.put((index, name, cases))
    results: dict[tuple[int, int], dict[str, Any]] = {}
    total = sum(len(c) for _, c in work_plan)
    lock = threading.Lock()

    def slot() -> None:
        current: Worker | None = None
        while True:
            try:
                index, name, cases = todo.get_nowait()
            except queue.Empty:
                break
            for position, variant in enumerate(cases):
                current = current or Worker(work, memory, log)
                started = time.monotonic()
                result = current.ask({"class": name, "variant": variant, "keep": keep}, timeout)
                if result is None:
                    died = current.proc.poll() is not None
                    current.stop()
                    current = None
                    status = "crashed" if died else "timeout"
                    reason = f"worker {'died' if died else f'exceeded {timeout:.0f} s'}"
                    seconds = round(time.monotonic() - started, 2)
                    result = {"class": name, "variant": variant, "status": status, "reason": reason,
                              "seconds": seconds, "disagreements": [], "notes": []}  # fmt: skip
                with lock:
                    results[(index, position)] = result
                    if progress is not None:
                        progress.write(f"[{len(results)}/{total}] {name} {variant}: {result['status']}\n")
                        progress.flush()
        if current is not None:
            current.stop()

    threads = [threading.Thread(target=slot) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[k] for k in sorted(results)]


# --- report ----------------------------------------------------------------------------------------


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    statuses = Counter(r["status"] for r in results)
    causes: dict[str, list[str]] = defaultdict(list)
    for r in results:
        for d in r["disagreements"]:
            causes[d["cause"]].append(f"{r['class']} {r['variant']}")
    classes = {r["class"] for r in results}
    agreeing = {
        c for c in classes if all(r["status"] in ("agree", "n/a") for r in results if r["class"] == c)
    }
    return {
        "cases": len(results), "statuses": dict(statuses), "classes": len(classes),
        "classes_agreeing": len(agreeing), "causes": {k: len(v) for k, v in sorted(causes.items())},
    }  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        rows[r["class"]].append(r)
    mark = {"agree": "ok", "disagree": "NO", "n/a": "-", "cannot-build": "build?", "error": "ERR",
            "timeout": "TIME", "crashed": "DIED"}  # fmt: skip
    lines = []
    for name, rs in rows.items():
        cells = " ".join(f"{r['variant']}={mark.get(r['status'], r['status'])}" for r in rs)
        causes = sorted({d["cause"] for r in rs for d in r["disagreements"]})
        lines.append(f"{name:52} {cells}" + (f"  [{', '.join(causes)}]" if causes else ""))
    s = summary(results)
    lines.append(
        f"\n{s['cases']} cases over {s['classes']} classes: {s['statuses']}; "
        f"{s['classes_agreeing']} classes agree on every case"
    )
    lines += [f"  {cause}: {count}" for cause, count in s["causes"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sweep.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", nargs="*", help="class names (comma or space separated); default all")
    parser.add_argument("--variants", help="comma-separated setting/form (on/hf-clone,...); default all")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--memory", type=float, default=4.0, help="GiB of address space per worker")
    parser.add_argument("--keep", help="write the cases' files under this folder and keep them")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.work)
        return 0
    subjects = models.subjects()
    names = [n for arg in args.classes or [] for n in arg.split(",") if n] or list(subjects)
    unknown = [n for n in names if n not in subjects]
    if unknown:
        parser.error(f"not in the sweep: {', '.join(unknown)}")
    only = set(args.variants.split(",")) if args.variants else None
    work = args.keep or tempfile.mkdtemp(prefix="tieaudit-sweep-")
    os.makedirs(work, exist_ok=True)
    started = time.monotonic()
    with open(os.path.join(work, "workers.log"), "w") as log:
        results = sweep(plan(names, only), args.jobs, args.timeout, int(args.memory * (1 << 30)), work,
                        bool(args.keep), log)  # fmt: skip
    seconds = round(time.monotonic() - started, 1)
    print(table(results))
    print(f"{seconds} s with --jobs {args.jobs}")
    if args.out:
        report = {"schema": "tieaudit.sweep/1", "table": str(models.table_path()), "jobs": args.jobs,
                  "seconds": seconds, "summary": summary(results), "results": results}  # fmt: skip
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
