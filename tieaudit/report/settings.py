"""``check --show-settings``: the policy in force, key by key, with where each value came from.

Written as TOML (comments give the origin: the policy file's path, "command line" or "default"),
so a team can read what a run would apply, and paste it into a tieaudit.toml.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from tieaudit.core.escape import printable
from tieaudit.core.records import DeclaredTie
from tieaudit.rules.policy import COMMAND_LINE, DEFAULT, SETTINGS, Policy

_KEYS = {field: key for key, (field, _) in SETTINGS.items()}
"""Policy field (``fail_on``) -> its key in the policy file (``fail-on``)."""
_TABLES = ("severity", "expect-tie")
"""Keys written as tables after the plain ones."""


def _toml(value: Any) -> str:
    """A value as TOML: strings JSON-quoted (every control or non-ASCII character escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in sorted(value.items())) + " }"
    if isinstance(value, set | frozenset):
        return "[" + ", ".join(_toml(v) for v in sorted(value)) + "]"
    if isinstance(value, Iterable):  # in order: --exclude's first matching pattern is the one named
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _line(key: str, value: str, origin: str) -> str:
    return f"{f'{key} = {value}':<46} # {printable(origin)}"


def _ties(ties: Iterable[DeclaredTie], table: str) -> list[str]:
    return [f"[[{table}]]\ntarget = {_toml(t.dropped)}\nsource = {_toml(t.kept)}" for t in ties]


def _path_entry(glob: str, settings: Mapping[str, Any], source: str) -> list[str]:
    lines = [f"{'[[path]]':<46} # {printable(source)}", f"glob = {_toml(glob)}"]
    ties: list[str] = []
    for field, value in settings.items():
        if field == "expected_ties":
            ties = _ties(value, "path.expect-tie")
        elif value is not None:
            lines.append(f"{_KEYS[field]} = {_toml(value)}")
    return lines + ties


def render_settings(policy: Policy, *, exclude: tuple[str, ...] = ()) -> str:
    """The effective settings of one check run: every policy key with its value and origin, the
    --exclude patterns, the folder globs are relative to, and the [[path]] entries."""
    if policy.source == "defaults":
        source = "none found from the current folder up to the repository root (.git); defaults apply"
    else:
        source = policy.source
    lines = [
        "# tieaudit check: settings in force, in tieaudit.toml form",
        f"# policy file: {printable(source)}",
        f"# globs (--exclude, [[path]] glob) are relative to: {printable(os.path.abspath(policy.root))}",
    ]
    for key, (field, _) in SETTINGS.items():
        value = getattr(policy, field)
        if key in _TABLES:
            continue
        if value is None:
            lines.append(f"{f'# {key} is not set':<46} # {printable(policy.origin(key))}")
        else:
            lines.append(_line(key, _toml(value), policy.origin(key)))
    lines.append(_line("runtime", _toml(policy.runtime), COMMAND_LINE if policy.runtime else DEFAULT))
    lines.append(_line("exclude", _toml(exclude), COMMAND_LINE if exclude else DEFAULT))
    lines.append(f"{'[severity]':<46} # {printable(policy.origin('severity'))}")
    lines += [f"{rule} = {_toml(level)}" for rule, level in sorted(policy.severity.items())]
    if policy.expected_ties:
        lines.append(f"# expect-tie: {printable(policy.origin('expect-tie'))}")
        lines += _ties(policy.expected_ties, "expect-tie")
    for entry in policy.paths:
        lines += _path_entry(entry.glob, entry.settings, policy.source)
    return "\n".join(lines) + "\n"
