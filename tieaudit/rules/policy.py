"""The policy: what a team expects of its checkpoints (tieaudit.toml or [tool.tieaudit]).

Top-level keys are the defaults; each ``[[path]]`` entry whose glob names a checkpoint overrides
the keys it sets, later entries over earlier ones (a ``severity`` table is merged rule by rule).
Without ``--policy`` the file is searched from the current folder up to the repository root.
Rule ids are read in any letter case; sizes as bytes or with a unit (``1MB``, ``1MiB``).
"""

from __future__ import annotations

import dataclasses
import os
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
from tieaudit.rules import policy_values as values
from tieaudit.rules.finding import Severity
from tieaudit.rules.policy_values import PolicyError, brief, rule_id
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


def _byte_count(key: str) -> Callable[[Any, str], int]:
    """A byte count: an integer, or a string with a unit as on the command line ("1MB", "1.5MiB")."""

    def parse(value: Any, where: str) -> int:
        count = value
        if isinstance(value, str):
            try:
                count = parse_size(value)
            except ValueError as exc:
                raise PolicyError(f"{key}: {exc}") from exc
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_BYTE_COUNT:
            raise PolicyError(
                f"{key}: {brief(value)} is not a byte count; expected 0 to 2**63-1, or a size like 1MB "
                "or 1MiB"
            )
        return count

    return parse


# policy key -> (Policy field, parser): the same keys are valid at the top and in [[path]].
SETTINGS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "fail-on": ("fail_on", values.fail_on),
    "min-size": ("min_bytes", _byte_count("min-size")),
    "ignore": ("ignore", values.rule_ids),
    "severity": ("severity", values.severities),
    "expect-tie": ("expected_ties", values.expected_ties),
    "relations": ("relations", values.relations),
    "max-wasted-bytes": ("max_wasted_bytes", _byte_count("max-wasted-bytes")),
    "safe-globals": ("safe_globals", values.safe_globals),
}


@dataclass(frozen=True)
class _Source:
    """The policy file being read: its path, its text and the table holding the settings."""

    path: str
    text: str = ""
    table: str = ""
    """``""`` for tieaudit.toml, ``tool.tieaudit`` for pyproject.toml."""

    def at(self, keys: tuple[str, ...], entry: int | None = None) -> str:
        """``path:line`` of keys (a setting, then a key inside it) at the top or in the entry-th
        [[path]], or path alone when the line is not found."""
        from tieaudit.rules.policy_lines import key_line

        line = key_line(self.text, table=self.table, entry=entry, keys=keys) if self.text else None
        return f"{self.path}:{line}" if line is not None else self.path


def _settings(
    table: Mapping[str, Any], extra: set[str], source: _Source, *, entry: int | None = None
) -> dict[str, Any]:
    """Policy fields from a TOML table (entry: the [[path]] entry's number); unknown keys are errors
    (typos must not pass). An error names the file and the line of the key, when found."""
    label = f"[[{PATH_TABLE}]] #{entry}: " if entry is not None else ""
    where = f"{source.path} [[{PATH_TABLE}]] #{entry}" if entry is not None else source.path
    known = set(SETTINGS) | extra
    unknown = [key for key in table if key not in known]  # in file order: the first one's line
    if unknown:
        raise UsageError(
            f"{label}unknown policy keys {sorted(unknown)} (known: {sorted(known)})",
            source.at((unknown[0],), entry),
        )
    fields = {}
    for key, value in table.items():
        if key not in SETTINGS:
            continue
        name, parse = SETTINGS[key]
        try:
            fields[name] = parse(value, where)
        except UsageError as exc:
            keys = (key, *exc.keys) if isinstance(exc, PolicyError) else (key,)
            raise UsageError(f"{label}{exc.message}", source.at(keys, entry)) from exc
    return fields


def _path_entries(entries: Any, source: _Source) -> tuple[PathPolicy, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(
            f"{PATH_TABLE}: expected an array of tables ([[{PATH_TABLE}]]), not {brief(entries)}",
            source.at((PATH_TABLE,)),
        )
    result = []
    for number, entry in enumerate(entries, 1):
        label = f"[[{PATH_TABLE}]] #{number}: "
        glob = entry.get("glob")
        if not isinstance(glob, str) or not glob:
            given = f", not {brief(glob)}" if "glob" in entry else ""
            at = source.at(("glob",) if "glob" in entry else (), number)
            raise UsageError(f'{label}needs glob = "..." (e.g. "models/**/*.onnx"){given}', at)
        try:
            compile_glob(glob)  # an invalid pattern is found now, not while checkpoints are matched
        except UsageError as exc:
            raise UsageError(f"{label}{exc.message}", source.at(("glob",), number)) from exc
        result.append(PathPolicy(glob, _settings(entry, {"glob"}, source, entry=number)))
    return tuple(result)


def policy_from_table(table: dict[str, Any], where: str, *, text: str = "", within: str = "") -> Policy:
    """Build a Policy from a parsed TOML table; where is the file (its folder roots the globs), text
    its content and within the table holding the settings in it (for the lines errors name)."""
    source = _Source(where, text, within)
    fields = _settings(table, {PATH_TABLE}, source)
    paths = _path_entries(table.get(PATH_TABLE, []), source)
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


def _parse(path: str) -> tuple[dict[str, Any], str]:
    """The TOML document at path, and its text: size checked before reading, any parse failure one
    usage error."""
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
        text = data.decode("utf-8")
        return tomllib.loads(text), text
    except (ValueError, RecursionError) as exc:  # syntax, bad UTF-8, digits, nesting
        raise UsageError(f"cannot read policy: {parse_failure(exc)}", path) from exc


def _read(path: str, required: bool) -> Policy | None:
    document, text = _parse(path)
    pyproject = os.path.basename(path) == "pyproject.toml"
    if pyproject:
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
    return policy_from_table(table, path, text=text, within="tool.tieaudit" if pyproject else "")
