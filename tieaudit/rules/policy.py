"""The policy: what a team expects of its checkpoints (tieaudit.toml or [tool.tieaudit]).

Top-level keys are the defaults; each ``[[path]]`` entry whose glob names a checkpoint overrides
the keys it sets, later entries over earlier ones (a ``severity`` table is merged rule by rule).
Without ``--policy`` the file is searched from the current folder up to the repository root.
Rule ids are read in any letter case; sizes as bytes or with a unit (``1MB``, ``1MiB``).
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tieaudit.core.errors import UsageError
from tieaudit.core.globs import compile_glob, glob_matches, posix_relative
from tieaudit.core.limits import NotRegularFile, TooLarge, nesting_depth_exceeds, parse_failure, read_limited
from tieaudit.core.records import DeclaredTie
from tieaudit.core.units import parse_size
from tieaudit.graph import DEFAULT_MIN_BYTES
from tieaudit.graph.detect import ALL_RELATIONS
from tieaudit.rules.finding import SEVERITIES, Severity
from tieaudit.rules.registry import RULES

PATH_TABLE = "path"
"""The array of tables holding per-glob overrides: ``[[path]]``."""
MAX_POLICY_BYTES = 4 << 20
"""Largest policy file read (tieaudit.toml, or a pyproject.toml holding the table): real ones are KiB."""
MAX_POLICY_DEPTH = 8
"""Deepest nesting of tables and arrays in the policy table: the deepest valid key is three levels."""
MAX_BYTE_COUNT = (1 << 63) - 1
"""Largest byte count a policy may set: no file holds more bytes than a 64-bit offset reaches."""
POLICY_FILE = "tieaudit.toml"
PYPROJECT = "pyproject.toml"
REPOSITORY_MARKER = ".git"
"""A folder holding this (a folder, or a worktree's file) is the repository root: the search stops there."""
DEFAULT = "default"
COMMAND_LINE = "command line"
_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 60
_BRIEF.maxlevel = 3


def brief(value: Any) -> str:
    """A value from the policy file, shortened for a one-line message."""
    return _BRIEF.repr(value)


@dataclass(frozen=True)
class PathPolicy:
    """Settings for the checkpoints one glob names."""

    glob: str
    """Matched against the checkpoint's path relative to the policy file's folder, and its basename."""
    settings: Mapping[str, Any]
    """The Policy fields this entry sets (attribute names), already validated."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Settings for one audit."""

    fail_on: Severity = "warning"
    """check exits 1 when a finding at or above this severity remains."""
    min_bytes: int = DEFAULT_MIN_BYTES
    """Tensors smaller than this are never copy candidates."""
    ignore: frozenset[str] = frozenset()
    """Rule ids never reported."""
    severity: dict[str, Severity] = field(default_factory=dict)
    """Per-rule severity overrides."""
    expected_ties: tuple[DeclaredTie, ...] = ()
    """Ties the checkpoint must have (TIE008); also declared ties for TIE002/TIE003."""
    relations: frozenset[str] = ALL_RELATIONS
    """Copy relations searched for."""
    runtime: bool = False
    """Also ask ONNX Runtime's optimizer whether it duplicates a shared initializer (TIE005)."""
    max_wasted_bytes: int | None = None
    """TIE009 when the findings of one checkpoint waste more bytes than this."""
    safe_globals: frozenset[str] = frozenset()
    """Exact dotted names the user loads with ``torch.serialization.add_safe_globals``: a pickle
    naming them gets TIE011 (a note) for them instead of TIE010. Never prefixes."""
    paths: tuple[PathPolicy, ...] = ()
    """Per-glob overrides, in file order."""
    root: str = "."
    """Folder every glob is relative to (``paths`` and --exclude): the policy file's, else the current one."""
    source: str = "defaults"
    """Where the policy came from."""
    origins: Mapping[str, str] = field(default_factory=dict)
    """Policy key (``fail-on``) -> where its value was set: the file's path or "command line";
    a key not here has its default."""

    def for_path(self, path: str) -> Policy:
        """The settings for one checkpoint: the defaults, then every matching [[path]] entry."""
        if not self.paths:
            return self
        relative = posix_relative(path, self.root)
        changes: dict[str, Any] = {}
        severity = dict(self.severity)
        for entry in self.paths:
            if glob_matches(entry.glob, relative):
                severity.update(entry.settings.get("severity", {}))
                changes.update({k: v for k, v in entry.settings.items() if k != "severity"})
        return dataclasses.replace(self, **changes, severity=severity, paths=())

    def unmatched_globs(self, paths: Iterable[str]) -> tuple[str, ...]:
        """The ``[[path]]`` globs naming none of paths (checkpoints audited), in file order."""
        relative = [posix_relative(path, self.root) for path in paths]
        return tuple(
            entry.glob for entry in self.paths if not any(glob_matches(entry.glob, r) for r in relative)
        )

    def origin(self, key: str) -> str:
        """Where the value of a policy key (``fail-on``) comes from: a path, "command line" or "default"."""
        return self.origins.get(key, DEFAULT)

    def overridden(
        self, fail_on: Severity | None = None, min_bytes: int | None = None, ignore: tuple[str, ...] = ()
    ) -> Policy:
        """The command line's settings over the file's, [[path]] entries included (rule ids in any case)."""
        unknown = [rule for rule in ignore if rule_id(rule) is None]
        if unknown:
            raise UsageError(f"unknown rule id {', '.join(unknown)} (known: {', '.join(RULES)})", "--ignore")
        changes: dict[str, Any] = {}
        origins = dict(self.origins)
        if fail_on is not None:
            changes["fail_on"] = fail_on
            origins["fail-on"] = COMMAND_LINE
        if min_bytes is not None:
            changes["min_bytes"] = min_bytes
            origins["min-size"] = COMMAND_LINE
        extra = frozenset(rule_id(rule) or rule for rule in ignore)
        if extra:
            before = self.origins.get("ignore")
            origins["ignore"] = f"{before} + {COMMAND_LINE}" if before else COMMAND_LINE
        paths = tuple(
            PathPolicy(
                entry.glob,
                {k: v | extra if k == "ignore" else v for k, v in entry.settings.items() if k not in changes},
            )
            for entry in self.paths
        )
        return dataclasses.replace(self, **changes, ignore=self.ignore | extra, paths=paths, origins=origins)


def rule_id(text: str) -> str | None:
    """The rule id text names, in any letter case ('tie004' -> 'TIE004'), or None."""
    canonical = text.strip().upper()
    return canonical if canonical in RULES else None


def _severity(value: Any, where: str) -> Severity:
    for severity in SEVERITIES:
        if value == severity:
            return severity
    raise UsageError(f"severity must be error, warning or note, not {brief(value)}", where)


def _rule_ids(values: Any, where: str) -> frozenset[str]:
    ids = [rule_id(v) if isinstance(v, str) else None for v in values] if isinstance(values, list) else [None]
    if None in ids:
        known = ", ".join(RULES)
        raise UsageError(f"ignore must be a list of rule ids ({known}), not {brief(values)}", where)
    return frozenset(i for i in ids if i is not None)


def _byte_count(key: str) -> Callable[[Any, str], int]:
    """A byte count: an integer, or a string with a unit as on the command line ("1MB", "1.5MiB")."""

    def parse(value: Any, where: str) -> int:
        count = value
        if isinstance(value, str):
            try:
                count = parse_size(value)
            except ValueError as exc:
                raise UsageError(f"{key}: {exc}", where) from exc
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_BYTE_COUNT:
            raise UsageError(
                f"{key} must be a byte count (0 to 2**63-1) or a size like 1MB or 1MiB, not {brief(value)}",
                where,
            )
        return count

    return parse


def _relations(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v in ALL_RELATIONS for v in value):
        raise UsageError(f"relations must be a subset of {sorted(ALL_RELATIONS)}", where)
    return frozenset(value)


def _severities(value: Any, where: str) -> dict[str, Severity]:
    if not isinstance(value, dict):
        raise UsageError("severity must map rule ids to error, warning or note", where)
    unknown = [key for key in value if rule_id(key) is None]
    if unknown:
        known = ", ".join(RULES)
        raise UsageError(f"severity: unknown rule id {brief(unknown[0])} (known: {known})", where)
    return {rule_id(rule) or rule: _severity(level, where) for rule, level in value.items()}


def _expected(entries: Any, where: str) -> tuple[DeclaredTie, ...]:
    if not isinstance(entries, list):
        raise UsageError("expect-tie must be an array of tables with target and source", where)
    ties = []
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("target"), str)
            or not isinstance(entry.get("source"), str)
        ):
            raise UsageError(f"expect-tie entry {brief(entry)} needs string target and source", where)
        ties.append(
            DeclaredTie(dropped=entry["target"], kept=entry["source"], declared_by="policy", where=where)
        )
    return tuple(ties)


