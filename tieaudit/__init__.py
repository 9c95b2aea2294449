"""tieaudit: audit machine-learning checkpoints for weight tying."""

from __future__ import annotations

from typing import Any

from tieaudit.core.version import __version__

__all__ = ["__version__", "load_tied"]


def __getattr__(name: str) -> Any:
    """``tieaudit.load_tied`` without importing torch (or anything) at ``import tieaudit``."""
    if name == "load_tied":
        from tieaudit.load import load_tied

        return load_tied
    raise AttributeError(f"module 'tieaudit' has no attribute {name!r}")
