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


def human_duration(seconds: float | None) -> str:
    """Milliseconds under ten seconds, seconds above: 412 ms, 13.4 s."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def human_rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:.1f} tok/s"


def json_number(x: float | None, digits: int = 3) -> float | None:
    """A figure as our JSON outputs carry it: rounded; None for missing or NaN (JSON has no NaN)."""
    if x is None or x != x:
        return None
    return round(x, digits)


def json_ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds in JSON, to the microsecond."""
    return None if seconds is None else round(seconds * 1000.0, 3)
