"""Baselines: findings a team has accepted, so that only new ones fail the gate.

A finding's fingerprint is the sha256 of the compact JSON array ``[path, rule, sorted names]``,
path relative to the baseline file's folder with / separators: it survives moving the checkout
and changes when the finding moves to another checkpoint, rule or set of tensors. A checkpoint in a
Hugging Face cache snapshot is named ``hf://ORG/NAME[/file]`` instead: a new revision of the model
keeps the findings it shares with the one baselined. A file name that
is not UTF-8 (its bytes decoded with surrogate escapes) or a tensor name holding a lone surrogate
is hashed with the surrogates encoded as they are (``surrogatepass``), and written to the file as
``\udcff`` JSON escapes: every finding has a fingerprint and the file stays valid UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tieaudit.core.errors import UsageError
from tieaudit.core.globs import posix_relative
from tieaudit.core.limits import NotRegularFile, TooLarge, nesting_depth_exceeds, parse_failure, read_limited
from tieaudit.core.version import __version__
from tieaudit.formats.hf_cache import hub_address

if TYPE_CHECKING:
    from tieaudit.audit import Audit

SCHEMA = "tieaudit.baseline/1"
MAX_BASELINE_BYTES = 256 << 20
"""Largest baseline file read: about a million accepted findings at ~250 bytes each."""
MAX_BASELINE_DEPTH = 8
"""Deepest nesting read: a baseline nests 4 levels (document, findings, finding, names); room to grow."""
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Baseline:
    """Accepted findings, read from a baseline file."""

    path: str
    """The baseline file."""
    fingerprints: frozenset[str]
    """Fingerprints of the accepted findings."""

    @property
    def root(self) -> str:
        """The folder finding paths are relative to."""
        return os.path.dirname(os.path.abspath(self.path))


@dataclass(frozen=True)
class Entry:
    """One accepted finding as written to the file (path, rule and names keep it reviewable)."""

    path: str
    """The checkpoint, relative to the baseline file's folder."""
    rule: str
    """Rule id."""
    names: tuple[str, ...]
    """Tensor names, sorted."""

    @property
    def fingerprint(self) -> str:
        """sha256 of the entry (see the module docstring)."""
        text = json.dumps([self.path, self.rule, list(self.names)], separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def entry(path: str, rule: str, names: Sequence[str], *, root: str) -> Entry:
    """The baseline entry for a finding of the checkpoint at path (in a Hugging Face cache
    snapshot: its ``hf://ORG/NAME[/file]`` address, the same for every revision and machine)."""
    return Entry(hub_address(path) or posix_relative(path, root), rule, tuple(sorted(names)))


def fingerprint(path: str, rule: str, names: Sequence[str], *, root: str) -> str:
    """The finding's identity across runs (hex sha256)."""
    return entry(path, rule, names, root=root).fingerprint


def _parse(path: str) -> Any:
    """The JSON document at path: size checked before reading, any parse failure one usage error."""
    try:
        data = read_limited(path, MAX_BASELINE_BYTES, os.path.basename(path))
    except FileNotFoundError as exc:
        raise UsageError("baseline file not found (create it with --write-baseline)", path) from exc
    except TooLarge as exc:
        raise UsageError(f"cannot read baseline: {exc} (MAX_BASELINE_BYTES)", path) from exc
    except (NotRegularFile, OSError) as exc:
        raise UsageError(f"cannot read baseline: {exc.strerror or exc}", path) from exc
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # syntax, bad UTF-8, digits, nesting
        raise UsageError(f"cannot read baseline: {parse_failure(exc)}", path) from exc
    if nesting_depth_exceeds(document, MAX_BASELINE_DEPTH):
        raise UsageError(f"not a tieaudit baseline: nested deeper than {MAX_BASELINE_DEPTH} levels", path)
    return document


def load_baseline(path: str) -> Baseline:
    """Read a baseline file; anything malformed is a usage error."""
    document = _parse(path)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise UsageError(f"not a tieaudit baseline (expected schema {SCHEMA!r})", path)
    findings = document.get("findings")
    if not isinstance(findings, list) or not all(
        isinstance(f, dict) and isinstance(f.get("fingerprint"), str) for f in findings
    ):
        raise UsageError("findings must be a list of objects with a fingerprint", path)
    return Baseline(path, frozenset(f["fingerprint"] for f in findings))


def baseline_text(entries: Iterable[Entry]) -> str:
    """The file's content: entries sorted and unique, so that a diff shows what changed."""
    unique = sorted(set(entries), key=lambda e: (e.path, e.rule, e.names))
    document = {
        "schema": SCHEMA,
        "tieaudit_version": __version__,
        "findings": [
            {"fingerprint": e.fingerprint, "path": e.path, "rule": e.rule, "names": list(e.names)}
            for e in unique
        ],
    }
    text = json.dumps(document, indent=2, ensure_ascii=False)
    # a lone surrogate cannot be written as UTF-8: it becomes the JSON escape json.loads reads back
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


def write_baseline(path: str, audits: Iterable[Audit]) -> int:
    """Accept every finding of the audits into a baseline file at path; returns the count."""
    root = os.path.dirname(os.path.abspath(path))
    entries = {entry(a.graph.checkpoint.path, f.rule, f.names, root=root) for a in audits for f in a.findings}
    from tieaudit.core.atomic import write_text_atomic

    write_text_atomic(path, baseline_text(entries))
    return len(entries)


def fingerprint_root(baseline: Baseline | None, write_path: str | None) -> str:
    """Folder fingerprints are relative to: the baseline read, else the one written, else here."""
    if baseline is not None:
        return baseline.root
    if write_path is not None:
        return os.path.dirname(os.path.abspath(write_path))
    return os.getcwd()
