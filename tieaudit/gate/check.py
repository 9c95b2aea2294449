"""The CI gate over files and folders: discover, audit in parallel, apply policy and baseline, verdict."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import signal
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from tieaudit.audit import Audit, audit_path
from tieaudit.core.errors import TieauditError, UsageError
from tieaudit.core.units import human_bytes
from tieaudit.gate.baseline import Baseline, fingerprint
from tieaudit.gate.discover import PathError, discover
from tieaudit.gate.progress import ProgressBar
from tieaudit.rules.policy import Policy
from tieaudit.rules.registry import RULES, SEVERITY_RANK, Finding, Severity

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "CheckResult", "Checked", "PathError", "run_check"]

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
PRELOAD = (
    "tieaudit.rules.evaluate",
    "tieaudit.formats.safetensors",
    "tieaudit.formats.torch_file",
    "tieaudit.formats.onnx_model",
    "tieaudit.formats.hf_dir",
)
"""Modules every audit imports lazily; imported before forking workers."""

Work = list[tuple[str, Policy]]
"""Checkpoint paths with the policy each is audited under."""
Outcomes = list[Audit | PathError]
"""One per path of the Work, in its order."""


@dataclass(frozen=True)
class Checked:
    """One audited checkpoint and the gate's view of it."""

    audit: Audit
    """The audit, with TIE009 added when the policy caps wasted bytes."""
    fail_on: Severity
    """The fail-on that applies to this path (command line, else [[path]] entries, else default)."""
    fingerprints: tuple[str, ...]
    """One per finding, in order: sha256 of relative path, rule and sorted names."""
    baselined: tuple[bool, ...]
    """One per finding: accepted by the baseline, so it does not fail the gate."""

    @property
    def path(self) -> str:
        """The checkpoint path as audited."""
        return self.audit.graph.checkpoint.path

    @property
    def failing(self) -> tuple[Finding, ...]:
        """Findings at or above fail_on that the baseline does not accept."""
        failing = {id(f) for f in self.audit.failing(self.fail_on)}
        findings = zip(self.audit.findings, self.baselined, strict=True)
        return tuple(f for f, accepted in findings if not accepted and id(f) in failing)


@dataclass(frozen=True)
class CheckResult:
    """Every checkpoint audited, the paths that could not be, and the verdict."""

    checked: tuple[Checked, ...]
    """One per audited checkpoint, in discovery order."""
    errors: tuple[PathError, ...]
    """Paths that could not be audited or listed."""
    single: bool = False
    """One path was given and it is one checkpoint: JSON keeps the tieaudit.report/1 shape."""
    baseline: Baseline | None = None
    """The baseline findings were matched against."""
    stale: int = 0
    """Baseline entries no current finding matched (fixed since, or moved)."""

    @property
    def audits(self) -> tuple[Audit, ...]:
        """The audits alone."""
        return tuple(c.audit for c in self.checked)

    def exit_code(self) -> int:
        """2 when incomplete or nothing was audited, else 1 when a path fails, else 0."""
        if self.errors or not self.checked:
            return EXIT_ERROR
        return EXIT_FINDINGS if any(c.failing for c in self.checked) else EXIT_CLEAN

    def summary(self) -> dict[str, int]:
        """Counts for the closing line and the check/1 document."""
        return {
            "checkpoints": len(self.checked),
            "failing": sum(bool(c.failing) for c in self.checked),
            "errors": len(self.errors),
            "findings": sum(len(c.audit.findings) for c in self.checked),
            "baselined": sum(sum(c.baselined) for c in self.checked),
            "stale_baseline_entries": self.stale,
            "wasted_bytes": sum(c.audit.summary()["wasted_bytes"] for c in self.checked),
        }


def cap_finding(audit: Audit, policy: Policy) -> Finding | None:
    """TIE009 when the checkpoint's findings waste more than max-wasted-bytes."""
    cap, wasted = policy.max_wasted_bytes, audit.summary()["wasted_bytes"]
    if cap is None or wasted <= cap or "TIE009" in policy.ignore:
        return None
    names = sorted({name for f in audit.findings if f.wasted_bytes for name in f.names})
    return Finding(
        "TIE009",
        policy.severity.get("TIE009", RULES["TIE009"].severity),
        tuple(names),
        f"copies waste {human_bytes(wasted)} ({wasted} bytes), more than the policy's "
        f"max-wasted-bytes of {human_bytes(cap)} ({cap} bytes).",
        fix=f"re-tie the copies (tieaudit retie {audit.graph.checkpoint.path} OUT) or raise max-wasted-bytes",
        details={"wasted_bytes": wasted, "max_wasted_bytes": cap},
    )


