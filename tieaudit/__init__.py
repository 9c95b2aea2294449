"""tieaudit: audit machine-learning checkpoints for weight tying.

The library's entry points (each documented in docs/api.md, with an example)::

    import tieaudit
    audit = tieaudit.audit_path("model.safetensors")        # one checkpoint -> Audit
    result = tieaudit.check_paths(["models/"])               # the gate -> CheckResult (.passed)
    tieaudit.retie("model.safetensors", "tied.safetensors")  # copies become ties, verified
    tieaudit.convert("model.pt", "model.safetensors")        # torch -> safetensors, verified
    state = tieaudit.load_tied("tied.safetensors")           # {name: torch.Tensor}, ties restored

``import tieaudit`` imports nothing else: each name is imported when first used (torch only by
``load_tied``), so a script pays for what it calls.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tieaudit.core.version import __version__

if TYPE_CHECKING:
    from tieaudit.audit import Audit, AuditSummary, audit_path
    from tieaudit.core.errors import (
        InputError,
        MissingExtra,
        OutputError,
        TieauditError,
        UnsafeInputError,
        UnsupportedFormatError,
        UsageError,
    )
    from tieaudit.core.exit_codes import ExitCode
    from tieaudit.gate.baseline import Baseline, load_baseline
    from tieaudit.gate.check import Checked, CheckResult, check_paths
    from tieaudit.load import load_tied
    from tieaudit.repair.convert import ConvertResult, convert
    from tieaudit.repair.retie import RetieResult, retie
    from tieaudit.rules.finding import Finding
    from tieaudit.rules.policy import Policy, load_policy

_WHERE = {
    "audit_path": "tieaudit.audit",
    "Audit": "tieaudit.audit",
    "AuditSummary": "tieaudit.audit",
    "check_paths": "tieaudit.gate.check",
    "CheckResult": "tieaudit.gate.check",
    "Checked": "tieaudit.gate.check",
    "retie": "tieaudit.repair.retie",
    "RetieResult": "tieaudit.repair.retie",
    "convert": "tieaudit.repair.convert",
    "ConvertResult": "tieaudit.repair.convert",
    "load_tied": "tieaudit.load",
    "Finding": "tieaudit.rules.finding",
    "Policy": "tieaudit.rules.policy",
    "load_policy": "tieaudit.rules.policy",
    "Baseline": "tieaudit.gate.baseline",
    "load_baseline": "tieaudit.gate.baseline",
    "ExitCode": "tieaudit.core.exit_codes",
    "TieauditError": "tieaudit.core.errors",
    "UsageError": "tieaudit.core.errors",
    "InputError": "tieaudit.core.errors",
    "UnsupportedFormatError": "tieaudit.core.errors",
    "UnsafeInputError": "tieaudit.core.errors",
    "OutputError": "tieaudit.core.errors",
    "MissingExtra": "tieaudit.core.errors",
}
"""Each exported name -> the module defining it (imported on first use)."""

__all__ = [
    "__version__",
    "audit_path",
    "Audit",
    "AuditSummary",
    "check_paths",
    "CheckResult",
    "Checked",
    "retie",
    "RetieResult",
    "convert",
    "ConvertResult",
    "load_tied",
    "Finding",
    "Policy",
    "load_policy",
    "Baseline",
    "load_baseline",
    "ExitCode",
    "TieauditError",
    "UsageError",
    "InputError",
    "UnsupportedFormatError",
    "UnsafeInputError",
    "OutputError",
    "MissingExtra",
]
"""The public API: these names, and the records' own attributes, keep their meaning across releases."""


def __getattr__(name: str) -> Any:
    """The exported names, imported when first used (PEP 562)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tieaudit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
