"""Copies across the files of one repository (TIE012): after every checkpoint under a folder
argument is audited, they are compared with each other (``graph.across``), and each later file
whose tensors an earlier one already holds gets one finding naming both files.

A repository is one folder argument (or the cache snapshot an ``org/name`` argument names): files
named one by one on the command line are separate inputs, not compared. The checkpoints are opened
again here, headers and memory maps only, as the audits opened them.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

from tieaudit.audit import Audit
from tieaudit.core.bytestore import OpenCheckpoint
from tieaudit.core.errors import InputError
from tieaudit.core.escape import printable
from tieaudit.formats import open_checkpoint
from tieaudit.gate.tasks import Outcomes
from tieaudit.graph.across import AcrossCopy, find_across
from tieaudit.rules.across import CROSS_FILE, cross_file_finding
from tieaudit.rules.finding import most_severe_first
from tieaudit.rules.policy import Policy

MAX_COMPARED_FILES = 256
"""Most checkpoints of one repository compared with each other; past it, the first ones are and a
warning says so (repositories hold a few; a folder of thousands of training snapshots is no
repository of one model)."""


def _repository(path: str, roots: Sequence[str]) -> str | None:
    """The folder argument path was found under (or is), if any."""
    absolute = os.path.abspath(path)
    for root in roots:
        if absolute == root or absolute.startswith(root.rstrip(os.sep) + os.sep):
            return root
    return None


def _files(target: str, files: Iterable[str]) -> str:
    """The files of target (a checkpoint file, or a model folder) that hold the given tensors."""
    folder = target if os.path.isdir(target) else os.path.dirname(target)
    return ", ".join(os.path.normpath(os.path.join(folder, f)) for f in sorted(set(files)))


def _wasted_names(audit: Audit) -> frozenset[str]:
    """Names whose bytes the file's own findings already count as wasted (a copy group's members,
    not its kept name): a cross-file copy of one of them wastes nothing more."""
    return frozenset(
        name
        for f in audit.findings
        if f.wasted_bytes and f.rule != CROSS_FILE.id
        for name in f.names
        if name != f.details.get("kept")
    )


def cross_file_copies(
    paths: Sequence[str],
    outcomes: Outcomes,
    policies: Sequence[Policy],
    *,
    roots: Sequence[str],
) -> tuple[Outcomes, list[str]]:
    """outcomes (one per path) with TIE012 added to the Audits of files repeating an earlier file's
    tensors, compared within each repository (roots: the folder arguments), and warning lines."""
    groups: dict[str, list[int]] = defaultdict(list)
    for at, (path, outcome) in enumerate(zip(paths, outcomes, strict=True)):
        root = _repository(path, roots)
        if root is not None and isinstance(outcome, Audit):
            groups[root].append(at)
    result = list(outcomes)
    warnings: list[str] = []
    for root, members in groups.items():
        if len(members) < 2:
            continue
        if len(members) > MAX_COMPARED_FILES:
            warnings.append(
                f"{printable(root)}: {len(members)} checkpoints; copies across files looked for among the "
                f"first {MAX_COMPARED_FILES} only (MAX_COMPARED_FILES)"
            )
            members = members[:MAX_COMPARED_FILES]
        warnings += _compare(members, paths, result, policies=policies)
    return result, warnings


def _open_all(members: list[int], paths: Sequence[str], opened: list[OpenCheckpoint]) -> str:
    """Open the checkpoints at members into opened; a warning line when one cannot be (it changed
    since its audit), else empty."""
    at = members[0]
    try:
        for at in members:
            opened.append(open_checkpoint(paths[at], bare_pickles=True))
    except (InputError, OSError) as exc:
        message = exc.message if isinstance(exc, InputError) else (exc.strerror or str(exc))
        return f"{printable(paths[at])}: not compared with the other files: {printable(message)}"
    return ""


def _compare(
    members: list[int], paths: Sequence[str], result: Outcomes, *, policies: Sequence[Policy]
) -> list[str]:
    """Compare the checkpoints at members (indices into paths) and add their findings to result."""
    opened: list[OpenCheckpoint] = []
    try:
        failed = _open_all(members, paths, opened)
        if failed:
            return [failed]
        min_bytes = min(policies[at].min_bytes for at in members)
        copies = find_across(opened, min_bytes)
    finally:
        for one in opened:
            one.close()
    by_pair: dict[tuple[int, int], list[AcrossCopy]] = defaultdict(list)
    for copy in copies:
        by_pair[(copy.first, copy.second)].append(copy)
    for (first, second), found in sorted(by_pair.items()):
        at = members[second]
        policy = policies[at]
        if CROSS_FILE.id in policy.ignore:
            continue
        audit = result[at]
        assert isinstance(audit, Audit)
        most = 2 * sum(c.nbytes for c in found) >= audit.graph.stored_bytes
        this = _files(paths[at], (c.second_file for c in found))
        original = _files(paths[members[first]], (c.first_file for c in found))
        counted = _wasted_names(audit)
        finding = cross_file_finding(found, this=this, original=original, whole=most, counted=counted)
        finding = dataclasses.replace(finding, severity=policy.severity.get(CROSS_FILE.id, finding.severity))
        result[at] = dataclasses.replace(audit, findings=most_severe_first((*audit.findings, finding)))
    return []
