"""How sizes read for people: one formatter for the store, the stats, the pre-flight and doctor."""

from __future__ import annotations


def human_bytes(n: int | float | None) -> str:
    """Decimal units, as disks and model cards count them: 98.4 MB, 1.2 GB."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"