def _safe_globals(value: Any, where: str) -> frozenset[str]:
    from tieaudit.formats.pickle_globals import blocked  # torch's allowlist: only for this key

    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError("safe-globals must be an array of dotted names (module.qualname)", where)
    for name in value:
        module, _, attr = name.rpartition(".")
        if not module or not attr or any(not part.isidentifier() for part in name.split(".")):
            raise UsageError(f"safe-globals entry {brief(name)} is not a dotted module.qualname", where)
        if blocked(name):
            raise UsageError(
                f"safe-globals entry {brief(name)} is in a module torch refuses even after "
                "add_safe_globals (sys, os, posix, nt)",
                where,
            )
    return frozenset(value)


# policy key -> (Policy field, parser): the same keys are valid at the top and in [[path]].
SETTINGS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "fail-on": ("fail_on", _severity),
    "min-size": ("min_bytes", _byte_count("min-size")),
    "ignore": ("ignore", _rule_ids),
    "severity": ("severity", _severities),
    "expect-tie": ("expected_ties", _expected),
    "relations": ("relations", _relations),
    "max-wasted-bytes": ("max_wasted_bytes", _byte_count("max-wasted-bytes")),
    "safe-globals": ("safe_globals", _safe_globals),
}


def _settings(table: Mapping[str, Any], extra: set[str], where: str) -> dict[str, Any]:
    """Policy fields from a TOML table; unknown keys are errors (typos must not pass)."""
    known = set(SETTINGS) | extra
    unknown = set(table) - known
    if unknown:
        raise UsageError(f"unknown policy keys {sorted(unknown)} (known: {sorted(known)})", where)
    return {SETTINGS[k][0]: SETTINGS[k][1](v, where) for k, v in table.items() if k in SETTINGS}


