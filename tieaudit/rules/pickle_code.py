"""TIE010 pickle-runs-code and TIE011 pickle-unknown-global: what a checkpoint's pickle would import.

tieaudit reads every pickle with inert placeholders for globals outside its allowlist, so these
rules only report what the file names; nothing was imported or called to find it. One finding per
file and rule, naming every such global the file's pickles reference.
"""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.rules.finding import Audited, Finding, Rule

MAX_NAMED = 8
"""Globals spelled out in one finding's message (all of them are in its ``names``)."""


def _by_file(audited: Audited, verdict: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for used in audited.graph.checkpoint.pickle_globals:
        if used.verdict == verdict:
            found.setdefault(used.file, []).append(used.name)
    return found


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMED])
    return shown + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def runs_code_findings(audited: Audited) -> Iterator[Finding]:
    """TIE010: a file whose pickle names a global that runs code when the file is unpickled."""
    for file, names in _by_file(audited, "runs-code").items():
        yield RUNS_CODE.finding(
            names,
            f"{file} runs code when loaded with torch.load(weights_only=False) or pickle: its pickle "
            f"calls or imports {_listed(names)}. tieaudit read it with inert placeholders and called "
            "nothing.",
            fix="do not load this file with weights_only=False; rebuild it from a trusted source "
            "(or keep only its tensors, e.g. as safetensors)",
            details={"file": file},
        )


def unknown_findings(audited: Audited) -> Iterator[Finding]:
    """TIE011: a file whose pickle names classes outside the known-safe set."""
    for file, names in _by_file(audited, "unknown").items():
        yield UNKNOWN_GLOBAL.finding(
            names,
            f"{file} names {len(names)} global{'s' if len(names) > 1 else ''} outside the known-safe "
            f"set: {_listed(names)}. torch.load(weights_only=True) refuses the file; "
            f"weights_only=False would import and call {'them' if len(names) > 1 else 'it'}. "
            "tieaudit read it with inert placeholders.",
            fix="load it with torch.serialization.safe_globals([...]) naming only classes you trust, "
            "or save plain data (dicts, lists, numbers, strings) instead of objects",
            details={"file": file},
        )


RUNS_CODE = Rule(
    id="TIE010",
    kind="pickle-runs-code",
    severity="error",
    summary="A pickle references a global that runs code when loaded with torch.load(weights_only=False).",
    check=runs_code_findings,
)
UNKNOWN_GLOBAL = Rule(
    id="TIE011",
    kind="pickle-unknown-global",
    severity="note",
    summary="A pickle references a class outside the known-safe set (read as an inert placeholder).",
    check=unknown_findings,
)
