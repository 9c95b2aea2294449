"""The task every executor maps: audit one checkpoint (path and policy in, a picklable Audit or
PathError out), and what executors are. Kept apart from the executors so a remote one's workers
unpickle the task without importing them."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Protocol

from tieaudit.audit import Audit, audit_path
from tieaudit.core.errors import OUT_OF_MEMORY, ExternalDataError, LfsPointerError, TieauditError
from tieaudit.gate.discover import PathError
from tieaudit.gate.progress import ProgressBar
from tieaudit.rules.policy import Policy

Work = list[tuple[str, Policy]]
"""Checkpoint paths with the policy each is audited under."""
Outcomes = list[Audit | PathError]
"""One per path of the Work, in its order."""


def _message(path: str, exc: TieauditError) -> str:
    """The error's line for path: a file inside it (a model folder's shard) named first."""
    if not exc.path or os.path.abspath(exc.path) == os.path.abspath(path):
        return exc.message if exc.path else str(exc)
    inner = os.path.relpath(os.path.abspath(exc.path), os.path.abspath(path))
    return f"{inner if not inner.startswith('..') else exc.path}: {exc.message}"


def _audit(path: str, policy: Policy) -> Audit | PathError:
    try:
        return audit_path(path, policy)
    except TieauditError as exc:
        return PathError(
            path=path,
            message=_message(path, exc),
            lfs_pointer=isinstance(exc, LfsPointerError),
            data_of=exc.models if isinstance(exc, ExternalDataError) else (),
        )
    except MemoryError:  # this path's audit needed more than the process could get; the others go on
        return PathError(path=path, message=OUT_OF_MEMORY)


def _relative(outcome: Audit | PathError, prefix: str) -> Audit | PathError:
    """The outcome of auditing prefix + path as the audit of path in the folder prefix names it:
    prefix dropped from every path it names (the checkpoint's, the findings' text, and the paths of a
    fix's commands: their operands, rewritten as paths, never by editing the command's text)."""
    if isinstance(outcome, PathError):
        return PathError(
            path=outcome.path.replace(prefix, ""),
            message=outcome.message.replace(prefix, ""),
            lfs_pointer=outcome.lfs_pointer,
            data_of=tuple(m.replace(prefix, "") for m in outcome.data_of),
        )
    graph = copy.copy(outcome.graph)  # a copy keeps what the audit cached (optimizer maps, consumer ties)
    checkpoint = dataclasses.replace(graph.checkpoint, path=graph.checkpoint.path.replace(prefix, ""))
    object.__setattr__(graph, "checkpoint", checkpoint)
    findings = tuple(
        dataclasses.replace(
            f,
            message=f.message.replace(prefix, ""),
            fix=f.fix.with_paths(lambda path: path.removeprefix(prefix)) if f.fix is not None else None,
            details={k: v.replace(prefix, "") if isinstance(v, str) else v for k, v in f.details.items()},
        )
        for f in outcome.findings
    )
    return Audit(graph, findings)


def audit_one(path: str, policy: Policy, base: str | None = None) -> Audit | PathError:
    """Audit one checkpoint under its policy; bad input becomes a PathError. Pure: the outcome
    depends on the arguments and the files only, and pickles (it runs in a worker, local or remote).
    base: the folder a relative path is relative to, for a worker whose current folder is not the
    caller's (a remote one): the file read is base/path, and the outcome is the one auditing path
    in base gives (it names path as given)."""
    if base is None or os.path.isabs(path):
        return _audit(path, policy)
    prefix = os.path.join(base, "")
    return _relative(_audit(prefix + path, policy), prefix)


def audit_chunk(work: Work) -> Outcomes:
    """Several audits in one task: a task costs a round trip, small checkpoints take ~1 ms."""
    return [audit_one(path, policy) for path, policy in work]


class Executor(Protocol):
    """Runs audit_one over work; the outcomes come back in the order of work."""

    def audit(self, work: Work, bar: ProgressBar) -> Outcomes:
        """Audit every (path, policy), advancing bar as each finishes."""