def audit_one(path: str, policy: Policy) -> Audit | PathError:
    """Audit one checkpoint under its policy; bad input becomes a PathError (runs in a worker)."""
    try:
        audit = audit_path(path, policy)
    except TieauditError as exc:
        return PathError(path, exc.message if exc.path else str(exc))
    capped = cap_finding(audit, policy)
    if capped is None:
        return audit
    # the order rules.evaluate gives: most severe first, then by rule
    findings = sorted((*audit.findings, capped), key=lambda f: (-SEVERITY_RANK[f.severity], f.rule))
    return dataclasses.replace(audit, findings=tuple(findings))


def _quiet_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle, once


def audit_chunk(work: Work) -> Outcomes:
    """Several audits in one task: a task costs a round trip, small checkpoints take ~1 ms."""
    return [audit_one(path, policy) for path, policy in work]


def _stored_bytes(path: str) -> int:
    try:
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        return os.path.getsize(path)
    except OSError:
        return 0


def chunks(work: Work, workers: int) -> list[Work]:
    """Consecutive runs of about 1/(4 x workers) of the bytes each: few round trips, and a
    large checkpoint gets a task of its own so the others keep every worker busy."""
    sizes = [_stored_bytes(path) for path, _ in work]
    budget = max(1, sum(sizes) // (4 * workers))
    result: list[Work] = [[]]
    filled = 0
    for item, size in zip(work, sizes, strict=True):
        if result[-1] and filled + size > budget:
            result.append([])
            filled = 0
        result[-1].append(item)
        filled += size
    return result


def _collect(future: Future[Outcomes], chunk: Work) -> Outcomes:
    try:
        return future.result()
    except BrokenProcessPool:
        died = "the audit process died before finishing (out of memory?)"
        return [PathError(path, died) for path, _ in chunk]


def _preload(paths: list[str]) -> None:
    """Import what every worker needs once, here: forked workers share it instead of each paying."""
    modules = list(PRELOAD)
    if any(path.endswith(".onnx") for path in paths):
        modules.append("onnx")  # the ONNX reader's own lazy import, ~0.3 s per process otherwise
    for module in modules:
        with contextlib.suppress(ImportError):  # a speed-up only: a worker importing it reports why
            importlib.import_module(module)


def _audit_in_pool(work: Work, workers: int, bar: ProgressBar) -> Outcomes:
    _preload([path for path, _ in work])
    parts = chunks(work, workers)
    # fork: workers inherit the imported modules, and no thread runs yet (the bar starts later).
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    context = multiprocessing.get_context(method)
    pool = ProcessPoolExecutor(min(workers, len(parts)), context, initializer=_quiet_worker)
    try:
        futures = {pool.submit(audit_chunk, part): i for i, part in enumerate(parts)}
        outcomes: list[Outcomes] = [[] for _ in parts]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for future in done:
                index = futures[future]
                outcomes[index] = _collect(future, parts[index])
                bar.advance(len(parts[index]))
            bar.tick()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [outcome for part in outcomes for outcome in part]


def audit_all(work: Work, jobs: int, progress: bool) -> Outcomes:
    """Audit (path, policy) pairs, in order; jobs > 1 runs them in that many processes."""
    with ProgressBar(len(work), enabled=progress) as bar:
        if jobs <= 1 or len(work) <= 1:
            outcomes: Outcomes = []
            for path, policy in work:
                outcomes.append(audit_one(path, policy))
                bar.advance()
            return outcomes
        return _audit_in_pool(work, min(jobs, len(work)), bar)


def default_jobs() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def run_check(
    arguments: Sequence[str],
    policy: Policy,
    exclude: Sequence[str] = (),
    jobs: int = 1,
    baseline: Baseline | None = None,
    fingerprint_root: str = ".",
    progress: bool = False,
) -> CheckResult:
    """Audit every checkpoint the arguments name; a bad path is recorded, never stops the others."""
    found = discover(arguments, exclude)
    if not found.targets and not found.errors:
        after = " (--exclude left none)" if exclude else ""
        raise UsageError(f"nothing scanned: no checkpoints under {', '.join(arguments)}{after}")
    policies = [policy.for_path(t.path) for t in found.targets]
    outcomes = audit_all([(t.path, p) for t, p in zip(found.targets, policies, strict=True)], jobs, progress)
    accepted = baseline.fingerprints if baseline else frozenset()
    checked: list[Checked] = []
    errors = list(found.errors)
    seen: set[str] = set()
    for outcome, path_policy in zip(outcomes, policies, strict=True):
        if isinstance(outcome, PathError):
            errors.append(outcome)
            continue
        prints = tuple(
            fingerprint(outcome.graph.checkpoint.path, f.rule, f.names, fingerprint_root)
            for f in outcome.findings
        )
        seen.update(prints)
        checked.append(Checked(outcome, path_policy.fail_on, prints, tuple(p in accepted for p in prints)))
    single = len(arguments) == 1 and len(found.targets) == 1 and found.targets[0].explicit
    return CheckResult(tuple(checked), tuple(errors), single, baseline, len(accepted - seen))
