"""The policy: what a team expects of its checkpoints (tieaudit.toml or [tool.tieaudit])."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from tieaudit.detect import ALL_RELATIONS, DEFAULT_MIN_BYTES
from tieaudit.errors import UsageError
from tieaudit.findings import RULES, SEVERITY_RANK, Severity
from tieaudit.model import DeclaredTie


@dataclass(frozen=True)
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
    source: str = "defaults"
    """Where the policy came from."""


def _severity(value: Any, where: str) -> Severity:
    if value not in SEVERITY_RANK:
        raise UsageError(f"severity must be error, warning or note, not {value!r}", where)
    return value  # type: ignore[no-any-return]


def _rule_ids(values: Any, where: str) -> frozenset[str]:
    if not isinstance(values, list) or not all(v in RULES for v in values):
        raise UsageError(f"ignore must be a list of rule ids ({', '.join(RULES)}), not {values!r}", where)
    return frozenset(values)


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
            raise UsageError(f"expect-tie entry {entry!r} needs string target and source", where)
        ties.append(DeclaredTie(entry["target"], entry["source"], "policy", where))
    return tuple(ties)


def policy_from_table(table: dict[str, Any], where: str) -> Policy:
    """Build a Policy from a parsed TOML table; unknown keys are errors (typos must not pass)."""
    known = {"fail-on", "min-size", "ignore", "severity", "expect-tie", "relations"}
    unknown = set(table) - known
    if unknown:
        raise UsageError(f"unknown policy keys {sorted(unknown)} (known: {sorted(known)})", where)
    min_bytes = table.get("min-size", DEFAULT_MIN_BYTES)
    if not isinstance(min_bytes, int) or min_bytes < 0:
        raise UsageError(f"min-size must be a byte count, not {min_bytes!r}", where)
    relations = table.get("relations", sorted(ALL_RELATIONS))
    if not isinstance(relations, list) or not set(relations) <= ALL_RELATIONS:
        raise UsageError(f"relations must be a subset of {sorted(ALL_RELATIONS)}", where)
    severity = table.get("severity", {})
    if not isinstance(severity, dict) or not set(severity) <= set(RULES):
        raise UsageError("severity must map rule ids to error, warning or note", where)
    return Policy(
        fail_on=_severity(table.get("fail-on", "warning"), where),
        min_bytes=min_bytes,
        ignore=_rule_ids(table.get("ignore", []), where),
        severity={rule: _severity(value, where) for rule, value in severity.items()},
        expected_ties=_expected(table.get("expect-tie", []), where),
        relations=frozenset(relations),
        source=where,
    )


def load_policy(path: str | None) -> Policy:
    """Policy from path (tieaudit.toml, or pyproject.toml's [tool.tieaudit]); discovered in the
    current folder when path is None; defaults when there is none."""
    if path is None:
        for candidate in ("tieaudit.toml", "pyproject.toml"):
            if os.path.isfile(candidate):
                policy = _read(candidate, required=False)
                if policy is not None:
                    return policy
        return Policy()
    policy = _read(path, required=True)
    assert policy is not None
    return policy


def _read(path: str, required: bool) -> Policy | None:
    if sys.version_info >= (3, 11):  # imported here: most runs have no policy file to parse
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise UsageError("policy file not found", path) from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read policy: {exc}", path) from exc
    if os.path.basename(path) == "pyproject.toml":
        table = document.get("tool", {}).get("tieaudit")
        if table is None:
            if required:
                raise UsageError("no [tool.tieaudit] table", path)
            return None
        return policy_from_table(table, path)
    return policy_from_table(document, path)
