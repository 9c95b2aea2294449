"""tieaudit: audit machine-learning checkpoints for weight tying."""

from __future__ import annotations

__version__ = "0.1.0"
