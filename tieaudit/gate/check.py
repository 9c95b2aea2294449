"""The CI gate over files and folders: discover, audit in parallel, apply policy and baseline, verdict."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

from tieaudit.audit import Audit
from tieaudit.core.errors import UsageError
from tieaudit.core.exit_codes import ExitCode
from tieaudit.formats.hf_cache import CacheSnapshot
from tieaudit.gate import CONNECT_TIMEOUT_S
from tieaudit.gate.across import cross_file_copies
from tieaudit.gate.baseline import Baseline, fingerprint
from tieaudit.gate.discover import Discovery, PathError, discover
from tieaudit.gate.executors import open_executor
from tieaudit.gate.files import LFS_POINTER, FileVerdict
from tieaudit.gate.glob_use import policy_glob_warnings
from tieaudit.gate.progress import ProgressBar
from tieaudit.gate.tasks import Executor, Outcomes, Work
from tieaudit.gate.verdicts import data_covered, final_verdicts, lfs_skip
from tieaudit.rules.finding import Finding, Severity
from tieaudit.rules.policy import Policy

__all__ = ["CheckResult", "CheckSummary", "Checked", "PathError", "check_paths", "run_check"]


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

    @property
    def passed(self) -> bool:
        """The gate passes: every path audited, none failing (``tieaudit check`` exits 0)."""
        return self.exit_code() == ExitCode.OK

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


def check_paths(
    paths: str | Sequence[str],
    policy: Policy | None = None,
    *,
    exclude: Sequence[str] = (),
    jobs: int | None = None,
    baseline: Baseline | None = None,
) -> CheckResult:
    """``tieaudit check PATH...`` as a library call: every checkpoint under paths (files, folders,
    ``org/name`` repository ids in the local Hugging Face cache) audited under policy (the defaults
    when None; ``load_policy(file)`` reads a tieaudit.toml), in jobs processes. A path that cannot be
    audited is recorded in ``errors``, never raised; ``passed`` is the gate's verdict. Raises UsageError
    when the paths hold no checkpoint at all (``nothing scanned``)."""
    arguments = [paths] if isinstance(paths, str) else list(paths)
    return run_check(arguments, policy or Policy(), exclude=exclude, jobs=jobs, baseline=baseline)


def audit_all(work: Work, executor: Executor, progress: bool) -> Outcomes:
    """Audit (path, policy) pairs on executor, in order, with a progress bar when asked."""
    with ProgressBar(len(work), enabled=progress) as bar:
        return executor.audit(work, bar)


def run_check(
    arguments: Sequence[str],
    policy: Policy,
    *,
    exclude: Sequence[str] = (),
    jobs: int | None = None,
    executor: str = "local",
    connect_timeout: float = CONNECT_TIMEOUT_S,
    baseline: Baseline | None = None,
    fingerprint_root: str = ".",
    progress: bool = False,
    skip_lfs_pointers: bool = False,
) -> CheckResult:
    """Audit every checkpoint the arguments name; a bad path is recorded, never stops the others.
    With skip_lfs_pointers a Git LFS pointer (or a model folder holding one) is skipped, not an error.
    executor: where the audits run (``local``: jobs processes, default the CPU count; ``dask://ADDRESS``:
    that Dask scheduler's workers, reached within connect_timeout seconds); the result is the same."""
    if policy.runtime:  # once, before any audit, not once per ONNX file
        from tieaudit.runtime.measure import require_runtime

        require_runtime("check --runtime")
    with open_executor(executor, jobs=jobs, connect_timeout=connect_timeout) as (runner, ignored):
        found = discover(arguments, exclude, base=policy.root)
        if not found.targets and not found.errors:
            why = _why_none(found.files, exclude)
            raise UsageError(f"nothing scanned: no checkpoints under {', '.join(arguments)}{why}")
        policies = [policy.for_path(t.path) for t in found.targets]
        work = [(t.path, p) for t, p in zip(found.targets, policies, strict=True)]
        outcomes = audit_all(work, runner, progress)
    roots = [os.path.abspath(s.folder) for _, s in found.from_cache]
    roots += [os.path.abspath(a) for a in arguments if os.path.isdir(a)]
    paths = [t.path for t in found.targets]
    outcomes, across_warnings = cross_file_copies(paths, outcomes, policies, roots=roots)
    outcomes = [_as_given(outcome, found.from_cache) for outcome in outcomes]
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
        warnings=ignored + tuple(across_warnings) + _warnings(found, policy, arguments, exclude=exclude),
    )


def _as_given(
    outcome: Audit | PathError, from_cache: Sequence[tuple[str, CacheSnapshot]]
) -> Audit | PathError:
    """The outcome with its fixes naming a cache snapshot's folder by the repository id given for
    it (``Audit.as_given``): ``tieaudit retie org/name ./name-retied``, not the snapshot's path."""
    if isinstance(outcome, PathError):
        return outcome
    for given, snapshot in from_cache:
        outcome = outcome.as_given(snapshot.folder, given)
    return outcome


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
