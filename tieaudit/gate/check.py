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
from tieaudit.core.errors import ExternalDataError, LfsPointerError, TieauditError, UsageError
from tieaudit.core.exit_codes import ExitCode
from tieaudit.formats.hf_cache import CacheSnapshot
from tieaudit.gate.baseline import Baseline, fingerprint
from tieaudit.gate.discover import Discovery, PathError, discover
from tieaudit.gate.files import LFS_POINTER, FileVerdict
from tieaudit.gate.glob_use import policy_glob_warnings
from tieaudit.gate.progress import ProgressBar
from tieaudit.gate.verdicts import data_covered, final_verdicts, lfs_skip
from tieaudit.rules.finding import Finding, Severity
from tieaudit.rules.policy import Policy

__all__ = ["CheckResult", "CheckSummary", "Checked", "PathError", "run_check"]

PRELOAD = (
    "tieaudit.rules.registry",
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


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
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
    files: tuple[FileVerdict, ...] = ()
    """Every file under the paths given (and every folder not entered), with its verdict."""
    skipped_pointers: tuple[PathError, ...] = ()
    """Checkpoints that are Git LFS pointers (or hold one), skipped under --skip-lfs-pointers."""
    from_cache: tuple[tuple[str, CacheSnapshot], ...] = ()
    """Repository ids given as PATHs, with the Hugging Face cache snapshot audited for each."""
    warnings: tuple[str, ...] = ()
    """Options that did nothing or matched in a way that will change: an --exclude pattern or a
    policy [[path]] glob that matched nothing, an --exclude written relative to a PATH argument."""

    @property
    def skipped_files(self) -> int:
        """Files under the paths given that were skipped (each with its reason in ``files``)."""
        return sum(f.verdict == "skipped" for f in self.files)

    @property
    def audits(self) -> tuple[Audit, ...]:
        """The audits alone."""
        return tuple(c.audit for c in self.checked)

    def exit_code(self, *, writing_baseline: bool = False, exit_zero: bool = False) -> ExitCode:
        """The gate's verdict. BAD_INPUT when the audit is incomplete or nothing was audited, whatever
        else holds; else OK when writing a baseline (every finding is being accepted) or, with
        exit_zero, whatever was found; else FINDINGS when a path fails, else OK."""
        if self.errors or not (self.checked or self.skipped_pointers):
            return ExitCode.BAD_INPUT
        if writing_baseline or exit_zero:
            return ExitCode.OK
        return ExitCode.FINDINGS if any(c.failing for c in self.checked) else ExitCode.OK

    def summary(self) -> CheckSummary:
        """Counts for the closing line and the check/1 document."""
        return CheckSummary(
            checkpoints=len(self.checked),
            failing=sum(bool(c.failing) for c in self.checked),
            errors=len(self.errors),
            findings=sum(len(c.audit.findings) for c in self.checked),
            baselined=sum(sum(c.baselined) for c in self.checked),
            stale_baseline_entries=self.stale,
            wasted_bytes=sum(c.audit.summary().wasted_bytes for c in self.checked),
        )


@dataclass(frozen=True, kw_only=True)
class CheckSummary:
    """Counts over every path of one check."""

    checkpoints: int
    """Checkpoints audited."""
    failing: int
    """Checkpoints with a finding at or above their fail-on that no baseline accepts."""
    errors: int
    """Paths that could not be audited or listed."""
    findings: int
    """Findings over every checkpoint."""
    baselined: int
    """Findings the baseline accepts."""
    stale_baseline_entries: int
    """Baseline entries no current finding matched."""
    wasted_bytes: int
    """Bytes the files spend on copies, over every checkpoint."""

    def as_dict(self) -> dict[str, int]:
        """The check/1 document's summary block."""
        return dataclasses.asdict(self)


def _message(path: str, exc: TieauditError) -> str:
    """The error's line for path: a file inside it (a model folder's shard) named first."""
    if not exc.path or os.path.abspath(exc.path) == os.path.abspath(path):
        return exc.message if exc.path else str(exc)
    inner = os.path.relpath(os.path.abspath(exc.path), os.path.abspath(path))
    return f"{inner if not inner.startswith('..') else exc.path}: {exc.message}"


def audit_one(path: str, policy: Policy) -> Audit | PathError:
    """Audit one checkpoint under its policy; bad input becomes a PathError (runs in a worker)."""
    try:
        return audit_path(path, policy)
    except TieauditError as exc:
        return PathError(
            path=path,
            message=_message(path, exc),
            lfs_pointer=isinstance(exc, LfsPointerError),
            data_of=exc.models if isinstance(exc, ExternalDataError) else (),
        )


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
        return [PathError(path=path, message=died) for path, _ in chunk]


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
    *,
    exclude: Sequence[str] = (),
    jobs: int = 1,
    baseline: Baseline | None = None,
    fingerprint_root: str = ".",
    progress: bool = False,
    skip_lfs_pointers: bool = False,
) -> CheckResult:
    """Audit every checkpoint the arguments name; a bad path is recorded, never stops the others.
    With skip_lfs_pointers a Git LFS pointer (or a model folder holding one) is skipped, not an error."""
    if policy.runtime:  # once, before any audit, not once per ONNX file
        from tieaudit.runtime.measure import require_runtime

        require_runtime("check --runtime")
    found = discover(arguments, exclude, base=policy.root)
    if not found.targets and not found.errors:
        raise UsageError(
            f"nothing scanned: no checkpoints under {', '.join(arguments)}{_why_none(found.files, exclude)}"
        )
    policies = [policy.for_path(t.path) for t in found.targets]
    outcomes = audit_all([(t.path, p) for t, p in zip(found.targets, policies, strict=True)], jobs, progress)
    audited = {
        os.path.abspath(t.path) for t, o in zip(found.targets, outcomes, strict=True) if isinstance(o, Audit)
    }
    accepted = baseline.fingerprints if baseline else frozenset()
    checked: list[Checked] = []
    errors = list(found.errors)
    pointers: list[PathError] = []
    resolved: list[Audit | PathError | FileVerdict] = []
    seen: set[str] = set()
    for target, outcome, path_policy in zip(found.targets, outcomes, policies, strict=True):
        if isinstance(outcome, PathError):
            covered = data_covered(outcome, audited)
            if outcome.lfs_pointer and skip_lfs_pointers:
                pointers.append(outcome)
                resolved.append(lfs_skip(target))
            elif covered is not None:
                resolved.append(covered)
            else:
                errors.append(outcome)
                resolved.append(outcome)
            continue
        resolved.append(outcome)
        prints = tuple(
            fingerprint(outcome.graph.checkpoint.path, f.rule, f.names, root=fingerprint_root)
            for f in outcome.findings
        )
        seen.update(prints)
        checked.append(
            Checked(
                audit=outcome,
                fail_on=path_policy.fail_on,
                fingerprints=prints,
                baselined=tuple(p in accepted for p in prints),
            )
        )
    single = len(arguments) == 1 and len(found.targets) == 1 and found.targets[0].explicit
    return CheckResult(
        checked=tuple(checked),
        errors=tuple(errors),
        single=single,
        baseline=baseline,
        stale=len(accepted - seen),
        files=final_verdicts(found.files, found.targets, resolved),
        skipped_pointers=tuple(pointers),
        from_cache=found.from_cache,
        warnings=_warnings(found, policy, arguments, exclude=exclude),
    )


def _warnings(
    found: Discovery, policy: Policy, arguments: Sequence[str], *, exclude: Sequence[str]
) -> tuple[str, ...]:
    """What matched nothing (or matched only by the old --exclude base), one line each."""
    lines = list(found.excludes.warnings(exclude, arguments)) if found.excludes else []
    lines += policy_glob_warnings(policy, [t.path for t in found.targets], arguments)
    return tuple(lines)


def _why_none(files: Sequence[FileVerdict], exclude: Sequence[str]) -> str:
    """Why a search found nothing to audit: Git LFS pointers where the weights should be, or --exclude."""
    pointers = sum(f.reason == LFS_POINTER for f in files)
    if pointers:
        return f" ({pointers} {'file is a' if pointers == 1 else 'files are'} {LFS_POINTER})"
    return " (--exclude left none)" if exclude else ""
