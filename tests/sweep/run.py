"""Run the sweep: every (class, variant) in a worker process with a timeout and a memory cap.

    python -m tests.sweep.run [--classes A,B ...] [--variants on/hf-clone,...] [--jobs N]
                              [--out report.json] [--markdown LAST_RUN.md] [--timeout S]
                              [--deadline S] [--memory GIB] [--keep DIR]

Workers import torch and transformers once and take the cases of one class after another (a
class's built models and truth are reused across its variants). A case that exceeds the timeout
or kills its worker (memory cap, crash) is recorded as such, and a fresh worker takes the
remaining cases. With --deadline no class is started after that many seconds (classes are
taken in sweep order, so a cut-off run covers a prefix of it; the report names the classes not
run). Each result is appended to ``<out>.jsonl`` as it arrives, so an interrupted run keeps what
it did. The table goes to stdout, the JSON report to --out, the summary to --markdown.
"""

from __future__ import annotations

import argparse
import contextlib
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
    keep: bool, log: TextIO, progress: TextIO | None = sys.stderr, deadline: float | None = None,
    sink: TextIO | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Run every case; results in plan order. deadline: seconds after which no class is started
    (its cases are left out of the results); sink: each result as a JSON line as it arrives."""
    begun = time.monotonic()
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
            if deadline is not None and time.monotonic() - begun > deadline:
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
                    if sink is not None:
                        sink.write(json.dumps(result) + "\n")
                        sink.flush()
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


def markdown(
    results: list[dict[str, Any]], names: list[str], meta: dict[str, Any], detail_width: int = 240
) -> str:
    """LAST_RUN.md: what was run, counts per variant and per cause, every disagreement with its
    cause and detail, every case that did not run to an answer with its reason."""
    s = summary(results)
    ran = list(dict.fromkeys(r["class"] for r in results))
    left = [n for n in names if n not in set(ran)]
    lines = [
        "# Architecture sweep: last run",
        "",
        "Written by `python -m tests.sweep.run --markdown` (`make sweep`); the full per-case report "
        f"is the JSON next to it. Command: `{meta['command']}`.",
        "",
        f"- tieaudit commit {meta['commit']}, transformers {meta['transformers']}, torch {meta['torch']}",
        f"- started {meta['started']} UTC, {meta['seconds']} s wall with {meta['jobs']} worker processes "
        f"(nice {meta['nice']}), per-case timeout {meta['timeout']:.0f} s",
        f"- classes: {len(ran)} run of the {len(names)} asked for"
        + (f" (every class of the table from {ran[0]} to {ran[-1]}, in sweep order)" if ran else ""),
    ]
    if left:
        shown = ", ".join(left[:8]) + (", ..." if len(left) > 8 else "")
        lines.append(f"- NOT run ({len(left)} classes, the deadline of {meta['deadline']} s passed): {shown}")
    statuses = Counter(r["status"] for r in results)
    lines += [
        f"- cases: {len(results)} (class x setting x form); "
        + ", ".join(f"{k} {v}" for k, v in statuses.most_common()),
        f"- classes agreeing on every case (n/a counted as agreeing): {s['classes_agreeing']} of {len(ran)}",
        "",
        "## Per variant",
        "",
        "| variant | " + " | ".join(k for k, _ in statuses.most_common()) + " |",
        "|---|" + "---|" * len(statuses),
    ]
    by_variant: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        by_variant[r["variant"]][r["status"]] += 1
    for variant in sorted(by_variant):
        counts = by_variant[variant]
        lines.append(f"| {variant} | " + " | ".join(str(counts[k]) for k, _ in statuses.most_common()) + " |")
    per_cause: dict[str, list[tuple[dict[str, Any], str]]] = defaultdict(list)
    for r in results:
        seen: dict[str, str] = {}
        for d in r["disagreements"]:
            seen.setdefault(d["cause"], d["detail"])
        for cause, detail in seen.items():
            per_cause[cause].append((r, detail))
    lines += ["", "## Disagreements by cause (cases with the cause; one example each)", ""]
    lines += ["| cause | cases | classes | example (class, variant: detail) |", "|---|---|---|---|"]
    for cause, items in sorted(per_cause.items(), key=lambda kv: -len(kv[1])):
        r, detail = items[0]
        example = _cell(f"{r['class']} {r['variant']}: {detail}", detail_width)
        lines.append(f"| {cause} | {len(items)} | {len({i[0]['class'] for i in items})} | {example} |")
    ambiguous = [r for r in results if r["status"] == "ambiguous"]
    if ambiguous:
        title = "## Ambiguous ground truth (transformers' own save_pretrained folder shows the same)"
        lines += ["", title, ""]
        lines += [f"- {r['class']} {r['variant']}: {_cell('; '.join(r['ambiguous']), detail_width)}"
                  for r in ambiguous]  # fmt: skip
    unresolved = [r for r in results if r["status"] == "unresolved"]
    if unresolved:
        lines += ["", "## Announced by tieaudit as not resolved (its disagreements are listed below too)", ""]
        lines += [f"- {r['class']} {r['variant']}: {_cell(r['unresolved'], detail_width)}"
                  for r in unresolved]  # fmt: skip
    other = [r for r in results if r["status"] not in ("agree", "disagree", "n/a", "ambiguous", "unresolved")]
    if other:
        lines += ["", "## Cases without an answer (cannot-build, error, timeout, crashed)", ""]
        lines += [f"- {r['class']} {r['variant']}: {r['status']}: {_cell(r.get('reason', ''), detail_width)}"
                  for r in other]  # fmt: skip
    lines += ["", "## Every disagreement", ""]
    for cause, items in sorted(per_cause.items()):
        lines += [f"### {cause} ({len(items)} cases)", ""]
        lines += [f"- {r['class']} {r['variant']}: {_cell(detail, detail_width)}" for r, detail in items]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str, width: int) -> str:
    """One line for a Markdown table: whitespace collapsed, pipes escaped, sweep folders elided."""
    import re

    text = re.sub(r"/tmp/tieaudit-sweep-[^/ ]+/", "<work>/", text)
    text = re.sub(r"\s+", " ", text).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def _meta(args: argparse.Namespace, argv: list[str] | None, seconds: float) -> dict[str, Any]:
    import importlib.metadata as md

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=models.ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "command": "python -m tests.sweep.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": commit or "?", "transformers": md.version("transformers"), "torch": md.version("torch"),
        "started": args.started, "seconds": seconds, "jobs": args.jobs, "nice": os.nice(0),
        "timeout": args.timeout, "deadline": args.deadline,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sweep.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", nargs="*", help="class names (comma or space separated); default all")
    parser.add_argument("--variants", help="comma-separated setting/form (on/hf-clone,...); default all")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="the JSON report (results also go to <out>l as they come)")
    parser.add_argument("--markdown", help="write the summary (LAST_RUN.md) here")
    parser.add_argument("--deadline", type=float, help="start no class after this many seconds")
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
    args.started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(os.path.join(work, "workers.log"), "w"))
        sink = stack.enter_context(open(args.out + "l", "w")) if args.out else None
        results = sweep(plan(names, only), args.jobs, args.timeout, int(args.memory * (1 << 30)), work,
                        bool(args.keep), log, deadline=args.deadline, sink=sink)  # fmt: skip
    seconds = round(time.monotonic() - started, 1)
    print(table(results))
    print(f"{seconds} s with --jobs {args.jobs}")
    meta = _meta(args, argv, seconds)
    if args.out:
        ran = {r["class"] for r in results}
        report = {"schema": "tieaudit.sweep/1", "table": str(models.table_path()), **meta,
                  "not_run": [n for n in names if n not in ran], "summary": summary(results),
                  "results": results}  # fmt: skip
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(markdown(results, names, meta))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
