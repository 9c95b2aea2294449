"""TIE010 pickle-runs-code and TIE011 pickle-unknown-global: what a checkpoint's pickle would import.

The verdict is torch's (``formats/pickle_globals.py``): a pickle naming any global outside torch's
default weights_only allowlist needs ``torch.load(weights_only=False)``, which imports that global
and does with it what the pickle asks (TIE010, an error). tieaudit read it with inert placeholders,
so these rules only report what the file names; nothing was imported or called to find it.

TIE011 (a note) takes the names a policy lists in ``safe-globals``, the exact names the user passes
to ``torch.serialization.add_safe_globals`` to load such files: the user vouches for them, so
they are reported, not failed. Nothing else makes a name pass.
"""

from __future__ import annotations

from collections.abc import Iterator

from tieaudit.core.records import PickleGlobal
from tieaudit.rules.finding import Audited, Finding, Rule
from tieaudit.rules.texts import TIE010, TIE011

MAX_NAMED = 8
"""Globals spelled out in one finding's message (all of them are in its ``names``)."""


def _by_file(audited: Audited, *, vouched: bool) -> dict[str, list[PickleGlobal]]:
    found: dict[str, list[PickleGlobal]] = {}
    safe = audited.policy.safe_globals
    for used in audited.graph.checkpoint.pickle_globals:
        if used.verdict == "runs-code" and (used.name in safe) == vouched:
            found.setdefault(used.file, []).append(used)
    return found


def _listed(named: list[PickleGlobal]) -> str:
    shown = "; ".join(f"{g.name} ({g.use})" for g in named[:MAX_NAMED])
    return shown + (f"; and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else "")


def _refused(named: list[PickleGlobal]) -> str:
    """Why tieaudit read no tensors from the file ("" when it read it)."""
    return next((g.refused for g in named if g.refused), "")


def _how_read(refused: str) -> str:
    if not refused:
        return "tieaudit read it with inert placeholders and called nothing."
    return (
        f"tieaudit read no tensors from it ({refused}) and found these globals by walking its "
        "pickles opcode by opcode, calling nothing."
    )


def _details(file: str, refused: str) -> dict[str, str]:
    return {"file": file, "refused": refused} if refused else {"file": file}


def runs_code_findings(audited: Audited) -> Iterator[Finding]:
    """TIE010: a file whose pickle names a global outside torch's default weights_only allowlist."""
    for file, named in _by_file(audited, vouched=False).items():
        refused = _refused(named)
        yield RUNS_CODE.finding(
            [g.name for g in named],
            f"{file} needs torch.load(weights_only=False), which would import and use globals outside "
            f"torch's weights_only allowlist: {_listed(named)}. torch.load(weights_only=True) refuses "
            f"the file; {_how_read(refused)}",
            fix="do not load this file with weights_only=False; rebuild it from a trusted source "
            "(or keep only its tensors, e.g. as safetensors)",
            details=_details(file, refused),
        )


def unknown_findings(audited: Audited) -> Iterator[Finding]:
    """TIE011: a file whose pickle names globals the policy's safe-globals vouches for."""
    for file, named in _by_file(audited, vouched=True).items():
        yield UNKNOWN_GLOBAL.finding(
            [g.name for g in named],
            f"{file} names globals outside torch's default weights_only allowlist that the policy's "
            f"safe-globals vouches for: {_listed(named)}. torch.load(weights_only=True) refuses it "
            "unless torch.serialization.add_safe_globals names them (and the types their calls return).",
            fix="load it inside torch.serialization.safe_globals([...]) naming exactly these globals",
            details=_details(file, _refused(named)),
        )


RUNS_CODE = Rule(text=TIE010, check=runs_code_findings)
UNKNOWN_GLOBAL = Rule(text=TIE011, check=unknown_findings)
