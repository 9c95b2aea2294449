"""Human-readable sizes."""

from __future__ import annotations


def human_bytes(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
