"""The values a policy key takes, each read by its parser (``rules.policy.SETTINGS``).

A wrong value is a ``PolicyError`` saying which key and which entry is wrong and what is expected
(``ignore: 'TIE01' is not a known rule id; known: TIE001, ...``), with the keys below the setting
that hold it (a severity table's rule id) so that the loader can point at its line.
"""

from __future__ import annotations

import reprlib
from typing import Any

from tieaudit.core.errors import UsageError
from tieaudit.core.records import DeclaredTie
from tieaudit.graph.detect import ALL_RELATIONS
from tieaudit.rules.finding import SEVERITIES, Severity
from tieaudit.rules.registry import RULES

_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 60
_BRIEF.maxlevel = 3
_SEVERITIES = "expected error, warning or note"
_RELATIONS = ", ".join(sorted(ALL_RELATIONS)[:-1]) + " or " + sorted(ALL_RELATIONS)[-1]


def brief(value: Any) -> str:
    """A value from the policy file, shortened for a one-line message."""
    return _BRIEF.repr(value)


class PolicyError(UsageError):
    """A policy value that is wrong; keys: where it lies below the setting (``("TIE001",)`` for an
    entry of the severity table), for the line the loader points at."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


def rule_id(text: str) -> str | None:
    """The rule id text names, in any letter case ('tie004' -> 'TIE004'), or None."""
    canonical = text.strip().upper()
    return canonical if canonical in RULES else None


def _known_rules() -> str:
    return f"known: {', '.join(RULES)}"


def severity_value(key: str, value: Any, keys: tuple[str, ...] = ()) -> Severity:
    """value as a severity; PolicyError naming key otherwise."""
    for severity in SEVERITIES:
        if value == severity:
            return severity
    raise PolicyError(f"{key}: {brief(value)} is not a severity; {_SEVERITIES}", keys)


def fail_on(value: Any, where: str) -> Severity:
    return severity_value("fail-on", value)


def rule_ids(values: Any, where: str) -> frozenset[str]:
    if not isinstance(values, list):
        raise PolicyError(f'ignore: expected a list of rule ids (ignore = ["TIE004"]), not {brief(values)}')
    ids = set()
    for value in values:
        if not isinstance(value, str):
            raise PolicyError(f"ignore: entry {brief(value)} is not a rule id (a string); {_known_rules()}")
        found = rule_id(value)
        if found is None:
            raise PolicyError(f"ignore: {brief(value)} is not a known rule id; {_known_rules()}")
        ids.add(found)
    return frozenset(ids)


def relations(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list):
        raise PolicyError(f"relations: expected a list of {_RELATIONS}, not {brief(value)}")
    for entry in value:
        if not isinstance(entry, str) or entry not in ALL_RELATIONS:
            raise PolicyError(f"relations: {brief(entry)} is not a relation; expected {_RELATIONS}")
    return frozenset(value)


def severities(value: Any, where: str) -> dict[str, Severity]:
    if not isinstance(value, dict):
        raise PolicyError(
            f'severity: expected a table of rule id = severity (TIE001 = "error"), not {brief(value)}'
        )
    table: dict[str, Severity] = {}
    for key, level in value.items():
        found = rule_id(key)
        if found is None:
            raise PolicyError(f"severity: {brief(key)} is not a known rule id; {_known_rules()}", (key,))
        table[found] = severity_value(f"severity.{key}", level, (key,))
    return table


def expected_ties(entries: Any, where: str) -> tuple[DeclaredTie, ...]:
    if not isinstance(entries, list):
        raise PolicyError(
            f"expect-tie: expected an array of tables with target and source ([[expect-tie]]), "
            f"not {brief(entries)}"
        )
    ties = []
    for number, entry in enumerate(entries, 1):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("target"), str)
            or not isinstance(entry.get("source"), str)
        ):
            raise PolicyError(f"expect-tie: entry #{number} {brief(entry)} needs string target and source")
        ties.append(
            DeclaredTie(dropped=entry["target"], kept=entry["source"], declared_by="policy", where=where)
        )
    return tuple(ties)


def safe_globals(value: Any, where: str) -> frozenset[str]:
    from tieaudit.formats.pickle_globals import blocked  # torch's allowlist: only for this key

    if not isinstance(value, list):
        raise PolicyError(
            f"safe-globals: expected an array of dotted names (module.qualname), not {brief(value)}"
        )
    for name in value:
        if not isinstance(name, str) or not name:
            raise PolicyError(f"safe-globals: entry {brief(name)} is not a dotted module.qualname")
        module, _, attr = name.rpartition(".")
        if not module or not attr or any(not part.isidentifier() for part in name.split(".")):
            raise PolicyError(f"safe-globals: entry {brief(name)} is not a dotted module.qualname")
        if blocked(name):
            raise PolicyError(
                f"safe-globals: entry {brief(name)} is in a module torch refuses even after "
                "add_safe_globals (sys, os, posix, nt)"
            )
    return frozenset(value)
