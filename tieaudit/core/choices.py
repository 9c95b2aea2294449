"""The choice lists the command line offers and the report package renders, defined once here, where
the command line can name them without importing a renderer (start-up pays for what a run uses)."""

from __future__ import annotations

from typing import Literal

InspectFormat = Literal["text", "json", "dot"]
"""What ``inspect`` writes."""
INSPECT_FORMATS: tuple[InspectFormat, ...] = ("text", "json", "dot")
"""``inspect --format`` choices, the default first."""
CheckFormat = Literal["text", "json", "sarif", "markdown", "github"]
"""What ``check`` writes."""
CHECK_FORMATS: tuple[CheckFormat, ...] = ("text", "json", "sarif", "markdown", "github")
"""``check --format`` (and ``--report FORMAT=FILE``) choices, the default first."""