def _path_entries(entries: Any, where: str) -> tuple[PathPolicy, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{PATH_TABLE} must be an array of tables ([[{PATH_TABLE}]])", where)
    result = []
    for number, entry in enumerate(entries, 1):
        label = f"{where} [[{PATH_TABLE}]] #{number}"
        glob = entry.get("glob")
        if not isinstance(glob, str) or not glob:
            raise UsageError('needs glob = "..." (e.g. "models/**/*.onnx")', label)
        try:
            compile_glob(glob)  # an invalid pattern is found now, not while checkpoints are matched
        except UsageError as exc:
            raise UsageError(exc.message, label) from exc
        result.append(PathPolicy(glob, _settings(entry, {"glob"}, label)))
    return tuple(result)


def policy_from_table(table: dict[str, Any], where: str) -> Policy:
    """Build a Policy from a parsed TOML table; where is the file (its folder roots the globs)."""
    fields = _settings(table, {PATH_TABLE}, where)
    paths = _path_entries(table.get(PATH_TABLE, []), where)
    root = os.path.dirname(os.path.abspath(where))
    origins = {key: where for key in table if key in SETTINGS}
    return Policy(**fields, paths=paths, root=root, source=where, origins=origins)


def load_policy(path: str | None) -> Policy:
    """Policy from path (tieaudit.toml, or pyproject.toml's [tool.tieaudit]); found by find_policy
    when path is None; defaults when there is none."""
    if path is None:
        return find_policy(".") or Policy()
    policy = _read(path, required=True)
    assert policy is not None
    return policy


def find_policy(start: str) -> Policy | None:
    """The policy of the first folder from start upward holding tieaudit.toml or a pyproject.toml
    with [tool.tieaudit]; the search stops after the repository root (the folder holding .git) or
    at the filesystem root. Both in one folder: UsageError naming both (which one rules is not a
    guess to make silently)."""
    here = os.path.abspath(start)
    folder = here
    while True:
        # shown as found: bare names in the folder searched first, absolute paths above it
        shown = os.path.normpath(start) if folder == here else folder
        named = [os.path.normpath(os.path.join(shown, name)) for name in (POLICY_FILE, PYPROJECT)]
        found = [p for p in (_read(n, required=False) for n in named if os.path.isfile(n)) if p is not None]
        if len(found) == 2:
            raise UsageError(
                f"two policies: {found[0].source} and {found[1].source} [tool.tieaudit]; "
                "keep one, or choose with --policy"
            )
        if found:
            return found[0]
        parent = os.path.dirname(folder)
        if os.path.lexists(os.path.join(folder, REPOSITORY_MARKER)) or parent == folder:
            return None
        folder = parent


def _parse(path: str) -> dict[str, Any]:
    """The TOML document at path: size checked before reading, any parse failure one usage error."""
    if sys.version_info >= (3, 11):  # imported here: most runs have no policy file to parse
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = read_limited(path, MAX_POLICY_BYTES, os.path.basename(path))
    except FileNotFoundError as exc:
        raise UsageError("policy file not found", path) from exc
    except TooLarge as exc:
        raise UsageError(f"cannot read policy: {exc} (MAX_POLICY_BYTES)", path) from exc
    except (NotRegularFile, OSError) as exc:
        raise UsageError(f"cannot read policy: {exc.strerror or exc}", path) from exc
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # syntax, bad UTF-8, digits, nesting
        raise UsageError(f"cannot read policy: {parse_failure(exc)}", path) from exc


def _read(path: str, required: bool) -> Policy | None:
    document = _parse(path)
    if os.path.basename(path) == "pyproject.toml":
        tool = document.get("tool", {})
        table = tool.get("tieaudit") if isinstance(tool, dict) else None
        if table is None:
            if required:
                raise UsageError("no [tool.tieaudit] table", path)
            return None
    else:
        table = document
    if not isinstance(table, dict):
        raise UsageError("tieaudit settings must be a table", path)
    if nesting_depth_exceeds(table, MAX_POLICY_DEPTH):
        raise UsageError(f"policy tables or arrays nest deeper than {MAX_POLICY_DEPTH} levels", path)
    return policy_from_table(table, path)
